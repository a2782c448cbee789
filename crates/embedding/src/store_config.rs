//! The store's and its tables' settings, and how cache rows are shared out among tables.

use std::path::PathBuf;

use triton_rust_core::error::{Error, Result};

use crate::{stream, table};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableFormat {
    /// `keys.npy` + `vectors.npy` (ours).
    Npy,
    /// HugeCTR/HPS `key` + `emb_vector`.
    HugeCtr,
}

#[derive(Debug, Clone)]
pub struct TableConfig {
    pub name: String,
    pub dim: usize,
    /// Directory holding the table's files; `None` for a table filled only by updates/Redis.
    pub path: Option<PathBuf>,
    pub format: Option<TableFormat>,
    pub default_value: f32,
}

#[derive(Debug, Clone)]
pub struct StoreConfig {
    pub tables: Vec<TableConfig>,
    /// Fraction of the rows the cache holds (HPS `gpucacheper`), per table or of the
    /// whole store as `cache_allocation` says.
    pub cache_ratio: f64,
    /// Each table's own fraction (`gpucacheper_per_table`), in table order, in place of
    /// `cache_ratio`; empty: `cache_ratio` for every table. Only with `PerTable`.
    pub cache_ratios: Vec<f64>,
    pub cache_allocation: CacheAllocation,
    /// How the GPU caches keep their rows (`gpucache_row_type`); the CPU cache keeps fp32.
    pub cache_rows: CacheRows,
    /// Which key a full cache set gives up (`gpucache_policy`), on the GPU and the CPU.
    pub cache_eviction: CacheEviction,
    /// Whether a GPU cache keeps a key index (`gpucache_key_index`).
    pub cache_index: CacheIndex,
    /// The pooled lookups stamp one hit in this many in the GPU caches
    /// (`gpucache_hit_stamp_every`: 1, every hit; a power of two up to 1024; 0: none).
    pub hit_stamp_every: u32,
    /// HPS `hit_rate_threshold`: below it, misses are inserted before the lookup returns.
    pub hit_rate_threshold: f64,
    /// Where the update logs of tables without files live (`<dir>/<table>/`); tables with
    /// files keep theirs in `<table files>/updates/`.
    pub update_log_dir: Option<PathBuf>,
    /// Rows written by updates after which a table is compacted (0: never).
    pub compaction_rows: usize,
    /// A Redis Stream of updates this store follows.
    pub update_stream: Option<stream::StreamSpec>,
    /// Where the host tier keeps rows loaded from files (`host_memory`).
    pub host_memory: table::HostRows,
    /// How the rows are spread over the GPUs the store's instances use (`gpucache_placement`).
    pub placement: Placement,
    /// Sharded rows: the share of each GPU's room that tables copied to every GPU (the most
    /// lookups a byte first) may take together (`gpucache_sharded_replicate`; 0: every table
    /// on one GPU).
    pub replicate_share: f64,
    /// Sharded rows: the most bytes of rows the plan places on each GPU
    /// (`gpucache_sharded_memory_gb`; 0: each GPU's free memory less the share kept free).
    pub sharded_memory: u64,
    /// Keys a sample looks up in each table (`embedding_hotness_per_table`); empty: one each.
    /// Sharded rows copy the tables with the most lookups per byte first.
    pub hotness: Vec<usize>,
    /// Where the caches save the keys they hold and load them at start (`cache_state_dir`,
    /// `cache_state_period_s`); `None`: they start empty.
    pub cache_state: Option<CacheState>,
    /// The keys pinned caches hold (`gpucache_pinned_keys`, with `gpucache_policy: pinned`):
    /// a cache state file (`store/warm.rs`), of any store with the same tables.
    pub pinned_keys: Option<PathBuf>,
}

/// `gpucache_sharded_replicate`'s default: about a third of each GPU's room. On two H200s
/// with MLPerf DLRM-v2's fp32 rows in requests of 8,192 pairs, 0.35 (which copies t20, a
/// table of 100 lookups a pair) served 0.88–0.98× the same model replicated at half its rows,
/// where a sixteenth (the small tables only) served 0.58× (`docs/multi-gpu.md`).
pub const REPLICATE_SHARE: f64 = 0.35;

