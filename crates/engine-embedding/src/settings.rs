//! The embedding engine's settings, read once at load: the store's tables (the store
//! crate's `TableSettings`, shared with the recommender engine), its tiers, its updates
//! and who may make them.

use std::path::Path;

pub use crate::miss_reads::MissReads;
use triton_rust_core::config::ModelConfig;
use triton_rust_core::error::{Error, Result};
use triton_rust_core::params::Parsed;
use triton_rust_core::settings::{BackendSettings, Known};
use triton_rust_embedding::redis::{Access, Credential as RedisCredential};
use triton_rust_embedding::settings::TableSettings;
use triton_rust_embedding::stream::StreamSpec;
use triton_rust_embedding::table::HostRows;
use triton_rust_embedding::{
    CacheAllocation, CacheEviction, CacheIndex, CacheRows, Placement, StoreConfig, TableConfig,
    REPLICATE_SHARE,
};

triton_rust_core::parameters! {
    /// The embedding engine's model parameters, as config.pbtxt spells them (HPS's names
    /// where HPS has one). The tables' own (names, dims, files, defaults, vocabularies) are
    /// parsed by the store crate's `TableSettings`, which the recommender shares; the store's
    /// enums by their own parsers.
    pub struct StoreParams {
        embedding_interface: Interface = Interface::Hps, doc "hps";
        embedding_hotness_per_table: Option<String> = None, doc "none";
        embedding_combiner: Option<Combiner> = None, doc "sum";
        embedding_table_names: Option<String> = None, doc "required";
        embedding_vecsize_per_table: Option<String> = None, doc "required";
        sparse_files: Option<String> = None, doc "tables/<name>";
        default_value_for_each_table: Option<String> = None, doc "0";
        vocabulary_size_per_table: Option<String> = None, doc "unchecked";
        gpucacheper: f64 = 0.1, doc "0.1";
        gpucacheper_per_table: Option<String> = None, doc "none";
        gpucache_sharing: Parsed<CacheSharing> = Parsed(CacheSharing::Device), doc "device";
        gpucache_placement: Parsed<Placement> = Parsed(Placement::Replicated), doc "replicated";
        gpucache_sharded_replicate: f64 = REPLICATE_SHARE, doc "0.35";
        gpucache_sharded_memory_gb: f64 = 0.0, doc "0";
        deployed_device_list: Option<String> = None, doc "none";
        gpucache_row_type: Parsed<CacheRows> = Parsed(CacheRows::F32), doc "fp32";
        gpucache_policy: Parsed<CacheEviction> = Parsed(CacheEviction::Lru), doc "lru";
        gpucache_pinned_keys: Option<String> = None, doc "none";
        gpucache_key_index: Parsed<CacheIndex> = Parsed(CacheIndex::Off), doc "off";
        gpucache_hit_stamp_every: f64 = 1.0, doc "1";
        gpucache_miss_reads: Parsed<MissReads> = Parsed(MissReads::Cpu), doc "cpu";
        gpucache_allocation: Parsed<CacheAllocation> = Parsed(CacheAllocation::PerTable), doc "per_table";
        hit_rate_threshold: f64 = 0.9, doc "0.9";
        volatile_db: Option<String> = None, doc "none";
        volatile_db_credential_file: Option<String> = None, doc "none";
        volatile_db_credential_env: Option<String> = None, doc "none";
        volatile_db_tls_ca_file: Option<String> = None, doc "the system's roots";
        store_name: Option<String> = None, doc "the model's name";
        host_memory: Parsed<HostRows> = Parsed(HostRows::Auto), doc "auto";
        cache_state_dir: Option<String> = None, doc "none";
        cache_state_period_s: f64 = 0.0, doc "0";
        gpu_key_piece: f64 = (128 << 10) as f64, doc "131072";
        gpu_key_upload_tasks: f64 = 8.0, doc "8";
        update_log_dir: Option<String> = None, doc "<table files>/updates/";
        update_compaction_rows: f64 = 1_000_000.0, doc "1000000";
        update_stream: Option<String> = None, doc "none";
        update_stream_group: Option<String> = None, doc "triton-rust:<node>:<store>";
        update_stream_start: String = "0".into(), doc "0";
        update_stream_write_remote: bool = true, doc "true";
        update_credential_file: Option<String> = None, doc "none";
        update_credential_env: Option<String> = None, doc "none";
        allow_unauthenticated_updates: bool = false, doc "false";
    }
}

