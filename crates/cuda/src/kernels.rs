//! The GPU cache's kernels (CUDA C in `kernels/cache.cu`, `pool.cu`, `probe.cu`) and the
//! batched copy (`kernels/copy.cu`), each compiled by NVRTC once per device on first use, and the launch
//! shape they share. Launching them is the cache's (`crate::cache`) and the copies'
//! (`crate::copy`); this layer only loads them.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, OnceLock};

use cudarc::driver::{CudaFunction, CudaModule, LaunchConfig};
use parking_lot::Mutex;

use crate::context::{cuda_err, gpu, GpuState};
use crate::error::{CudaError, Result};

// one NVRTC program: the cache kernels, then the pooling kernels and the pooled lookup's probes
// built on their helpers
const SOURCE: &str = concat!(
    include_str!("kernels/cache.cu"),
    include_str!("kernels/pool.cu"),
    include_str!("kernels/probe.cu")
);
const COPY_SOURCE: &str = include_str!("kernels/copy.cu");

/// Parts one launch of `copy_parts` copies: `COPY_PARTS` in `kernels/copy.cu`, which the
/// tests hold to this.
pub(crate) const COPY_PARTS: usize = 128;
// three arrays of 8-byte words and the count stay inside the 4 KB of kernel parameters
const _: () = assert!(3 * 8 * COPY_PARTS + 8 <= 4096);

/// The cache kernels of one device.
pub(crate) struct Kernels {
    pub(crate) lookup: CudaFunction,
    pub(crate) insert: CudaFunction,
    pub(crate) scatter: CudaFunction,
    pub(crate) batch: CudaFunction,
    pub(crate) fill: CudaFunction,
    /// After a fill (of either row format), its sets' ticket counts back to zero.
    pub(crate) fill_reset: CudaFunction,
    /// LFU: before a fill, its keys' misses counted in their tables' sketches; before a
    /// one-table insert, its keys'.
    pub(crate) fill_count: CudaFunction,
    pub(crate) sketch_count: CudaFunction,
    /// `batch` and `scatter` writing fp16 rows.
    pub(crate) batch_h: CudaFunction,
    pub(crate) scatter_h: CudaFunction,
    pub(crate) gather_keys: CudaFunction,
    /// A batch's misses read in place from host memory the GPU maps (`HostRows`).
    pub(crate) read_host: CudaFunction,
    /// The kernels of a batch lookup whose misses are fetched as fp16 (their tables store
    /// them so): the scatter (fp32 or fp16 out), the fill of fp32 caches, the in-place read.
    pub(crate) scatter_r16: CudaFunction,
    pub(crate) scatter_h_r16: CudaFunction,
    pub(crate) fill_r16: CudaFunction,
    pub(crate) read_host_r16: CudaFunction,
    /// Pooled lookups: each bag's rows summed (or averaged), fp32 or fp16 out.
    pub(crate) pool: CudaFunction,
    pub(crate) pool_h: CudaFunction,
    /// Bags of fixed hotness pooled from the rows of the keys as sent (fp32 or fp16 out).
    pub(crate) pool_fixed: CudaFunction,
    pub(crate) pool_fixed_h: CudaFunction,
    /// A resident table's rows written in place, and pooled lookups over resident tables
    /// (fp32 or fp16 out).
    pub(crate) resident_write: CudaFunction,
    pub(crate) pool_resident: CudaFunction,
    pub(crate) pool_resident_h: CudaFunction,
    /// Pooled lookups through the caches (`cache/batch_pool.rs`): each key's slot found (any
    /// rows; by its set's tags, or through the caches' key indexes), the bags pooled from those
    /// slots over fp32 caches (fp32 or fp16 out), the misses' rows marked, and the open bags
    /// closed with the rows fetched as fp32 or fp16 (`_r16`), fp32 or fp16 out.
    pub(crate) probe_slots: CudaFunction,
    pub(crate) probe_index: CudaFunction,
    pub(crate) pool_probe: CudaFunction,
    pub(crate) pool_probe_h: CudaFunction,
    pub(crate) pool_mark: CudaFunction,
    /// A pooled lookup's misses made distinct, and the repeats given their owner's row.
    pub(crate) dedupe_misses: CudaFunction,
    pub(crate) pool_mark_repeats: CudaFunction,
    pub(crate) pool_close: [CudaFunction; 4],
    /// The kernels that read or write a cache's rows, over caches whose rows are fp16.
    pub(crate) s16: RowKernels,
}