/// Where a store's rows live on a host of several GPUs (`gpucache_placement`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Placement {
    /// Each GPU its own cache of the same rows (HPS's way).
    #[default]
    Replicated,
    /// Every row in GPU memory once: the tables spread over the host's GPUs (`shard.rs`),
    /// each GPU's lookup reading the tables it lacks from its peers' memory.
    Sharded,
}

/// As a model parameter's text (`parse`).
impl std::str::FromStr for Placement {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Placement, String> {
        Placement::parse(s).map_err(|e| e.message().to_string())
    }
}

impl Placement {
    pub fn parse(s: &str) -> Result<Placement> {
        match s.trim() {
            "" | "replicated" => Ok(Placement::Replicated),
            "sharded" => Ok(Placement::Sharded),
            other => Err(Error::invalid_arg(format!(
                "gpucache_placement must be replicated or sharded; got '{other}'"
            ))),
        }
    }
}

/// How `cache_ratio` becomes each table's cache size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CacheAllocation {
    /// `cache_ratio` of every table's rows (HPS's meaning of `gpucacheper`).
    #[default]
    PerTable,
    /// `cache_ratio` of the store's rows in all, shared out by water-filling: every table
    /// gets `min(WHOLE_ROOM × rows, level)` slots with the level set so the total is the
    /// budget. Small tables (which a per-table share leaves thrashing in a few sets) are
    /// cached whole, with room to spare, for a sliver of the budget; the large ones share
    /// the rest equally.
    Store,
    /// As `Store`, the large tables' share in proportion to their keys a sample
    /// (`embedding_hotness_per_table`): each slot then goes where it saves the most misses
    /// when the tables' keys follow one law. MLPerf DLRM-v2 at a 10% cache, Zipf α 1.05: a
    /// stationary hit rate of 0.953 against `Store`'s 0.935, 28% fewer misses.
    Lookups,
}

/// As a model parameter's text (`parse`).
impl std::str::FromStr for CacheAllocation {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<CacheAllocation, String> {
        CacheAllocation::parse(s).map_err(|e| e.message().to_string())
    }
}

impl CacheAllocation {
    pub fn parse(s: &str) -> Result<CacheAllocation> {
        match s.trim() {
            "" | "per_table" => Ok(CacheAllocation::PerTable),
            "store" => Ok(CacheAllocation::Store),
            "lookups" => Ok(CacheAllocation::Lookups),
            other => Err(Error::invalid_arg(format!(
                "gpucache_allocation must be per_table, store or lookups; got '{other}'"
            ))),
        }
    }
}

/// How a GPU cache keeps its rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CacheRows {
    /// As the tables hold them (HPS's way).
    #[default]
    F32,
    /// Rounded once to fp16 when they go in: half the GPU memory per row and half the bytes
    /// each hit reads. A TYPE_FP16 lookup answers the same bits as from fp32 rows; a
    /// TYPE_FP32 lookup answers the fp16 value.
    F16,
}

/// As a model parameter's text (`parse`).
impl std::str::FromStr for CacheRows {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<CacheRows, String> {
        CacheRows::parse(s).map_err(|e| e.message().to_string())
    }
}

impl CacheRows {
    /// The parameter's spelling.
    pub fn name(self) -> &'static str {
        match self {
            CacheRows::F32 => "fp32",
            CacheRows::F16 => "fp16",
        }
    }

    pub fn parse(s: &str) -> Result<CacheRows> {
        match s.trim() {
            "" | "fp32" => Ok(CacheRows::F32),
            "fp16" => Ok(CacheRows::F16),
            other => Err(Error::invalid_arg(format!(
                "gpucache_row_type must be fp32 or fp16; got '{other}'"
            ))),
        }
    }
}

