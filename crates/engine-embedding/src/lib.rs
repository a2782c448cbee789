//! The embedding engine: the store (`crate::embedding`) behind the `Engine` trait.
//!
//! Three roles, set by `parameters { key: "embedding_interface" }`:
//! - `hps` (default): HPS's interface. `KEYS` INT64 [-1] holds a request's keys table
//!   after table, `NUMKEYS` INT32 [-1] how many belong to each table, `OUTPUT0` FP32
//!   [-1] the rows in the same order (Σ numkeys_i × dim_i). `max_batch_size: 0`.
//! - `batched`: one key per table per sample, `KEYS` INT64 [num_tables] →
//!   `OUTPUT0` FP32 [num_tables, dim], with a batch dimension the dynamic batcher merges.
//! - `update`: writes rows while serving: `KEYS`, `NUMKEYS` as for `hps` plus
//!   `VECTORS` FP32 [-1] (the new rows, same order) → `UPDATED` INT64 [1].
//!
//! Models naming the same `store_name` (default: the model's name) share one store in
//! the process, which is how an update model reaches the tables a lookup model serves.
//! Store settings use HPS's names: `embedding_table_names`,
//! `embedding_vecsize_per_table`, `sparse_files`, `default_value_for_each_table`,
//! `gpucacheper`, `hit_rate_threshold`, `vocabulary_size_per_table`, `volatile_db`.

#![forbid(unsafe_code)]

use std::path::Path;
use std::sync::{Arc, Mutex, Weak};

use triton_rust_core::batch::{BatchTensor, RequestTensor};
use triton_rust_core::config::{ModelConfig, TensorConfig, TensorSpec};
use triton_rust_core::engine::{Device, Engine, EngineOptions, OutputView, Signature};
use triton_rust_core::error::{Error, Result};
use triton_rust_core::telemetry::MetricsSource;
use triton_rust_core::tensor::{Bytes, DataType};
use triton_rust_embedding::cache::{CacheTier, HostCache};
#[cfg(feature = "gpu")]
use triton_rust_embedding::gpu::DeviceRows;
use triton_rust_embedding::{EmbeddingStore, InstanceCaches, StoreConfig, TableConfig};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interface {
    Hps,
    Batched,
    Update,
}

/// The store settings read from a model config.
#[derive(Debug, Clone)]
pub struct StoreSettings {
    pub name: String,
    pub interface: Interface,
    pub store: StoreConfig,
    /// Keys must lie in [0, size) when given (per table).
    pub vocabulary: Vec<Option<u64>>,
    pub volatile_db: Option<String>,
}

fn list(cfg: &ModelConfig, key: &str) -> Vec<String> {
    cfg.parameters
        .get(key)
        .map(|s| s.split(',').map(|x| x.trim().to_string()).filter(|x| !x.is_empty()).collect())
        .unwrap_or_default()
}

fn parse_list<T: std::str::FromStr + Clone>(cfg: &ModelConfig, key: &str, n: usize, default: Option<T>) -> Result<Vec<T>> {
    let items = list(cfg, key);
    if items.is_empty() {
        return default.map(|d| vec![d; n]).ok_or_else(|| Error::invalid_arg(format!("parameter '{key}' is required")));
    }
    if items.len() == 1 && n > 1 {
        let v = items[0].parse().map_err(|_| Error::invalid_arg(format!("parameter '{key}': cannot parse '{}'", items[0])))?;
        return Ok(vec![v; n]);
    }
    if items.len() != n {
        return Err(Error::invalid_arg(format!("parameter '{key}' lists {} values for {n} tables", items.len())));
    }
    items
        .iter()
        .map(|s| s.parse().map_err(|_| Error::invalid_arg(format!("parameter '{key}': cannot parse '{s}'"))))
        .collect()
}