/// The kernels over a cache whose rows are fp16 (`RowFormat::F16` slots).
pub(crate) struct RowKernels {
    pub(crate) lookup: CudaFunction,
    pub(crate) insert: CudaFunction,
    pub(crate) batch: CudaFunction,
    pub(crate) batch_h: CudaFunction,
    pub(crate) fill: CudaFunction,
    /// The fill of rows fetched as fp16.
    pub(crate) fill_r16: CudaFunction,
    pub(crate) resident_write: CudaFunction,
    pub(crate) pool_resident: CudaFunction,
    pub(crate) pool_resident_h: CudaFunction,
    /// Pooling rows a batch lookup wrote as fp16 (fp32 or fp16 out).
    pub(crate) pool: CudaFunction,
    pub(crate) pool_h: CudaFunction,
    pub(crate) pool_fixed: CudaFunction,
    pub(crate) pool_fixed_h: CudaFunction,
    pub(crate) pool_probe: CudaFunction,
    pub(crate) pool_probe_h: CudaFunction,
}

/// Per device, something made once on first use (or why it could not be).
struct PerDevice<T>(Mutex<Option<HashMap<i32, Arc<Once<T>>>>>);

/// One device's: made once, or why it could not be.
type Once<T> = OnceLock<Result<T>>;

impl<T: Clone> PerDevice<T> {
    const fn new() -> Self {
        PerDevice(Mutex::new(None))
    }

    /// Device `id`'s, made by `make` the first time (later callers wait for it).
    fn get(&self, id: i32, make: impl FnOnce() -> Result<T>) -> Result<T> {
        let once = self.0.lock().get_or_insert_with(HashMap::new).entry(id).or_default().clone();
        once.get_or_init(make).clone()
    }
}

// Process-wide as the primary contexts the kernels are loaded into are (`context.rs`).
/// Per device, the cache kernels once compiled.
static COMPILED: PerDevice<Arc<Kernels>> = PerDevice::new();
/// Per device, the batched copy once compiled.
static COPY_COMPILED: PerDevice<CudaFunction> = PerDevice::new();

/// `source` compiled by NVRTC and loaded on `g`'s device; `needs` names what is missing
/// when the libraries are.
fn load(g: &GpuState, source: &str, needs: &str) -> Result<Arc<CudaModule>> {
    // cudarc loads libnvrtc on first use and panics when it is absent.
    catch_unwind(AssertUnwindSafe(|| -> Result<Arc<CudaModule>> {
        let ptx = cudarc::nvrtc::compile_ptx(source)
            .map_err(|e| CudaError::internal(format!("NVRTC: {e:?}")))?;
        g.ctx.load_module(ptx).map_err(cuda_err)
    }))
    .unwrap_or_else(|p| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        Err(CudaError::unavailable(format!(
            "{needs} needs the CUDA driver and NVRTC libraries: {msg}"
        )))
    })
}