#[cfg(test)]
thread_local! {
    /// How many times this thread parsed a model's store settings (tests count them).
    pub(crate) static PARSED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Interface {
    Hps,
    Batched,
    /// Several keys per sample and table (a bag), each bag's rows reduced to one row.
    Pooled,
    Update,
}

/// How a bag's rows reduce to one (HPS's combiner names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Combiner {
    Sum,
    Mean,
}

/// The pooled interface's shape: how many keys each sample sends per table (the table's
/// hotness, its bag's room; a bag may be shorter, padded with [`PAD`]) and how a bag reduces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pooling {
    pub hotness: Vec<usize>,
    pub combiner: Combiner,
}

/// A key that stands for no key: the padding of a bag shorter than its table's hotness (an
/// empty bag is all padding, and pools to zeros).
pub const PAD: i64 = -1;

impl Pooling {
    /// Keys per sample, all tables together.
    pub fn width(&self) -> usize {
        self.hotness.iter().sum()
    }

    fn from_params(p: &StoreParams, tables: usize) -> Result<Option<Pooling>> {
        let hot = p.embedding_hotness_per_table.as_deref();
        if p.embedding_interface != Interface::Pooled {
            let given = [
                ("embedding_hotness_per_table", hot.is_some()),
                ("embedding_combiner", p.embedding_combiner.is_some()),
            ];
            if let Some(key) = given.iter().find_map(|(k, set)| set.then_some(*k)) {
                return Err(Error::invalid_arg(format!(
                    "parameter '{key}' applies to embedding_interface pooled only"
                )));
            }
            return Ok(None);
        }
        let hot = hot.ok_or_else(|| {
            Error::invalid_arg(
                "embedding_interface pooled needs parameter 'embedding_hotness_per_table': how many keys each sample sends per table",
            )
        })?;
        let hotness = hot
            .split(',')
            .map(|h| h.trim().parse::<usize>().ok().filter(|&h| h >= 1))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                Error::invalid_arg(format!(
                    "parameter 'embedding_hotness_per_table' = '{hot}': one whole number of at least 1 per table"
                ))
            })?;
        let hotness = match hotness.as_slice() {
            [one] => vec![*one; tables],
            _ if hotness.len() == tables => hotness,
            _ => {
                return Err(Error::invalid_arg(format!(
                    "parameter 'embedding_hotness_per_table' lists {} counts for {tables} tables",
                    hotness.len()
                )))
            }
        };
        Ok(Some(Pooling { hotness, combiner: p.embedding_combiner.unwrap_or(Combiner::Sum) }))
    }
}

/// The store settings read from a model config.
#[derive(Debug, Clone)]
pub struct StoreSettings {
    pub name: String,
    pub interface: Interface,
    /// The pooled interface's hotness and combiner.
    pub pooling: Option<Pooling>,
    pub store: StoreConfig,
    /// Keys must lie in [0, size) when given (per table).
    pub vocabulary: Vec<Option<u64>>,
    pub volatile_db: Option<String>,
    /// The Redis tier's login and TLS authorities (`volatile_db_credential_*`,
    /// `volatile_db_tls_ca_file`).
    pub redis_access: Access,
    /// Who may update (the update interface only).
    pub credential: Credential,
    /// A GPU instance's whole-batch lookup sends its keys in pieces of this many keys, copied
    /// into page-locked memory by up to this many tasks (`gpu_key_piece`,
    /// `gpu_key_upload_tasks`; `crates/embedding/examples/batch_lookup_bench.rs` times the choices).
    pub key_upload: (usize, usize),
    /// Whose GPU caches a `KIND_GPU` instance looks up in (`gpucache_sharing`).
    pub cache_sharing: CacheSharing,
    /// Who reads a GPU cache's misses from the host tier (`gpucache_miss_reads`).
    pub miss_reads: MissReads,
    /// HPS's `deployed_device_list`: the GPUs its instances may be on (Triton places them by
    /// `instance_group`; this list is checked against that placement).
    pub devices: Option<Vec<i32>>,
}