/// Which key a full cache set gives up (`gpucache_policy`); `cache::CachePolicy` says how.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CacheEviction {
    /// The least recently used; every missed key goes in (HPS's way).
    #[default]
    Lru,
    /// The least frequently used, and a missed key goes in only once it has been looked up
    /// more often than that one: on a steady stream the caches hold the most frequent keys.
    Lfu,
    /// None: the caches hold the keys of a file (`gpucache_pinned_keys`) from load to unload,
    /// as NVIDIA's MLPerf DLRM-v2 keeps its most frequent rows in HBM. A lookup stamps no hit
    /// and inserts no miss; an update still rewrites a held row.
    Pinned,
}

/// As a model parameter's text (`parse`).
impl std::str::FromStr for CacheEviction {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<CacheEviction, String> {
        CacheEviction::parse(s).map_err(|e| e.message().to_string())
    }
}

impl CacheEviction {
    /// The parameter's spelling.
    pub fn name(self) -> &'static str {
        match self {
            CacheEviction::Lru => "lru",
            CacheEviction::Lfu => "lfu",
            CacheEviction::Pinned => "pinned",
        }
    }

    pub fn parse(s: &str) -> Result<CacheEviction> {
        match s.trim() {
            "" | "lru" => Ok(CacheEviction::Lru),
            "lfu" => Ok(CacheEviction::Lfu),
            "pinned" => Ok(CacheEviction::Pinned),
            other => Err(Error::invalid_arg(format!(
                "gpucache_policy must be lru, lfu or pinned; got '{other}'"
            ))),
        }
    }
}

/// Whether a GPU cache of a table whose keys are its row numbers keeps a key index: 4 bytes a
/// row of GPU memory, the slot each key is in, through which a pooled lookup finds a key with
/// one 4-byte read and one tag instead of its set's 32 tags (256 bytes).
/// Off unless asked: served on an H200 it moved DLRM-v2's rate by no more than the calls differ
/// (docs/embedding-store.md#the-key-index).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CacheIndex {
    /// Where the index takes at most a quarter of the cache's own GPU memory
    /// ([`CacheIndex::rows`]): a cache of at least about 6% of a table of rows of 128 fp16.
    Auto,
    On,
    #[default]
    Off,
}

/// As a model parameter's text (`parse`).
impl std::str::FromStr for CacheIndex {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<CacheIndex, String> {
        CacheIndex::parse(s).map_err(|e| e.message().to_string())
    }
}

impl CacheIndex {
    /// The parameter's spelling.
    pub fn name(self) -> &'static str {
        match self {
            CacheIndex::Auto => "auto",
            CacheIndex::On => "on",
            CacheIndex::Off => "off",
        }
    }

    pub fn parse(s: &str) -> Result<CacheIndex> {
        match s.trim() {
            "auto" => Ok(CacheIndex::Auto),
            "on" => Ok(CacheIndex::On),
            "" | "off" => Ok(CacheIndex::Off),
            other => Err(Error::invalid_arg(format!(
                "gpucache_key_index must be auto, on or off; got '{other}'"
            ))),
        }
    }

    /// The keys a cache's index covers (0: no index) for a table of `dense` rows (keys
    /// `0..rows` in order; `None`: any other keys, which no index covers) whose cache takes
    /// `cache_bytes` of GPU memory.
    pub fn rows(self, dense: Option<usize>, cache_bytes: usize) -> usize {
        match (self, dense) {
            (CacheIndex::Off, _) | (_, None) => 0,
            (CacheIndex::On, Some(rows)) => rows,
            (CacheIndex::Auto, Some(rows)) => {
                if rows * 4 <= cache_bytes / 4 {
                    rows
                } else {
                    0
                }
            }
        }
    }
}

/// Slots per row of a table the store-wide allocation caches whole. Keys land in sets by
/// hash, so a table of exactly as many rows as slots overfills a set for every few that
/// are short: ~7% of its keys find no way in their set and miss on every lookup, however
/// hot. A small table's keys are all hot (on the H100 Criteo run, tables of 100 to 6,000
/// rows made most of the misses); at half load a set overflows about once in 10^4.
pub const WHOLE_ROOM: usize = 2;