fn compile(g: &GpuState) -> Result<Arc<Kernels>> {
    let lanes = lookup_lanes();
    let module = if lanes == 32 / LOOKUP_KEYS_PER_WARP {
        load(g, SOURCE, "the GPU embedding cache")?
    } else {
        load(g, &format!("#define LOOKUP_LANES {lanes}\n{SOURCE}"), "the GPU embedding cache")?
    };
    let f = |name: &str| module.load_function(name).map_err(cuda_err);
    Ok(Arc::new(Kernels {
        lookup: f("cache_lookup")?,
        insert: f("cache_insert")?,
        scatter: f("scatter_rows")?,
        batch: f("batch_lookup")?,
        fill: f("batch_fill")?,
        fill_reset: f("batch_fill_reset")?,
        fill_count: f("batch_fill_count")?,
        sketch_count: f("sketch_count")?,
        batch_h: f("batch_lookup_h")?,
        scatter_h: f("scatter_rows_h")?,
        gather_keys: f("gather_keys")?,
        read_host: f("read_host_rows")?,
        scatter_r16: f("scatter_rows_r16")?,
        scatter_h_r16: f("scatter_rows_h_r16")?,
        fill_r16: f("batch_fill_r16")?,
        read_host_r16: f("read_host_rows_r16")?,
        pool: f("pool_bags")?,
        pool_h: f("pool_bags_h")?,
        pool_fixed: f("pool_fixed")?,
        pool_fixed_h: f("pool_fixed_h")?,
        resident_write: f("resident_write")?,
        pool_resident: f("pool_resident")?,
        pool_resident_h: f("pool_resident_h")?,
        probe_slots: f("probe_slots")?,
        probe_index: f("probe_index")?,
        pool_probe: f("pool_probe")?,
        pool_probe_h: f("pool_probe_h")?,
        pool_mark: f("pool_mark_misses")?,
        dedupe_misses: f("dedupe_misses")?,
        pool_mark_repeats: f("pool_mark_repeats")?,
        pool_close: [
            f("pool_close")?,
            f("pool_close_h")?,
            f("pool_close_r16")?,
            f("pool_close_h_r16")?,
        ],
        s16: RowKernels {
            lookup: f("cache_lookup_s16")?,
            insert: f("cache_insert_s16")?,
            batch: f("batch_lookup_s16")?,
            batch_h: f("batch_lookup_h_s16")?,
            fill: f("batch_fill_s16")?,
            fill_r16: f("batch_fill_s16_r16")?,
            resident_write: f("resident_write_s16")?,
            pool_resident: f("pool_resident_s16")?,
            pool_resident_h: f("pool_resident_h_s16")?,
            pool: f("pool_bags_s16")?,
            pool_h: f("pool_bags_h_s16")?,
            pool_fixed: f("pool_fixed_s16")?,
            pool_fixed_h: f("pool_fixed_h_s16")?,
            pool_probe: f("pool_probe_s16")?,
            pool_probe_h: f("pool_probe_h_s16")?,
        },
    }))
}

/// State of one device and its kernels, or the reason there is none.
pub(crate) fn device(id: i32) -> Result<(Arc<GpuState>, Arc<Kernels>)> {
    let g = gpu(id).map_err(|e| {
        if e.unavailable {
            CudaError::unavailable(format!(
                "the GPU embedding cache needs the CUDA driver and NVRTC libraries: {e}"
            ))
        } else {
            e
        }
    })?;
    let k = COMPILED.get(id, || compile(&g))?;
    Ok((g, k))
}

/// The batched copy (`copy_parts`) of device `id`, compiled on first use.
pub(crate) fn copy_parts(id: i32) -> Result<CudaFunction> {
    COPY_COMPILED.get(id, || {
        let g = gpu(id)?;
        load(&g, COPY_SOURCE, "the batched copy")?.load_function("copy_parts").map_err(cuda_err)
    })
}

/// Keys a warp of the batch lookup (`batch_lookup*`, `probe_slots`) takes by default: 32 /
/// `LOOKUP_LANES` in the kernels' source, which the tests hold to this.
pub(crate) const LOOKUP_KEYS_PER_WARP: usize = 4;

/// Lanes a key of the batch lookup, as this process compiles it: `TRITON_RUST_LOOKUP_LANES`
/// (1, 2, 4 or 8: a key's 32 tags read 32, 16, 8 or 4 a lane, so 32, 16, 8 or 4 keys' reads in
/// flight a warp) in its environment, read once; else 32 / [`LOOKUP_KEYS_PER_WARP`]. An A/B knob.
pub(crate) fn lookup_lanes() -> usize {
    static LANES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *LANES.get_or_init(|| {
        std::env::var("TRITON_RUST_LOOKUP_LANES")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|l| matches!(l, 1 | 2 | 4 | 8))
            .unwrap_or(32 / LOOKUP_KEYS_PER_WARP)
    })
}

/// Keys a warp of the batch lookup takes, as compiled ([`lookup_lanes`]).
pub(crate) fn lookup_keys_per_warp() -> usize {
    32 / lookup_lanes()
}

/// Groups of [`lookup_keys_per_warp`] keys a warp of `probe_slots` takes: `PROBE_STEPS` in the
/// kernels' source, which the tests hold to this.
pub(crate) const PROBE_STEPS: usize = 4;