/// Whose GPU caches an instance uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheSharing {
    /// One set of caches per GPU, shared by every instance of the store there (HPS's way):
    /// `gpucacheper` is of the rows on that GPU, whatever the instance count.
    Device,
    /// Each instance its own caches of `gpucacheper` (two instances hold twice the rows).
    Instance,
}

/// As a model parameter's text.
impl std::str::FromStr for CacheSharing {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<CacheSharing, String> {
        CacheSharing::parse(Some(s)).map_err(|e| e.message().to_string())
    }
}

impl CacheSharing {
    fn parse(text: Option<&str>) -> Result<CacheSharing> {
        match text {
            None | Some("device") => Ok(CacheSharing::Device),
            Some("instance") => Ok(CacheSharing::Instance),
            Some(other) => Err(Error::invalid_arg(format!(
                "parameter 'gpucache_sharing' is '{other}'; use device (one cache per GPU, shared by its instances) or instance"
            ))),
        }
    }
}

/// Where an update model's credential comes from. The secret itself never sits in the
/// config (any client may read a model's config through the config API).
#[derive(Clone, PartialEq, Eq)]
pub enum Credential {
    /// Not an update model.
    NotNeeded,
    /// `allow_unauthenticated_updates: true`, said explicitly.
    Open,
    /// The secret, read at load from `update_credential_file` or `update_credential_env`.
    Secret { source: String, secret: Vec<u8> },
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credential::NotNeeded => f.write_str("NotNeeded"),
            Credential::Open => f.write_str("Open"),
            Credential::Secret { source, .. } => write!(f, "Secret(from {source})"),
        }
    }
}

/// The request parameter (or forwarded header) that carries the credential.
pub const TOKEN_PARAMETER: &str = "embedding-update-token";

impl Credential {
    /// The credential a model config names (its parameters read here).
    #[cfg(test)]
    pub(crate) fn from_config(cfg: &ModelConfig) -> Result<Credential> {
        let p: StoreParams = triton_rust_core::params::read(&cfg.parameters)?;
        Credential::from_params(&p, &cfg.name)
    }

    pub(crate) fn from_params(p: &StoreParams, model: &str) -> Result<Credential> {
        let file = p.update_credential_file.as_deref();
        let env = p.update_credential_env.as_deref();
        let open = p.allow_unauthenticated_updates;
        let (source, secret) = match (file, env) {
            (Some(_), Some(_)) => return Err(Error::invalid_arg("set one of update_credential_file and update_credential_env, not both")),
            (Some(path), None) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| Error::invalid_arg(format!("update_credential_file '{path}' cannot be read: {e}")))?;
                (format!("file '{path}'"), text.trim().as_bytes().to_vec())
            }
            (None, Some(var)) => {
                let text = std::env::var(var).map_err(|_| Error::invalid_arg(format!("update_credential_env names '{var}', which is not set in the server's environment")))?;
                (format!("environment variable '{var}'"), text.trim().as_bytes().to_vec())
            }
            (None, None) if open => {
                log::warn!("model '{model}': updates are NOT authenticated (allow_unauthenticated_updates): anyone who can reach the server can rewrite the embeddings");
                return Ok(Credential::Open);
            }
            (None, None) => {
                return Err(Error::invalid_arg(
                    "an update model needs a credential: set parameters update_credential_file or update_credential_env \
                     (a path or a variable name, never the secret itself), or allow_unauthenticated_updates: true",
                ))
            }
        };
        if secret.is_empty() {
            return Err(Error::invalid_arg(format!(
                "the update credential from {source} is empty"
            )));
        }
        if open {
            return Err(Error::invalid_arg(
                "allow_unauthenticated_updates is set together with a credential; choose one",
            ));
        }
        Ok(Credential::Secret { source, secret })
    }
}