impl StoreSettings {
    pub fn from_config(cfg: &ModelConfig, version_dir: &Path) -> Result<StoreSettings> {
        let interface = match cfg.parameters.get("embedding_interface").map(|s| s.trim()) {
            None | Some("hps") => Interface::Hps,
            Some("batched") => Interface::Batched,
            Some("update") => Interface::Update,
            Some(other) => {
                return Err(Error::invalid_arg(format!("parameter 'embedding_interface' is '{other}'; use hps, batched or update")))
            }
        };
        let names = list(cfg, "embedding_table_names");
        if names.is_empty() {
            return Err(Error::invalid_arg("parameter 'embedding_table_names' is required (comma-separated table names)"));
        }
        let n = names.len();
        let dims: Vec<usize> = parse_list(cfg, "embedding_vecsize_per_table", n, None)?;
        let defaults: Vec<f32> = parse_list(cfg, "default_value_for_each_table", n, Some(0.0))?;
        let files = list(cfg, "sparse_files");
        if !files.is_empty() && files.len() != n {
            return Err(Error::invalid_arg(format!("parameter 'sparse_files' lists {} paths for {n} tables", files.len())));
        }
        let vocab_items = list(cfg, "vocabulary_size_per_table");
        let vocabulary = if vocab_items.is_empty() {
            vec![None; n]
        } else {
            parse_list::<u64>(cfg, "vocabulary_size_per_table", n, None)?.into_iter().map(Some).collect()
        };
        let number = |key: &str, default: f64| -> Result<f64> {
            match cfg.parameters.get(key) {
                None => Ok(default),
                Some(s) => s.trim().parse().map_err(|_| Error::invalid_arg(format!("parameter '{key}' must be a number, got '{s}'"))),
            }
        };
        let tables = names
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let rel = files.get(i).cloned().unwrap_or_else(|| format!("tables/{name}"));
                let path = version_dir.join(&rel);
                TableConfig {
                    name: name.clone(),
                    dim: dims[i],
                    path: if rel == "none" { None } else { Some(path) },
                    format: None,
                    default_value: defaults[i],
                }
            })
            .collect();
        let store = StoreConfig {
            tables,
            cache_ratio: number("gpucacheper", 0.1)?,
            hit_rate_threshold: number("hit_rate_threshold", 0.9)?,
        };
        let name = cfg.parameters.get("store_name").cloned().unwrap_or_else(|| cfg.name.clone());
        Ok(StoreSettings { name, interface, store, vocabulary, volatile_db: cfg.parameters.get("volatile_db").cloned() })
    }
}

/// Stores shared by name across the models of one server process.
static STORES: Mutex<Vec<(String, Weak<EmbeddingStore>)>> = Mutex::new(Vec::new());

fn shared_store(settings: &StoreSettings) -> Result<Arc<EmbeddingStore>> {
    let mut stores = STORES.lock().map_err(|_| Error::internal("store registry poisoned"))?;
    stores.retain(|(_, w)| w.strong_count() > 0);
    if let Some(store) = stores.iter().find(|(n, _)| *n == settings.name).and_then(|(_, w)| w.upgrade()) {
        let same = store.table_count() == settings.store.tables.len()
            && store.tables().zip(&settings.store.tables).all(|(a, b)| a.name == b.name && a.dim == b.dim);
        if !same {
            return Err(Error::invalid_arg(format!(
                "store '{}' is already loaded with other tables; models sharing a store_name must list the same tables and dims",
                settings.name
            )));
        }
        return Ok(store);
    }
    let remote = match &settings.volatile_db {
        None => None,
        Some(spec) => Some(triton_rust_embedding::redis::RedisTier::from_spec(spec)?),
    };
    let store = EmbeddingStore::open(settings.store.clone(), remote)?;
    for (i, t) in store.tables().enumerate() {
        log::info!(
            "store '{}': table '{}' dim {} with {} rows on the host ({:.2}× the raw bytes), cache {} rows",
            settings.name,
            t.name,
            t.dim,
            store.host_rows(i),
            store.host_memory(i).ratio(),
            store.cache_geometry(i).capacity()
        );
    }
    stores.push((settings.name.clone(), Arc::downgrade(&store)));
    Ok(store)
}

pub struct EmbeddingEngine {
    settings: StoreSettings,
    caches: Arc<InstanceCaches>,
    /// The GPU instance's output buffer (grown as batches grow).
    device_rows: Option<DeviceRows>,
    sig: Signature,
}