/// Fields of a table's descriptor of host rows the GPU maps: `HOST_DESC` in the kernels'
/// source (`read_host_rows`), which the tests hold to this.
pub(crate) const HOST_DESC: usize = 4;

/// Missed keys a warp of `read_host_rows` reads: `HOST_ROWS_PER_WARP` in the kernels' source.
pub(crate) const HOST_ROWS_PER_WARP: usize = 4;

/// One warp per item, 256 threads a block.
pub(crate) fn warps_config(warps: usize) -> LaunchConfig {
    threads_config(warps * 32)
}

/// One thread per item, 256 threads a block.
pub(crate) fn threads_config(threads: usize) -> LaunchConfig {
    let block = 256u64;
    LaunchConfig {
        grid_dim: ((threads as u64).div_ceil(block) as u32, 1, 1),
        block_dim: (block as u32, 1, 1),
        shared_mem_bytes: 0,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_kernel_loaded_is_in_the_source() {
        for name in [
            "cache_lookup",
            "cache_insert",
            "scatter_rows",
            "batch_lookup",
            "batch_fill",
            "batch_fill_reset",
            "batch_fill_count",
            "sketch_count",
            "batch_lookup_h",
            "scatter_rows_h",
            "gather_keys",
            "read_host_rows",
            "read_host_rows_r16",
            "scatter_rows_r16",
            "scatter_rows_h_r16",
            "batch_fill_r16",
            "batch_fill_s16_r16",
            "cache_lookup_s16",
            "cache_insert_s16",
            "batch_lookup_s16",
            "batch_lookup_h_s16",
            "batch_fill_s16",
            "pool_bags",
            "pool_bags_h",
            "pool_fixed",
            "pool_fixed_h",
            "resident_write",
            "resident_write_s16",
            "pool_resident",
            "pool_resident_h",
            "pool_resident_s16",
            "pool_resident_h_s16",
            "pool_bags_s16",
            "pool_bags_h_s16",
            "pool_fixed_s16",
            "pool_fixed_h_s16",
            "probe_slots",
            "probe_index",
            "pool_probe",
            "pool_probe_h",
            "pool_probe_s16",
            "pool_probe_h_s16",
            "pool_mark_misses",
            "dedupe_misses",
            "pool_mark_repeats",
            "pool_close",
            "pool_close_h",
            "pool_close_r16",
            "pool_close_h_r16",
        ] {
            let decl = format!("extern \"C\" __global__ void {name}(");
            assert!(super::SOURCE.contains(&decl), "{name}");
        }
    }

    #[test]
    fn the_batched_copy_takes_as_many_parts_as_its_launch_passes() {
        let define = format!("#define COPY_PARTS {}\n", super::COPY_PARTS);
        assert!(super::COPY_SOURCE.contains(&define), "copy.cu must say {define:?}");
        assert!(
            super::COPY_SOURCE.contains("extern \"C\" __global__ void copy_parts(Parts p, int n)")
        );
    }

    #[test]
    fn the_batch_lookup_launch_matches_its_lanes_a_key() {
        let lanes = 32 / super::LOOKUP_KEYS_PER_WARP;
        assert_eq!(lanes * super::LOOKUP_KEYS_PER_WARP, 32);
        let define = format!("#define LOOKUP_LANES {lanes}\n");
        assert!(super::SOURCE.contains(&define), "cache.cu must say {define:?}");
    }

    #[test]
    fn the_probe_launch_matches_its_steps_a_warp() {
        let define = format!("#define PROBE_STEPS {} ", super::PROBE_STEPS);
        assert!(super::SOURCE.contains(&define), "probe.cu must say {define:?}");
    }

    #[test]
    fn the_slots_descriptor_has_the_fields_the_kernels_read() {
        let define = format!("#define DESC {} ", crate::cache::DESC);
        assert!(super::SOURCE.contains(&define), "cache.cu must say {define:?}");
    }

    #[test]
    fn the_host_rows_descriptor_has_the_fields_the_kernel_reads() {
        for define in [
            format!("#define HOST_DESC {}\n", super::HOST_DESC),
            format!("#define HOST_ROWS_PER_WARP {}\n", super::HOST_ROWS_PER_WARP),
        ] {
            assert!(super::SOURCE.contains(&define), "cache.cu must say {define:?}");
        }
    }
}
