//! The embedding engine: the store (`crate::embedding`) behind the `Engine` trait.
//!
//! Three roles, set by `parameters { key: "embedding_interface" }`:
//! - `hps` (default): HPS's interface. `KEYS` INT64 [-1] holds a request's keys table
//!   after table, `NUMKEYS` INT32 [-1] how many belong to each table, `OUTPUT0` FP32
//!   [-1] the rows in the same order (Σ numkeys_i × dim_i). `max_batch_size: 0`. FP16
//!   when declared so (tables of one dim).
//! - `batched`: one key per table per sample, `KEYS` INT64 [num_tables] →
//!   `OUTPUT0` FP32 [num_tables, dim], with a batch dimension the dynamic batcher merges.
//! - `update`: writes rows while serving: `KEYS`, `NUMKEYS` as for `hps` plus
//!   `VECTORS` FP32 [-1] (the new rows, same order) → `UPDATED` INT64 [1].
//!
//! Models naming the same `store_name` (default: the model's name) share one store in
//! the process, which is how an update model reaches the tables a lookup model serves.
//! Store settings use HPS's names: `embedding_table_names`,
//! `embedding_vecsize_per_table`, `sparse_files`, `default_value_for_each_table`,
//! `gpucacheper`, `hit_rate_threshold`, `vocabulary_size_per_table`, `volatile_db`; and
//! ours, `gpucache_allocation` (`per_table`, HPS's meaning, or `store`: the share is of all
//! the store's rows, small tables cached whole).

use std::sync::Arc;

use triton_rust_core::batch::{BatchTensor, RequestTensor};
use triton_rust_core::config::ModelConfig;
use triton_rust_core::engine::{
    Device, Engine, EngineClaim, LoadedModel, ModelLoad, OutputView, Shared, Signature,
};
use triton_rust_core::error::{Error, Result};
use triton_rust_core::telemetry::MetricsSource;
use triton_rust_core::tensor::{Bytes, DataType};
use triton_rust_embedding::cache::{CacheTier, HostCache};
#[cfg(feature = "gpu")]
use triton_rust_embedding::gpu::{
    BatchKeys, BatchLookup, GpuInstance, KeyLayout, KeyUpload, RowFormat,
};
#[cfg(feature = "gpu")]
use triton_rust_embedding::CacheRows;
use triton_rust_embedding::InstanceCaches;

mod key_files;
mod miss_reads;
mod model;
mod pool;
mod pooled;
mod rows;
mod settings;
mod stores;

use model::{signature, Model};
use stores::shared_store;
pub use stores::Stores;

use pooled::PooledRun;
use rows::{as_f32, as_i32, as_i64, DeviceRows, RowSink};

use settings::same_secret;
pub use settings::{
    CacheSharing, Combiner, Credential, Interface, MissReads, Pooling, StoreSettings, PAD,
    TOKEN_PARAMETER,
};

/// Embedding stores (HPS's models): a version directory of tables, no model file.
pub static CLAIM: EngineClaim = EngineClaim {
    names: &["embedding", "hps"],
    default_file: None,
    file_suffixes: &[],
    parameters: StoreSettings::KNOWN,
    backend_keys: settings::EmbeddingBackend::KNOWN,
    environment: &[],
    builds_on: &[],
    keeps_sequences: false,
};

triton_rust_core::engine_kind!(
    /// The embedding engine kind.
    EmbeddingKind, CLAIM, EmbeddingModel
);

/// An embedding model, loaded: its settings and its store (shared by name with the
/// backend's other models); each instance attaches caches on its device.
pub struct EmbeddingModel(Arc<Model>);

impl EmbeddingModel {
    /// The tensors its settings and tables make: the model opened on the config as written,
    /// kept for the load (its settings, and its store alive in the backend's registry).
    pub fn describe(load: &ModelLoad<'_>) -> Result<Option<Signature>> {
        let settings = StoreSettings::from_config(load.config, load.model_file, load.backend)?;
        let described = EmbeddingModel::open(settings, load.config, load.shared)?;
        let sig = described.signature().clone();
        load.opened.keep(described);
        Ok(Some(sig))
    }