impl EmbeddingEngine {
    pub fn load(version_dir: &Path, options: &EngineOptions<'_>) -> Result<EmbeddingEngine> {
        let settings = StoreSettings::from_config(options.config, version_dir)?;
        let store = shared_store(&settings)?;
        let caches = match options.device {
            _ if options.probe => store.attach_caches_none(),
            Device::Cpu => store.attach_caches(&|geo| Ok(Arc::new(HostCache::new(geo)) as Arc<dyn CacheTier>))?,
            #[cfg(feature = "gpu")]
            Device::Gpu(id) => store.attach_caches(&|geo| triton_rust_embedding::gpu::new_cache(id, geo))?,
            #[cfg(not(feature = "gpu"))]
            Device::Gpu(_) => return Err(Error::unsupported("this build of the embedding engine has no GPU cache (feature `gpu`)")),
        };
        let cfg = options.config;
        let name_or = |list: &[TensorConfig], i: usize, default: &str| {
            list.get(i).map(|t| t.name.clone()).unwrap_or_else(|| default.to_string())
        };
        let t = |name: String, dtype, shape: Vec<i64>| TensorSpec { name, dtype, shape };
        let tables = store.table_count() as i64;
        let (inputs, outputs) = match settings.interface {
            Interface::Hps => {
                if cfg.max_batch_size != 0 {
                    return Err(Error::invalid_arg("the hps interface takes a whole request's keys: set max_batch_size: 0 (or use embedding_interface batched)"));
                }
                (
                    vec![t(name_or(&cfg.inputs, 0, "KEYS"), DataType::I64, vec![-1]), t(name_or(&cfg.inputs, 1, "NUMKEYS"), DataType::I32, vec![-1])],
                    vec![t(name_or(&cfg.outputs, 0, "OUTPUT0"), DataType::F32, vec![-1])],
                )
            }
            Interface::Batched => {
                let dim = store.dim(0);
                if (0..store.table_count()).any(|i| store.dim(i) != dim) {
                    return Err(Error::invalid_arg("the batched interface needs every table to have the same dim (use the hps interface otherwise)"));
                }
                (
                    vec![t(name_or(&cfg.inputs, 0, "KEYS"), DataType::I64, vec![-1, tables])],
                    vec![t(name_or(&cfg.outputs, 0, "OUTPUT0"), DataType::F32, vec![-1, tables, dim as i64])],
                )
            }
            Interface::Update => {
                if cfg.max_batch_size != 0 {
                    return Err(Error::invalid_arg("the update interface takes a whole request: set max_batch_size: 0"));
                }
                (
                    vec![
                        t(name_or(&cfg.inputs, 0, "KEYS"), DataType::I64, vec![-1]),
                        t(name_or(&cfg.inputs, 1, "NUMKEYS"), DataType::I32, vec![-1]),
                        t(name_or(&cfg.inputs, 2, "VECTORS"), DataType::F32, vec![-1]),
                    ],
                    vec![t(name_or(&cfg.outputs, 0, "UPDATED"), DataType::I64, vec![1])],
                )
            }
        };
        Ok(EmbeddingEngine { settings, caches, device_rows: None, sig: Signature { inputs, outputs, device: options.device } })
    }

    fn store(&self) -> &Arc<EmbeddingStore> {
        self.caches.store()
    }

    /// Splits a request's KEYS by NUMKEYS, checking what only we can see.
    fn split<'k>(&self, keys: &'k [i64], numkeys: &[i32]) -> Result<Vec<&'k [i64]>> {
        let store = self.store();
        let (kname, nname) = (&self.sig.inputs[0].name, &self.sig.inputs[1].name);
        if numkeys.len() != store.table_count() {
            return Err(Error::invalid_arg(format!(
                "input '{nname}' has {} entries but the store has {} tables",
                numkeys.len(),
                store.table_count()
            )));
        }
        if let Some((t, n)) = numkeys.iter().enumerate().find(|(_, &n)| n < 0) {
            return Err(Error::invalid_arg(format!("input '{nname}' has a negative count {n} for table {t}")));
        }
        let total: i64 = numkeys.iter().map(|&n| n as i64).sum();
        if total != keys.len() as i64 {
            return Err(Error::invalid_arg(format!(
                "input '{nname}' sums to {total} but input '{kname}' holds {} keys",
                keys.len()
            )));
        }
        let mut out = Vec::with_capacity(numkeys.len());
        let mut at = 0usize;
        for (t, &n) in numkeys.iter().enumerate() {
            let part = &keys[at..at + n as usize];
            self.check_vocabulary(t, part)?;
            out.push(part);
            at += n as usize;
        }
        Ok(out)
    }

    fn check_vocabulary(&self, table: usize, keys: &[i64]) -> Result<()> {
        if let Some(Some(size)) = self.settings.vocabulary.get(table) {
            if let Some(k) = keys.iter().find(|&&k| k < 0 || k as u64 >= *size) {
                let name = self.store().tables().nth(table).map(|t| t.name.clone()).unwrap_or_default();
                return Err(Error::invalid_arg(format!(
                    "input '{}': key {k} is out of range for table '{name}' (vocabulary size {size})",
                    self.sig.inputs[0].name
                )));
            }
        }
        Ok(())
    }
}