/// Compared in constant time (`subtle`): the time depends on the lengths only, not on where
/// the bytes differ.
pub(crate) fn same_secret(given: &[u8], secret: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    bool::from(given.ct_eq(secret))
}

impl StoreSettings {
    /// Whether a `KIND_GPU` instance's lookups have host threads read rows: some table's GPU
    /// cache holds less than all its rows, and the misses are not all read by the GPU in
    /// place. (A recommender's network then waits for its GPU work asleep: those threads
    /// need the host's cores.)
    pub fn host_threads_read_misses(&self) -> bool {
        self.miss_reads != MissReads::Gpu
            && (0..self.store.tables.len()).any(|t| self.store.table_ratio(t) < 1.0)
    }

    /// The parameters an embedding model reads, with their defaults.
    pub const KNOWN: &'static [Known] = StoreParams::KNOWN;

    pub fn from_config(
        cfg: &ModelConfig,
        version_dir: &Path,
        backend: &BackendSettings,
    ) -> Result<StoreSettings> {
        #[cfg(test)]
        PARSED.with(|n| n.set(n.get() + 1));
        let p: StoreParams = triton_rust_core::params::read(&cfg.parameters)?;
        let interface = p.embedding_interface;
        let TableSettings { names, dims, defaults, files, vocabulary } =
            TableSettings::from_parameters(&cfg.parameters)?;
        let pooling = Pooling::from_params(&p, names.len())?;
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
        let name = p.store_name.clone().unwrap_or_else(|| cfg.name.clone());
        let update_stream = match p.update_stream.as_deref() {
            None => None,
            Some(spec) => {
                let group = match &p.update_stream_group {
                    Some(g) => g.clone(),
                    None => format!("triton-rust:{}:{name}", node_name(backend)),
                };
                let mut spec = StreamSpec::parse(spec, group, p.update_stream_start.clone())?;
                spec.write_remote = p.update_stream_write_remote;
                Some(spec)
            }
        };
        let dir = p.cache_state_dir.as_deref();
        let state = crate::key_files::cache_state(dir, p.cache_state_period_s, &name, version_dir)?;
        let store = StoreConfig {
            tables,
            cache_ratio: p.gpucacheper,
            cache_ratios: match p.gpucacheper_per_table.as_deref() {
                None => Vec::new(),
                Some(list) => list
                    .split(',')
                    .map(|r| r.trim().parse::<f64>().ok())
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| {
                        Error::invalid_arg(format!(
                            "parameter 'gpucacheper_per_table' = '{list}': one fraction per table, in table order"
                        ))
                    })?,
            },
            cache_allocation: p.gpucache_allocation.0,
            cache_rows: p.gpucache_row_type.0,
            cache_eviction: p.gpucache_policy.0,
            cache_index: p.gpucache_key_index.0,
            hit_stamp_every: {
                let e = p.gpucache_hit_stamp_every;
                let ok = e == 0.0 || ((1.0..=1024.0).contains(&e) && e.fract() == 0.0 && (e as u32).is_power_of_two());
                if !ok {
                    return Err(Error::invalid_arg(format!(
                        "parameter 'gpucache_hit_stamp_every' = {e}: 1 (every hit), a power of two up to 1024, or 0 (none)"
                    )));
                }
                e as u32
            },
            hit_rate_threshold: p.hit_rate_threshold,
            update_log_dir: p.update_log_dir.as_ref().map(|d| version_dir.join(d)),
            compaction_rows: p.update_compaction_rows as usize,
            update_stream,
            host_memory: p.host_memory.0,
            placement: p.gpucache_placement.0,
            replicate_share: p.gpucache_sharded_replicate,
            sharded_memory: {
                let gb = p.gpucache_sharded_memory_gb;
                if !(gb.is_finite() && gb >= 0.0) {
                    return Err(Error::invalid_arg(format!(
                        "parameter 'gpucache_sharded_memory_gb' is the most GB of rows sharded placement puts on each GPU, 0 or more (0: each GPU's free memory less 15%); got {gb}"
                    )));
                }
                (gb * 1e9) as u64
            },
            hotness: pooling.as_ref().map_or_else(Vec::new, |p| p.hotness.clone()),
            cache_state: state.clone(),
            pinned_keys: crate::key_files::pinned_keys(
                p.gpucache_policy.0,
                p.gpucache_pinned_keys.as_deref(),
                state.as_ref(),
                version_dir,
            )?,
        };
        if !(0.0..=0.5).contains(&store.replicate_share) {
            return Err(Error::invalid_arg(format!(
                "parameter 'gpucache_sharded_replicate' is the share of each GPU's memory for tables copied to every GPU, from 0 to 0.5; got {}",
                store.replicate_share
            )));
        }
        if store.placement == Placement::Sharded {
            if !cfg.instance_kinds.iter().any(|k| k == "KIND_GPU") {
                return Err(Error::invalid_arg(format!(
                    "parameter 'gpucache_placement' is sharded, which spreads the rows over GPUs; the model's instances are {:?}",
                    cfg.instance_kinds
                )));
            }
            if let Some(t) = (0..store.tables.len()).find(|&t| store.table_ratio(t) < 1.0) {
                return Err(Error::invalid_arg(format!(
                    "parameter 'gpucache_placement' is sharded, which keeps every row in GPU memory once: set gpucacheper to 1.0 (table '{}' caches {})",
                    store.tables[t].name,
                    store.table_ratio(t)
                )));
            }
        }
        let credential = if interface == Interface::Update {
            Credential::from_params(&p, &cfg.name)?
        } else {
            Credential::NotNeeded
        };
        let whole = |key: &str, v: f64, least: usize| -> Result<usize> {
            if v.fract() != 0.0 || v < least as f64 || v > (1u64 << 32) as f64 {
                return Err(Error::invalid_arg(format!(
                    "parameter '{key}' must be a whole number of at least {least}, got {v}"
                )));
            }
            Ok(v as usize)
        };
        let key_upload = (
            whole("gpu_key_piece", p.gpu_key_piece, 1024)?,
            whole("gpu_key_upload_tasks", p.gpu_key_upload_tasks, 1)?,
        );
        Ok(StoreSettings {
            name,
            interface,
            pooling,
            store,
            vocabulary,
            redis_access: redis_access(&p)?,
            volatile_db: p.volatile_db,
            credential,
            key_upload,
            cache_sharing: p.gpucache_sharing.0,
            miss_reads: p.gpucache_miss_reads.0,
            devices: device_list(p.deployed_device_list.as_deref(), &cfg.instance_kinds)?,
        })
    }
}