    /// The model on its final config: the description's settings and store where it ran.
    pub fn load(load: &ModelLoad<'_>) -> Result<EmbeddingModel> {
        let settings = match load.opened.take::<EmbeddingModel>() {
            // the store stays registered while `described` lives: opened again, it is found
            Some(described) => {
                let settings = described.0.settings.clone();
                return EmbeddingModel::open(settings, load.config, load.shared);
            }
            None => StoreSettings::from_config(load.config, load.model_file, load.backend)?,
        };
        EmbeddingModel::open(settings, load.config, load.shared)
    }

    /// The model `settings` describe, its tensors named by `cfg` (the recommender opens its
    /// lookup this way, with the batched interface).
    pub fn open(
        settings: StoreSettings,
        cfg: &ModelConfig,
        shared: &Shared,
    ) -> Result<EmbeddingModel> {
        let store = shared_store(&shared.get::<Stores>(), &settings)?;
        if settings.interface == Interface::Update {
            // acknowledged means durable
            if let Err(table) = store.durable() {
                return Err(Error::invalid_arg(format!(
                    "table '{table}' has no update log, so updates to it could not be made durable: give it table files \
                     (its log is then kept beside them), set parameters update_log_dir, or a volatile_db to write through to"
                )));
            }
        }
        // The lookup interfaces write their rows as their output is declared: TYPE_FP32 (the
        // caches' own), or TYPE_FP16 for an fp16 network (half the bytes, no cast in it; an
        // fp16 table's rows go up as stored)
        let rows_type = match (settings.interface, cfg.outputs.first().map(|t| t.dtype)) {
            (Interface::Update, _) | (_, None | Some(DataType::F32)) => DataType::F32,
            (_, Some(DataType::F16)) => DataType::F16,
            (_, Some(d)) => {
                return Err(Error::invalid_arg(format!(
                    "output '{}' holds the rows: TYPE_FP32 or TYPE_FP16, not {d:?}",
                    cfg.outputs[0].name
                )))
            }
        };
        if rows_type == DataType::F16 && settings.interface == Interface::Hps && !store.one_dim() {
            return Err(Error::invalid_arg(format!(
                "output '{}' is TYPE_FP16: the hps interface writes fp16 rows for tables of one dim only (these are {:?}); declare it TYPE_FP32",
                cfg.outputs[0].name,
                store.dims()
            )));
        }
        let sig = signature(&settings, &store, cfg, rows_type)?;
        Ok(EmbeddingModel(Arc::new(Model { settings, store, rows_type, sig })))
    }

    /// The engine of an instance on `device`: the store's caches attached there.
    pub fn engine(&self, device: Device) -> Result<EmbeddingEngine> {
        let m = &self.0;
        if let Device::Gpu(_) = device {
            #[cfg(feature = "gpu")]
            let visible = triton_rust_cuda::gpu_count().unwrap_or(0);
            #[cfg(not(feature = "gpu"))]
            let visible = 0;
            settings::check_device(m.settings.devices.as_deref(), device, visible)?;
        }
        let store = &m.store;
        #[cfg(feature = "gpu")]
        let mut gpu = None;
        let hotness = m.settings.pooling.as_ref().map_or(&[][..], |p| &p.hotness[..]);
        #[cfg_attr(not(feature = "gpu"), allow(unused_mut))]
        let mut pooled = PooledRun::new(hotness);
        let caches = match device {
            Device::Cpu => store
                .attach_caches(&|geo| Ok(Arc::new(HostCache::new(geo)) as Arc<dyn CacheTier>))?,
            #[cfg(feature = "gpu")]
            Device::Gpu(id) => {
                let shared = m.settings.cache_sharing == CacheSharing::Device;
                let (instance, caches) = store.attach_gpu_caches(id, shared)?;
                if store.one_dim() && m.settings.interface != Interface::Update {
                    let pooled_interface = m.settings.interface == Interface::Pooled;
                    // a pooled lookup's rows stay as the caches keep them until the bags are
                    // reduced in fp32: fp16 caches' rows are exact in fp16 (a miss's row read
                    // below is rounded as the cache rounds it when it goes in), fp32 ones' not
                    let format = match (pooled_interface, store.cache_rows(), m.rows_type) {
                        (true, CacheRows::F16, _) | (false, _, DataType::F16) => RowFormat::F16,
                        _ => RowFormat::F32,
                    };
                    let mut lookup = caches.batch_lookup(&instance, format)?;
                    if pooled_interface {
                        pooled.pooler = Some(instance.pooler()?);
                        pooled.keys_reader = Some(triton_rust_cuda::HostReader::new(id)?);
                        pooled.resident =
                            caches.resident_pool(&instance, pooled::pooled_format(m))?;
                    }
                    let (piece_keys, threads) = m.settings.key_upload;
                    lookup.set_key_upload(KeyUpload { piece_keys, threads });
                    if m.settings.miss_reads != MissReads::Cpu {
                        caches.let_gpu_read_misses(id, &mut lookup)?;
                        lookup.share_misses(m.settings.miss_reads == MissReads::Both);
                    }
                    gpu = Some((instance, lookup));
                }
                caches
            }
            #[cfg(not(feature = "gpu"))]
            Device::Gpu(_) => {
                return Err(Error::unsupported(
                    "this build of the embedding engine has no GPU cache (feature `gpu`)",
                ))
            }
        };
        Ok(EmbeddingEngine {
            model: m.clone(),
            device,
            caches,
            device_rows: None,
            #[cfg(feature = "gpu")]
            gpu,
            pooled,
        })
    }
}