/// Where a lookup's rows land, one sink for every interface: a host buffer, or on a
/// GPU instance the device buffer the response is copied from (grown as batches grow).
enum RowSink<'r> {
    Host(Vec<f32>),
    #[cfg(feature = "gpu")]
    Device(&'r mut DeviceRows),
    #[cfg(not(feature = "gpu"))]
    #[allow(dead_code)]
    Never(std::marker::PhantomData<&'r ()>),
}

impl<'r> RowSink<'r> {
    /// A sink of `total` floats for an instance on `device`.
    #[cfg_attr(not(feature = "gpu"), allow(unused_variables))]
    fn new(slot: &'r mut Option<DeviceRows>, device: Device, total: usize) -> Result<RowSink<'r>> {
        match device {
            Device::Cpu => Ok(RowSink::Host(vec![0f32; total])),
            #[cfg(feature = "gpu")]
            Device::Gpu(id) => {
                if slot.as_ref().is_none_or(|r| r.len() < total) {
                    *slot = None; // free the old buffer before allocating the new one
                    *slot = Some(DeviceRows::new(id, total.max(1))?);
                }
                Ok(RowSink::Device(slot.as_mut().expect("allocated above")))
            }
            #[cfg(not(feature = "gpu"))]
            Device::Gpu(_) => Err(Error::unsupported("this build of the embedding engine has no GPU cache (feature `gpu`)")),
        }
    }

    /// Looks one table's `keys` up: row i lands at `offset + i * stride` floats.
    fn put(&mut self, caches: &InstanceCaches, table: usize, keys: &[i64], offset: usize, stride: usize) -> Result<()> {
        if keys.is_empty() {
            return Ok(());
        }
        let dim = caches.store().dim(table);
        match self {
            RowSink::Host(out) if stride == dim => caches.lookup(table, keys, &mut out[offset..offset + keys.len() * dim]),
            RowSink::Host(out) => {
                let mut rows = vec![0f32; keys.len() * dim];
                caches.lookup(table, keys, &mut rows)?;
                for (i, row) in rows.chunks_exact(dim).enumerate() {
                    out[offset + i * stride..offset + i * stride + dim].copy_from_slice(row);
                }
                Ok(())
            }
            #[cfg(feature = "gpu")]
            RowSink::Device(rows) => caches.lookup_device(table, keys, rows, offset, stride),
            #[cfg(not(feature = "gpu"))]
            RowSink::Never(_) => unreachable!(),
        }
    }

    /// The first `floats` floats, wherever they are.
    fn bytes(&self, floats: usize) -> Result<Bytes<'_>> {
        match self {
            RowSink::Host(out) => Ok(Bytes::Host(bytemuck::cast_slice(&out[..floats]))),
            #[cfg(feature = "gpu")]
            RowSink::Device(rows) => rows.view(floats).map(Bytes::Device).ok_or_else(|| Error::internal("device rows buffer is too small")),
            #[cfg(not(feature = "gpu"))]
            RowSink::Never(_) => unreachable!(),
        }
    }
}

#[cfg(not(feature = "gpu"))]
type DeviceRows = std::convert::Infallible;

/// Decodes a request tensor's host bytes into values, straight from the server's buffer
/// when it is one piece (device pieces never reach this engine: it takes no GPU inputs).
fn from_chunks<T, const N: usize>(t: &RequestTensor<'_>, decode: fn([u8; N]) -> T) -> Vec<T> {
    let joined: Vec<u8>;
    let bytes: &[u8] = match t.chunks.as_slice() {
        [Bytes::Host(b)] => b,
        chunks => {
            joined = chunks.iter().flat_map(|c| c.host().unwrap_or_default().iter().copied()).collect();
            &joined
        }
    };
    bytes.chunks_exact(N).map(|c| decode(c.try_into().expect("N bytes"))).collect()
}

fn as_i64(bytes: &[u8]) -> Vec<i64> {
    bytes.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes"))).collect()
}
fn as_i32(bytes: &[u8]) -> Vec<i32> {
    bytes.chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().expect("4 bytes"))).collect()
}
fn as_f32(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes"))).collect()
}