/// `deployed_device_list` ("0,1" or HPS's "[0, 1]"): GPU ids, each once; only where the
/// model has KIND_GPU instances (a KIND_CPU model's instances use none of them).
fn device_list(raw: Option<&str>, instance_kinds: &[String]) -> Result<Option<Vec<i32>>> {
    let Some(raw) = raw else { return Ok(None) };
    let bad = |why: String| {
        Error::invalid_arg(format!(
            "parameter 'deployed_device_list' is '{raw}': {why}; give GPU ids such as 0,1 (HPS's list maps to instance_group {{ kind: KIND_GPU gpus: [ ... ] }})"
        ))
    };
    let inner = raw.trim().trim_start_matches('[').trim_end_matches(']');
    let mut ids = Vec::new();
    for part in inner.split(',').map(str::trim) {
        let id: i32 = part.parse().map_err(|_| bad(format!("'{part}' is not a GPU id")))?;
        if id < 0 {
            return Err(bad(format!("{id} is not a GPU id")));
        }
        if ids.contains(&id) {
            return Err(bad(format!("GPU {id} is named twice")));
        }
        ids.push(id);
    }
    if !instance_kinds.iter().any(|k| k == "KIND_GPU") {
        return Err(bad(format!("the model's instances are {instance_kinds:?}, which use no GPU")));
    }
    Ok(Some(ids))
}