/// One instance: the store's caches on its device, and its lookup's buffers.
pub struct EmbeddingEngine {
    model: Arc<Model>,
    device: Device,
    caches: Arc<InstanceCaches>,
    /// The GPU instance's output buffer for tables of different dims (grown as batches grow).
    device_rows: Option<DeviceRows>,
    /// A GPU instance's whole-batch lookup (tables of one dim: every table in one pass).
    #[cfg(feature = "gpu")]
    gpu: Option<(GpuInstance, BatchLookup)>,
    /// A pooled instance's lookups (see `pooled.rs`).
    pooled: PooledRun,
}

impl Engine for EmbeddingEngine {
    fn run(
        &mut self,
        inputs: &[BatchTensor<'_>],
        outputs: &[&str],
        sink: &mut dyn FnMut(OutputView<'_>) -> Result<()>,
    ) -> Result<()> {
        let host = |i: usize| -> Result<&[u8]> {
            inputs[i].host_bytes().ok_or_else(|| {
                Error::unsupported(format!(
                    "input '{}' in GPU memory is not supported by the embedding engine yet",
                    inputs[i].name
                ))
            })
        };
        let store = self.model.store.clone();
        let out_name = self.model.sig.outputs[0].name.clone();
        let wanted = outputs.iter().any(|o| *o == out_name);
        match self.model.settings.interface {
            Interface::Hps => {
                let keys = as_i64(host(0)?);
                let numkeys = as_i32(host(1)?);
                let parts = self.model.split(&keys, &numkeys)?;
                let total: usize =
                    parts.iter().enumerate().map(|(t, p)| p.len() * store.dim(t)).sum();
                #[cfg(feature = "gpu")]
                {
                    let counts: Vec<usize> = parts.iter().map(|p| p.len()).collect();
                    let shape = [total as i64];
                    let out = wanted.then_some((out_name.as_str(), &shape[..]));
                    if self.run_batch_on_gpu(
                        BatchKeys::Host(&keys),
                        KeyLayout::Blocked(&counts),
                        out,
                        sink,
                    )? {
                        return Ok(());
                    }
                }
                // table after table, each table's rows contiguous
                let mut rows = RowSink::new(&mut self.device_rows, self.device, total)?;
                let mut at = 0;
                for (t, part) in parts.iter().enumerate() {
                    rows.put(&self.caches, t, part, at, store.dim(t))?;
                    at += part.len() * store.dim(t);
                }
                if wanted {
                    let data = rows.bytes(total)?;
                    sink_rows(sink, &out_name, self.model.rows_type, &[total as i64], data)?;
                }
            }
            Interface::Batched => {
                let tables = store.table_count();
                let dim = store.dim(0);
                // keys already in GPU memory (CUDA shared memory, an ensemble step's output)
                // go to the GPU lookup as they are: no trip through the host
                #[cfg(feature = "gpu")]
                if let Some(Bytes::Device(view)) = inputs[0].bytes() {
                    let batch = view.len() / 8 / tables.max(1);
                    let shape = [batch as i64, tables as i64, dim as i64];
                    let out = wanted.then_some((out_name.as_str(), &shape[..]));
                    if self.run_batch_on_gpu(
                        BatchKeys::Device(view),
                        KeyLayout::Interleaved,
                        out,
                        sink,
                    )? {
                        return Ok(());
                    }
                }
                let keys = as_i64(host(0)?);
                let batch = keys.len() / tables;
                let total = batch * tables * dim;
                #[cfg(feature = "gpu")]
                {
                    let shape = [batch as i64, tables as i64, dim as i64];
                    let out = wanted.then_some((out_name.as_str(), &shape[..]));
                    if self.run_batch_on_gpu(
                        BatchKeys::Host(&keys),
                        KeyLayout::Interleaved,
                        out,
                        sink,
                    )? {
                        return Ok(());
                    }
                }
                // [batch, tables, dim]: table t's row of sample b at (b * tables + t) * dim
                let mut rows = RowSink::new(&mut self.device_rows, self.device, total)?;
                for t in 0..tables {
                    let col: Vec<i64> = keys.iter().skip(t).step_by(tables).copied().collect();
                    rows.put(&self.caches, t, &col, t * dim, tables * dim)?;
                }
                if wanted {
                    let shape = [batch as i64, tables as i64, dim as i64];
                    let data = rows.bytes(total)?;
                    sink_rows(sink, &out_name, self.model.rows_type, &shape, data)?;
                }
            }
            Interface::Pooled => {
                let m = self.model.clone();
                self.pooled.run(
                    &m,
                    &self.caches,
                    #[cfg(feature = "gpu")]
                    self.gpu.as_mut(),
                    inputs,
                    wanted,
                    sink,
                )?;
            }
            Interface::Update => {
                let keys = as_i64(host(0)?);
                let numkeys = as_i32(host(1)?);
                let vectors = as_f32(host(2)?);
                let parts = self.model.split(&keys, &numkeys)?;
                let mut at = 0;
                for (t, part) in parts.iter().enumerate() {
                    let n = part.len() * store.dim(t);
                    if !part.is_empty() {
                        store.update(t, part, &vectors[at..at + n])?;
                    }
                    at += n;
                }
                if wanted {
                    let count = [keys.len() as i64];
                    sink(OutputView {
                        name: &out_name,
                        dtype: DataType::I64,
                        shape: &[1],
                        data: Bytes::Host(bytemuck::cast_slice(&count)),
                    })?;
                }
            }
        }
        Ok(())
    }
}

impl LoadedModel for EmbeddingModel {
    fn signature(&self) -> &Signature {
        &self.0.sig
    }

    /// A GPU instance's whole-batch lookup takes the batched interface's keys where they
    /// are, and the fixed-hotness pooled interface's (resident tables read them there; the
    /// other paths copy them to the host). A ragged pooled model's lengths and a model with
    /// vocabulary sizes are checked per request on the host, so theirs come there.
    fn accepts_device_inputs(&self, device: Device) -> bool {
        let m = &self.0;
        let pooled_fixed = m.settings.interface == Interface::Pooled
            && !m.lengths_input()
            && !m.checks_vocabulary();
        cfg!(feature = "gpu")
            && device != Device::Cpu
            && (m.settings.interface == Interface::Batched || pooled_fixed)
    }

    fn metrics_source(&self) -> Option<Arc<dyn MetricsSource>> {
        Some(self.0.store.clone())
    }

    fn authorize(&self, parameters: &[(String, String)]) -> Result<()> {
        let m = &self.0;
        let Credential::Secret { secret, .. } = &m.settings.credential else { return Ok(()) };
        let given = parameters.iter().find_map(|(k, v)| {
            if k.eq_ignore_ascii_case(TOKEN_PARAMETER) {
                Some(v.trim())
            } else if k.eq_ignore_ascii_case("authorization") {
                v.trim().strip_prefix("Bearer ").map(str::trim)
            } else {
                None
            }
        });
        match given {
            Some(token) if same_secret(token.as_bytes(), secret) => Ok(()),
            _ => {
                m.store.refused_updates.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Err(Error::invalid_arg(format!(
                    "update refused: missing or wrong credential (send it as the request parameter '{TOKEN_PARAMETER}', \
                     or as that header or 'authorization: Bearer …' with the server's header forwarding on)"
                )))
            }
        }
    }

    fn check_request(&self, inputs: &[RequestTensor<'_>]) -> Result<()> {
        self.0.check_request(inputs)
    }

    fn request_rows(&self, inputs: &[RequestTensor<'_>]) -> Option<usize> {
        self.0.request_rows(inputs)
    }

    fn instance(&self, device: Device) -> Result<Box<dyn Engine>> {
        Ok(Box::new(self.engine(device)?))
    }
}

/// fp32 rows the store wrote (`data`) handed to `sink` as the output is declared: as they are,
/// or rounded to fp16 on the host (a CPU instance's rows: a GPU instance's lookup writes fp16
/// itself).
fn sink_rows(
    sink: &mut dyn FnMut(OutputView<'_>) -> Result<()>,
    name: &str,
    rows_type: DataType,
    shape: &[i64],
    data: Bytes<'_>,
) -> Result<()> {
    if rows_type != DataType::F16 {
        return sink(OutputView { name, dtype: DataType::F32, shape, data });
    }
    let f32s =
        data.host().ok_or_else(|| Error::internal("fp16 rows: the rows are not on the host"))?;
    let halves: Vec<half::f16> =
        bytemuck::cast_slice::<u8, f32>(f32s).iter().map(|&v| half::f16::from_f32(v)).collect();
    sink(OutputView {
        name,
        dtype: DataType::F16,
        shape,
        data: Bytes::Host(bytemuck::cast_slice(&halves)),
    })
}

impl EmbeddingEngine {
    /// Looks a batch up on the GPU in one pass when this instance has the whole-batch
    /// lookup, and hands the rows to `sink`. `Ok(false)` when it has not.
    #[cfg(feature = "gpu")]
    fn run_batch_on_gpu(
        &mut self,
        keys: BatchKeys<'_>,
        layout: KeyLayout<'_>,
        out: Option<(&str, &[i64])>,
        sink: &mut dyn FnMut(OutputView<'_>) -> Result<()>,
    ) -> Result<bool> {
        let dtype = self.model.rows_type; // the lookup's row format was made from it
        let Some((instance, lookup)) = self.gpu.as_mut() else { return Ok(false) };
        self.caches.lookup_batch_device(keys, layout, instance, lookup, None)?;
        if let Some((name, shape)) = out {
            let elements = keys.len() * lookup.dim();
            let rows = lookup
                .rows(elements)
                .ok_or_else(|| Error::internal("batch lookup: rows buffer too small"))?;
            sink(OutputView { name, dtype, shape, data: Bytes::Device(rows) })?;
        }
        Ok(true)
    }

    #[cfg(feature = "gpu")]
    /// Runs the lookup once on `inputs` (the batched interface's keys), writing its rows
    /// into `out` (GPU memory with room for all of them) instead of a buffer of its own;
    /// `Ok(false)`, having done nothing, when it cannot (a CPU instance; the caller then
    /// uses `run`). With it a recommender looks up one part of a batch while its network
    /// runs on the part before.
    pub fn run_into(
        &mut self,
        inputs: &[BatchTensor<'_>],
        out: &mut triton_rust_cuda::DeviceViewMut<'_>,
    ) -> Result<bool> {
        if self.model.settings.interface == Interface::Pooled {
            let m = self.model.clone();
            return Ok(self.pooled.run_resident(&m, &self.caches, inputs, Some(out))?.is_some());
        }
        let Some((instance, lookup)) =
            self.gpu.as_mut().filter(|_| self.model.settings.interface == Interface::Batched)
        else {
            return Ok(false);
        };
        let tables = self.caches.store().table_count();
        // keys already in GPU memory (CUDA shared memory) go to the GPU lookup as they are
        if let Some(Bytes::Device(view)) = inputs.first().and_then(|t| t.bytes()) {
            if tables == 0 || view.len() % (8 * tables) != 0 {
                return Err(Error::invalid_arg(format!(
                    "input '{}': {} bytes are not whole rows of {tables} int64 keys",
                    self.model.sig.inputs[0].name,
                    view.len()
                )));
            }
            self.caches.lookup_batch_device(
                BatchKeys::Device(view),
                KeyLayout::Interleaved,
                instance,
                lookup,
                Some(out),
            )?;
            return Ok(true);
        }
        let bytes = inputs.first().and_then(|t| t.host_bytes()).ok_or_else(|| {
            Error::unsupported("the embedding engine takes its keys in host memory")
        })?;
        let keys = as_i64(bytes);
        if tables == 0 || !keys.len().is_multiple_of(tables) {
            return Err(Error::invalid_arg(format!(
                "input '{}': {} keys are not whole rows of {tables} tables",
                self.model.sig.inputs[0].name,
                keys.len()
            )));
        }
        self.caches.lookup_batch_device(
            BatchKeys::Host(&keys),
            KeyLayout::Interleaved,
            instance,
            lookup,
            Some(out),
        )?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests;