impl Engine for EmbeddingEngine {
    fn signature(&self) -> &Signature {
        &self.sig
    }

    fn metrics_source(&self) -> Option<Arc<dyn MetricsSource>> {
        Some(self.store().clone())
    }

    fn check_request(&self, inputs: &[RequestTensor<'_>]) -> Result<()> {
        match self.settings.interface {
            Interface::Hps | Interface::Update => {
                let keys = from_chunks(&inputs[0], i64::from_le_bytes);
                let numkeys = from_chunks(&inputs[1], i32::from_le_bytes);
                let parts = self.split(&keys, &numkeys)?;
                if self.settings.interface == Interface::Update {
                    let want: usize = parts.iter().enumerate().map(|(t, p)| p.len() * self.store().dim(t)).sum();
                    let got = inputs[2].byte_size() / 4;
                    if got != want {
                        return Err(Error::invalid_arg(format!(
                            "input '{}' holds {got} values; the keys need {want} (Σ numkeys_i × dim_i)",
                            self.sig.inputs[2].name
                        )));
                    }
                    let vals = from_chunks(&inputs[2], f32::from_le_bytes);
                    if let Some(i) = vals.iter().position(|v| !v.is_finite()) {
                        return Err(Error::invalid_arg(format!("input '{}' holds a NaN or infinite value at element {i}", self.sig.inputs[2].name)));
                    }
                }
                Ok(())
            }
            Interface::Batched => {
                let keys = from_chunks(&inputs[0], i64::from_le_bytes);
                let tables = self.store().table_count();
                for t in 0..tables {
                    let col: Vec<i64> = keys.iter().skip(t).step_by(tables).copied().collect();
                    self.check_vocabulary(t, &col)?;
                }
                Ok(())
            }
        }
    }

    fn run(
        &mut self,
        inputs: &[BatchTensor<'_>],
        outputs: &[&str],
        sink: &mut dyn FnMut(OutputView<'_>) -> Result<()>,
    ) -> Result<()> {
        let host = |i: usize| -> Result<&[u8]> {
            inputs[i].host_bytes().ok_or_else(|| Error::unsupported(format!("input '{}' in GPU memory is not supported by the embedding engine yet", inputs[i].name)))
        };
        let store = self.store().clone();
        let out_name = self.sig.outputs[0].name.clone();
        let wanted = outputs.iter().any(|o| *o == out_name);
        match self.settings.interface {
            Interface::Hps => {
                let keys = as_i64(host(0)?);
                let numkeys = as_i32(host(1)?);
                let parts = self.split(&keys, &numkeys)?;
                let total: usize = parts.iter().enumerate().map(|(t, p)| p.len() * store.dim(t)).sum();
                // table after table, each table's rows contiguous
                let mut rows = RowSink::new(&mut self.device_rows, self.sig.device, total)?;
                let mut at = 0;
                for (t, part) in parts.iter().enumerate() {
                    rows.put(&self.caches, t, part, at, store.dim(t))?;
                    at += part.len() * store.dim(t);
                }
                if wanted {
                    sink(OutputView { name: &out_name, dtype: DataType::F32, shape: &[total as i64], data: rows.bytes(total)? })?;
                }
            }
            Interface::Batched => {
                let keys = as_i64(host(0)?);
                let tables = store.table_count();
                let dim = store.dim(0);
                let batch = keys.len() / tables;
                let total = batch * tables * dim;
                // [batch, tables, dim]: table t's row of sample b at (b * tables + t) * dim
                let mut rows = RowSink::new(&mut self.device_rows, self.sig.device, total)?;
                for t in 0..tables {
                    let col: Vec<i64> = keys.iter().skip(t).step_by(tables).copied().collect();
                    rows.put(&self.caches, t, &col, t * dim, tables * dim)?;
                }
                if wanted {
                    let shape = [batch as i64, tables as i64, dim as i64];
                    sink(OutputView { name: &out_name, dtype: DataType::F32, shape: &shape, data: rows.bytes(total)? })?;
                }
            }
            Interface::Update => {
                let keys = as_i64(host(0)?);
                let numkeys = as_i32(host(1)?);
                let vectors = as_f32(host(2)?);
                let parts = self.split(&keys, &numkeys)?;
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
                    sink(OutputView { name: &out_name, dtype: DataType::I64, shape: &[1], data: Bytes::Host(bytemuck::cast_slice(&count)) })?;
                }
            }
        }
        Ok(())
    }
}