/// An instance on `device` against the model's `deployed_device_list`, and the list against
/// the GPUs this server sees (`visible`).
pub(crate) fn check_device(
    list: Option<&[i32]>,
    device: triton_rust_core::engine::Device,
    visible: i32,
) -> Result<()> {
    use triton_rust_core::engine::Device;
    let Some(list) = list else { return Ok(()) };
    triton_rust_embedding::shard::check_visible(list, visible)
        .map_err(|e| e.context("parameter 'deployed_device_list'"))?;
    match device {
        Device::Gpu(id) if !list.contains(&id) => Err(Error::invalid_arg(format!(
            "parameter 'deployed_device_list' is {list:?}, but Triton placed an instance on GPU {id}: name the same GPUs in instance_group {{ kind: KIND_GPU gpus: [ ... ] }}"
        ))),
        _ => Ok(()),
    }
}

/// The Redis tier's login, read at load from the file or environment variable the config
/// names (never the secret itself: any client may read a model's config through the config
/// API), and the CA file a `rediss:` server's certificate is checked against.
fn redis_access(p: &StoreParams) -> Result<Access> {
    let (file, env) =
        (p.volatile_db_credential_file.as_deref(), p.volatile_db_credential_env.as_deref());
    let credential = match (file, env) {
        (Some(_), Some(_)) => {
            return Err(Error::invalid_arg(
                "set one of volatile_db_credential_file and volatile_db_credential_env, not both",
            ))
        }
        (Some(path), None) => {
            let text = std::fs::read_to_string(path).map_err(|e| {
                Error::invalid_arg(format!(
                    "volatile_db_credential_file '{path}' cannot be read: {e}"
                ))
            })?;
            Some(RedisCredential::parse(&text, format!("file '{path}'"))?)
        }
        (None, Some(var)) => {
            let text = std::env::var(var).map_err(|_| {
                Error::invalid_arg(format!(
                    "volatile_db_credential_env names '{var}', which is not set in the server's environment"
                ))
            })?;
            Some(RedisCredential::parse(&text, format!("environment variable '{var}'"))?)
        }
        (None, None) => None,
    };
    let ca_file = match p.volatile_db_tls_ca_file.as_deref() {
        None => None,
        Some(path) => {
            let pem = std::fs::read(path).map_err(|e| {
                Error::invalid_arg(format!("volatile_db_tls_ca_file '{path}' cannot be read: {e}"))
            })?;
            Some((path.to_string(), pem))
        }
    };
    if (credential.is_some() || ca_file.is_some()) && p.volatile_db.is_none() {
        return Err(Error::invalid_arg(
            "volatile_db_credential_* or volatile_db_tls_ca_file is set without a volatile_db",
        ));
    }
    Ok(Access { credential, ca_file })
}

triton_rust_core::parameters! {
    /// The embedding engine's backend setting (`--backend-config=rust,<key>=<value>`).
    pub struct EmbeddingBackend {
        /// This server among the nodes following an update stream.
        #[serde(rename = "node-name")]
        node_name: Option<String> = None, doc "the host name";
    }
}

/// This server's name among the nodes following a stream: `--backend-config=rust,node-name=…`,
/// else the host name.
fn node_name(backend: &BackendSettings) -> String {
    let keys: EmbeddingBackend =
        triton_rust_core::params::read(&backend.cmdline).unwrap_or_default();
    keys.node_name
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname").ok().map(|h| h.trim().to_string())
        })
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "node".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use triton_rust_core::settings::{check_section, documented_defaults, undocumented};

    #[test]
    fn defaults_are_the_documented_ones() {
        let md = include_str!("../../../docs/settings.md");
        check_section(md, "Embedding engine", StoreSettings::KNOWN).unwrap();
        let wrong = undocumented(crate::CLAIM.backend_keys, &documented_defaults(md));
        assert!(wrong.is_empty(), "{wrong:?}");
    }
}