/// Cache slots per table for tables of `rows` rows under `ratio` and `allocation`;
/// `lookups`: each table's keys a sample (`Lookups` weighs the tables by them; empty or a
/// zero: one).
pub fn cache_rows(
    rows: &[usize],
    ratio: f64,
    allocation: CacheAllocation,
    lookups: &[usize],
) -> Vec<usize> {
    let weight = |t: usize| match allocation {
        CacheAllocation::Lookups => lookups.get(t).copied().unwrap_or(1).max(1) as u128,
        _ => 1,
    };
    match allocation {
        CacheAllocation::PerTable => {
            rows.iter().map(|&r| (r as f64 * ratio).ceil() as usize).collect()
        }
        CacheAllocation::Store | CacheAllocation::Lookups => {
            // water-filling: a table gets its weight's share of what is left, at most
            // WHOLE_ROOM slots a row; the tables that level would fill whole go first
            let mut budget = (rows.iter().sum::<usize>() as f64 * ratio).floor() as u128;
            let mut left: u128 = (0..rows.len()).map(weight).sum();
            let mut order: Vec<usize> = (0..rows.len()).collect();
            order.sort_by(|&a, &b| {
                (rows[a] as u128 * weight(b)).cmp(&(rows[b] as u128 * weight(a))).then(a.cmp(&b))
            });
            let mut out = vec![0; rows.len()];
            for &t in &order {
                let share = budget * weight(t) / left.max(1);
                out[t] = ((WHOLE_ROOM * rows[t]) as u128).min(share) as usize;
                budget -= out[t] as u128;
                left -= weight(t);
            }
            out
        }
    }
}

impl StoreConfig {
    /// A store of `tables` with the parameters' defaults (as `docs/settings.md` gives them:
    /// a 10% cache of each table, LRU, fp32 cache rows, fills before a lookup returns below a
    /// hit rate of 0.9, update logs beside the tables' files, no compaction, no stream, rows
    /// placed by `host_memory: auto`, replicated, no saved cache state); tools and tests set
    /// what they need over it.
    pub fn with_tables(tables: Vec<TableConfig>) -> StoreConfig {
        StoreConfig {
            tables,
            cache_ratio: 0.1,
            cache_ratios: Vec::new(),
            cache_allocation: CacheAllocation::PerTable,
            cache_rows: CacheRows::default(),
            cache_eviction: CacheEviction::default(),
            cache_index: CacheIndex::default(),
            hit_stamp_every: 1,
            hit_rate_threshold: 0.9,
            update_log_dir: None,
            compaction_rows: 0,
            update_stream: None,
            host_memory: table::HostRows::default(),
            placement: Placement::default(),
            replicate_share: REPLICATE_SHARE,
            sharded_memory: 0,
            hotness: Vec::new(),
            cache_state: None,
            pinned_keys: None,
        }
    }

    /// The fraction of table `t`'s rows its cache holds under `PerTable`: its own
    /// (`cache_ratios`) or the store's `cache_ratio`.
    pub fn table_ratio(&self, t: usize) -> f64 {
        self.cache_ratios.get(t).copied().unwrap_or(self.cache_ratio)
    }

    /// Whether any table has a cache.
    pub fn any_table_cached(&self) -> bool {
        (0..self.tables.len()).any(|t| self.table_ratio(t) > 0.0)
    }

    /// The directory of a table's update log, if it has one.
    pub fn log_dir(&self, table: &TableConfig) -> Option<PathBuf> {
        match (&self.update_log_dir, &table.path) {
            (Some(dir), _) => Some(dir.join(&table.name)),
            (None, Some(files)) => Some(files.join("updates")),
            (None, None) => None,
        }
    }
}

/// Where a store's caches save the keys they hold (`cache_state_dir`), and how often
/// (`cache_state_period_s`); read back at start (`store/warm.rs`).
#[derive(Debug, Clone, PartialEq)]
pub struct CacheState {
    /// The store's name (`store_name`, else the model's): the files' names begin with it.
    pub store: String,
    pub dir: PathBuf,
    /// Seconds between saves while serving; 0: at unload only.
    pub period_s: f64,
}

impl CacheState {
    /// The file of the caches at `place` (`gpu0`, `cpu`) of store `name`.
    pub fn file(&self, name: &str, place: &str) -> PathBuf {
        self.dir.join(format!("{name}.{place}.cache_keys"))
    }
}
