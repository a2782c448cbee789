//! The GPU cache: the cache policy of `cache.rs` in device memory (the CUDA room).
//!
//! Same layout and policy as the CPU cache: `sets × 32` slots, a key only in set
//! `mix64(key) % sets`, batch-granular LRU with the oldest stamp (lowest way on ties)
//! evicted. A lookup is one warp per key: the 32 lanes read the set's 32 keys at once,
//! a ballot finds the way, and the warp copies the row (float4 when `dim % 4 == 0`).
//! Empty slots hold `EMPTY_KEY`, so a lookup reads only the set's 32 keys (256 bytes
//! of tags for a row of `dim × 4`), never the stamps.
//! Inserts are grouped by set on the host and one warp handles one set's keys in
//! order, so two inserts never race for a victim. All of an instance's calls go
//! through one stream, so a lookup and an insert never overlap.
//!
//! Kernels are compiled once per device at run time with NVRTC; CUDA is loaded
//! dynamically (cudarc), so this builds and the rest of the backend runs on machines
//! with no GPU. `group_by_set`, the only host logic, is unit-tested on the CPU.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, CudaViewMut, DevicePtr, LaunchConfig, PushKernelArg};
use parking_lot::Mutex;

use super::cache::{CacheCounters, CacheGeometry, CacheTier, EMPTY_KEY, WAYS};
use crate::error::{Error, Result};

const KERNELS: &str = r#"
typedef long long i64;
typedef unsigned long long u64;
#define FULL 0xffffffffu
#define EMPTY_KEY ((i64)0x8000000000000000ULL)

__device__ __forceinline__ u64 mix64(u64 k) {
    k ^= k >> 33; k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33; k *= 0xc4ceb9fe1a85ec53ULL;
    k ^= k >> 33; return k;
}

__device__ __forceinline__ void copy_row(float* __restrict__ dst, const float* __restrict__ src, int dim, int lane) {
    if ((dim & 3) == 0 && ((((size_t)dst) | ((size_t)src)) & 15) == 0) {
        const float4* s = (const float4*)src; float4* d = (float4*)dst;
        for (int j = lane; j < (dim >> 2); j += 32) d[j] = s[j];
    } else {
        for (int j = lane; j < dim; j += 32) dst[j] = src[j];
    }
}

// One warp per key: hits copy their row to out and stamp the slot with epoch.
extern "C" __global__ void cache_lookup(const i64* __restrict__ keys, int n,
        const i64* __restrict__ slot_keys, u64* __restrict__ slot_stamps,
        const float* __restrict__ rows, long long sets, int dim, u64 epoch,
        float* __restrict__ out, long long out_stride, unsigned char* __restrict__ hit) {
    long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (warp >= n) return;
    i64 key = keys[warp];
    u64 set = mix64((u64)key) % (u64)sets;
    size_t slot = set * 32 + lane;
    // Empty slots hold EMPTY_KEY, which is never inserted: only the tags are read.
    bool match = key != EMPTY_KEY && slot_keys[slot] == key;
    unsigned m = __ballot_sync(FULL, match);
    if (m == 0) { if (lane == 0) hit[warp] = 0; return; }
    int way = __ffs(m) - 1;
    copy_row(out + (size_t)warp * out_stride, rows + (set * 32 + way) * (size_t)dim, dim, lane);
    if (lane == 0) { hit[warp] = 1; slot_stamps[set * 32 + way] = epoch; }
}

// One warp per row: writes rows[i] to out + idx[i] * out_stride (rows fetched below the cache).
extern "C" __global__ void scatter_rows(const float* __restrict__ rows, const int* __restrict__ idx, int n,
        float* __restrict__ out, long long out_stride, int dim) {
    long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (warp >= n) return;
    copy_row(out + (size_t)idx[warp] * out_stride, rows + (size_t)warp * dim, dim, lane);
}

// One warp per set: inserts (or, with only_if_present, refreshes) that set's keys in order.
extern "C" __global__ void cache_insert(const i64* __restrict__ keys, const float* __restrict__ vecs,
        const int* __restrict__ order, const int* __restrict__ group_start,
        const long long* __restrict__ group_set, int groups,
        i64* __restrict__ slot_keys, u64* __restrict__ slot_stamps, float* __restrict__ rows,
        int dim, u64 epoch, int only_if_present, u64* __restrict__ counters) {
    long long g = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (g >= groups) return;
    u64 set = (u64)group_set[g];
    size_t slot = set * 32 + lane;
    for (int idx = group_start[g]; idx < group_start[g + 1]; ++idx) {
        int i = order[idx];
        i64 key = keys[i];
        if (key == EMPTY_KEY) continue;
        u64 st = slot_stamps[slot];
        i64 sk = slot_keys[slot];
        unsigned m = __ballot_sync(FULL, st != 0 && sk == key);
        int way;
        if (m != 0) {
            way = __ffs(m) - 1;
        } else {
            if (only_if_present) continue;
            u64 best = st; int bl = lane;
            for (int off = 16; off > 0; off >>= 1) {
                u64 os = __shfl_down_sync(FULL, best, off);
                int ol = __shfl_down_sync(FULL, bl, off);
                if (os < best || (os == best && ol < bl)) { best = os; bl = ol; }
            }
            way = __shfl_sync(FULL, bl, 0);
            u64 victim_stamp = __shfl_sync(FULL, best, 0);
            if (lane == 0) {
                atomicAdd(&counters[0], 1ULL);
                if (victim_stamp != 0) atomicAdd(&counters[1], 1ULL);
                slot_keys[set * 32 + way] = key;
            }
        }
        copy_row(rows + (set * 32 + way) * (size_t)dim, vecs + (size_t)i * dim, dim, lane);
        __syncwarp();
        if (lane == 0) slot_stamps[set * 32 + way] = epoch;
        __syncwarp();
    }
}
"#;

/// Groups insert keys by set: (order of key indices, start offset per group, set per group).
/// Keys keep their order within a set, as the CPU cache applies them.
pub fn group_by_set(geo: &CacheGeometry, keys: &[i64]) -> (Vec<i32>, Vec<i32>, Vec<i64>) {
    let mut idx: Vec<(usize, usize)> = keys.iter().enumerate().map(|(i, &k)| (geo.set_of(k), i)).collect();
    idx.sort_by_key(|&(s, i)| (s, i));
    let order: Vec<i32> = idx.iter().map(|&(_, i)| i as i32).collect();
    let mut starts = Vec::new();
    let mut sets = Vec::new();
    for (pos, &(s, _)) in idx.iter().enumerate() {
        if sets.last() != Some(&(s as i64)) {
            starts.push(pos as i32);
            sets.push(s as i64);
        }
    }
    starts.push(idx.len() as i32);
    (order, starts, sets)
}

struct Device {
    ctx: Arc<CudaContext>,
    lookup: CudaFunction,
    insert: CudaFunction,
    scatter: CudaFunction,
}

static DEVICES: Mutex<Option<HashMap<i32, Arc<Device>>>> = Mutex::new(None);

fn cuda_err(e: impl std::fmt::Debug) -> Error {
    Error::internal(format!("CUDA: {e:?}"))
}

fn device(id: i32) -> Result<Arc<Device>> {
    let mut devices = DEVICES.lock();
    let map = devices.get_or_insert_with(HashMap::new);
    if let Some(d) = map.get(&id) {
        return Ok(d.clone());
    }
    // cudarc loads libcuda/libnvrtc on first use and panics when they are absent.
    let made = catch_unwind(AssertUnwindSafe(|| -> Result<Device> {
        let ctx = CudaContext::new(id as usize).map_err(cuda_err)?;
        let ptx = cudarc::nvrtc::compile_ptx(KERNELS).map_err(|e| Error::internal(format!("NVRTC: {e:?}")))?;
        let module = ctx.load_module(ptx).map_err(cuda_err)?;
        Ok(Device {
            lookup: module.load_function("cache_lookup").map_err(cuda_err)?,
            insert: module.load_function("cache_insert").map_err(cuda_err)?,
            scatter: module.load_function("scatter_rows").map_err(cuda_err)?,
            ctx,
        })
    }))
    .map_err(|p| {
        let msg = p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default();
        Error::unavailable(format!("the GPU embedding cache needs the CUDA driver and NVRTC libraries: {msg}"))
    })??;
    let d = Arc::new(made);
    map.insert(id, d.clone());
    Ok(d)
}

struct Slots {
    keys: CudaSlice<i64>,
    stamps: CudaSlice<u64>,
    rows: CudaSlice<f32>,
    counters: CudaSlice<u64>,
}

pub struct GpuCache {
    dev: Arc<Device>,
    stream: Arc<CudaStream>,
    geo: CacheGeometry,
    slots: Mutex<Slots>,
    clock: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
}

/// Creates a GPU cache on device `id` (one per table per GPU instance).
pub fn new_cache(id: i32, geo: CacheGeometry) -> Result<Arc<dyn CacheTier>> {
    Ok(Arc::new(GpuCache::new(id, geo)?))
}

fn warps_config(warps: usize) -> LaunchConfig {
    let threads = warps as u64 * 32;
    let block = 256u64;
    LaunchConfig { grid_dim: (threads.div_ceil(block) as u32, 1, 1), block_dim: (block as u32, 1, 1), shared_mem_bytes: 0 }
}

impl GpuCache {
    pub fn new(id: i32, geo: CacheGeometry) -> Result<GpuCache> {
        let dev = device(id)?;
        let stream = dev.ctx.new_stream().map_err(cuda_err)?;
        let slots = Slots {
            keys: stream.clone_htod(&vec![EMPTY_KEY; geo.capacity()]).map_err(cuda_err)?,
            stamps: stream.alloc_zeros::<u64>(geo.capacity()).map_err(cuda_err)?,
            rows: stream.alloc_zeros::<f32>(geo.capacity() * geo.dim).map_err(cuda_err)?,
            counters: stream.alloc_zeros::<u64>(2).map_err(cuda_err)?,
        };
        stream.synchronize().map_err(cuda_err)?;
        Ok(GpuCache { dev, stream, geo, slots: Mutex::new(slots), clock: AtomicU64::new(1), hits: AtomicU64::new(0), misses: AtomicU64::new(0) })
    }

    /// The hit path on device buffers: keys and out already in GPU memory. Row i goes
    /// to `out[i * out_stride..]`; `hit[i]` says whether it was found.
    pub fn lookup_device(
        &self,
        keys: &CudaSlice<i64>,
        n: usize,
        out: &mut CudaViewMut<'_, f32>,
        out_stride: usize,
        hit: &mut CudaSlice<u8>,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let epoch = self.clock.fetch_add(1, Ordering::Relaxed);
        let slots = self.slots.lock();
        let (n_i, sets, dim, stride) = (n as i32, self.geo.sets as i64, self.geo.dim as i32, out_stride as i64);
        let mut b = self.stream.launch_builder(&self.dev.lookup);
        b.arg(keys).arg(&n_i).arg(&slots.keys).arg(&slots.stamps).arg(&slots.rows).arg(&sets).arg(&dim).arg(&epoch).arg(out).arg(&stride).arg(hit);
        // SAFETY: argument types and order match cache_lookup; out holds n rows at out_stride.
        unsafe { b.launch(warps_config(n)) }.map_err(cuda_err)?;
        Ok(())
    }

    /// Looks host `keys` up into a device buffer: row i at `offset + i * stride` floats.
    /// Returns the indices that missed (their rows are left as they were).
    pub fn lookup_into(&self, keys: &[i64], rows: &mut DeviceRows, offset: usize, stride: usize) -> Result<Vec<usize>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let need = offset + (keys.len() - 1) * stride + self.geo.dim;
        if rows.len() < need {
            return Err(Error::internal(format!("device rows buffer of {} floats is too small ({need})", rows.len())));
        }
        let s = &self.stream;
        let d_keys = s.clone_htod(keys).map_err(cuda_err)?;
        let mut d_hit = s.alloc_zeros::<u8>(keys.len()).map_err(cuda_err)?;
        let mut view = rows.buf.slice_mut(offset..);
        self.lookup_device(&d_keys, keys.len(), &mut view, stride, &mut d_hit)?;
        let mut hit = vec![0u8; keys.len()];
        s.memcpy_dtoh(&d_hit, &mut hit).map_err(cuda_err)?;
        s.synchronize().map_err(cuda_err)?;
        let missed: Vec<usize> = (0..keys.len()).filter(|&i| hit[i] == 0).collect();
        self.hits.fetch_add((keys.len() - missed.len()) as u64, Ordering::Relaxed);
        self.misses.fetch_add(missed.len() as u64, Ordering::Relaxed);
        Ok(missed)
    }

    fn write(&self, keys: &[i64], vectors: &[f32], only_if_present: bool) -> Result<()> {
        if keys.is_empty() {
            return Ok(());
        }
        if vectors.len() != keys.len() * self.geo.dim {
            return Err(Error::internal("gpu cache: vectors do not match keys"));
        }
        let (order, starts, sets) = group_by_set(&self.geo, keys);
        let epoch = self.clock.fetch_add(1, Ordering::Relaxed);
        let mut slots = self.slots.lock();
        let s = &self.stream;
        let d_keys = s.clone_htod(keys).map_err(cuda_err)?;
        let d_vecs = s.clone_htod(vectors).map_err(cuda_err)?;
        let d_order = s.clone_htod(&order).map_err(cuda_err)?;
        let d_starts = s.clone_htod(&starts).map_err(cuda_err)?;
        let d_sets = s.clone_htod(&sets).map_err(cuda_err)?;
        let (groups, dim, flag) = (sets.len() as i32, self.geo.dim as i32, only_if_present as i32);
        let Slots { keys: sk, stamps, rows, counters } = &mut *slots;
        let mut b = s.launch_builder(&self.dev.insert);
        b.arg(&d_keys).arg(&d_vecs).arg(&d_order).arg(&d_starts).arg(&d_sets).arg(&groups);
        b.arg(sk).arg(stamps).arg(rows).arg(&dim).arg(&epoch).arg(&flag).arg(counters);
        // SAFETY: argument types and order match cache_insert; group arrays come from group_by_set.
        unsafe { b.launch(warps_config(sets.len())) }.map_err(cuda_err)?;
        s.synchronize().map_err(cuda_err)?;
        Ok(())
    }
}

impl CacheTier for GpuCache {
    fn geometry(&self) -> CacheGeometry {
        self.geo
    }

    fn lookup(&self, keys: &[i64], out: &mut [f32]) -> Result<Vec<usize>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let s = &self.stream;
        let d_keys = s.clone_htod(keys).map_err(cuda_err)?;
        let mut d_out = s.alloc_zeros::<f32>(keys.len() * self.geo.dim).map_err(cuda_err)?;
        let mut d_hit = s.alloc_zeros::<u8>(keys.len()).map_err(cuda_err)?;
        let mut view = d_out.slice_mut(..);
        self.lookup_device(&d_keys, keys.len(), &mut view, self.geo.dim, &mut d_hit)?;
        let mut hit = vec![0u8; keys.len()];
        s.memcpy_dtoh(&d_hit, &mut hit).map_err(cuda_err)?;
        s.memcpy_dtoh(&d_out, out).map_err(cuda_err)?;
        s.synchronize().map_err(cuda_err)?;
        let missed: Vec<usize> = (0..keys.len()).filter(|&i| hit[i] == 0).collect();
        self.hits.fetch_add((keys.len() - missed.len()) as u64, Ordering::Relaxed);
        self.misses.fetch_add(missed.len() as u64, Ordering::Relaxed);
        Ok(missed)
    }

    fn insert(&self, keys: &[i64], vectors: &[f32]) -> Result<()> {
        self.write(keys, vectors, false)
    }

    fn refresh(&self, keys: &[i64], vectors: &[f32]) -> Result<()> {
        self.write(keys, vectors, true)
    }

    fn counters(&self) -> CacheCounters {
        let slots = self.slots.lock();
        let mut c = [0u64; 2];
        let ok = self.stream.memcpy_dtoh(&slots.counters, &mut c).is_ok() && self.stream.synchronize().is_ok();
        let (insertions, evictions) = if ok { (c[0], c[1]) } else { (0, 0) };
        CacheCounters::new(self.hits.load(Ordering::Relaxed), self.misses.load(Ordering::Relaxed), insertions, evictions)
    }

    fn name(&self) -> &'static str {
        "gpu_cache"
    }

    fn as_gpu(&self) -> Option<&GpuCache> {
        Some(self)
    }
}

impl Drop for GpuCache {
    fn drop(&mut self) {
        let _ = self.stream.synchronize();
    }
}

/// A buffer of f32 rows in GPU memory that lookups write into (an embedding engine's
/// output on a GPU instance), with the copy-in of rows found below the cache.
pub struct DeviceRows {
    dev: Arc<Device>,
    stream: Arc<CudaStream>,
    buf: CudaSlice<f32>,
}

impl DeviceRows {
    pub fn new(device: i32, len: usize) -> Result<DeviceRows> {
        let dev = self::device(device)?;
        let stream = dev.ctx.new_stream().map_err(cuda_err)?;
        let buf = stream.alloc_zeros::<f32>(len.max(1)).map_err(cuda_err)?;
        Ok(DeviceRows { dev, stream, buf })
    }
    pub fn len(&self) -> usize {
        self.buf.len()
    }
    pub fn is_empty(&self) -> bool {
        self.buf.len() == 0
    }
    /// The buffer's device address (valid while `self` lives).
    pub fn addr(&self) -> u64 {
        let (ptr, _sync) = self.buf.device_ptr(&self.stream);
        ptr
    }
    /// Writes host rows (`dim` floats each) to rows `idx[i]` at `offset + idx[i] * stride`.
    pub fn scatter(&mut self, rows: &[f32], idx: &[usize], dim: usize, offset: usize, stride: usize) -> Result<()> {
        if idx.is_empty() {
            return Ok(());
        }
        let s = &self.stream;
        let d_rows = s.clone_htod(rows).map_err(cuda_err)?;
        let idx32: Vec<i32> = idx.iter().map(|&i| i as i32).collect();
        let d_idx = s.clone_htod(&idx32).map_err(cuda_err)?;
        let (n, stride, dim_i) = (idx.len() as i32, stride as i64, dim as i32);
        let mut view = self.buf.slice_mut(offset..);
        let mut b = s.launch_builder(&self.dev.scatter);
        b.arg(&d_rows).arg(&d_idx).arg(&n).arg(&mut view).arg(&stride).arg(&dim_i);
        // SAFETY: argument types and order match scatter_rows; indices address rows inside the buffer.
        unsafe { b.launch(warps_config(idx.len())) }.map_err(cuda_err)?;
        s.synchronize().map_err(cuda_err)?;
        Ok(())
    }
}

const _: () = assert!(WAYS == 32, "the kernels assume one warp per set");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inserts_are_grouped_by_set_in_order() {
        let geo = CacheGeometry { sets: 7, dim: 1 };
        let keys: Vec<i64> = (0..100).map(|i| i * 13 - 40).collect();
        let (order, starts, sets) = group_by_set(&geo, &keys);
        assert_eq!(order.len(), keys.len());
        assert_eq!(*starts.last().unwrap() as usize, keys.len());
        assert_eq!(starts.len(), sets.len() + 1);
        for g in 0..sets.len() {
            let members = &order[starts[g] as usize..starts[g + 1] as usize];
            assert!(members.windows(2).all(|w| w[0] < w[1]), "keys keep their order within a set");
            assert!(members.iter().all(|&i| geo.set_of(keys[i as usize]) as i64 == sets[g]));
        }
        let mut seen = order.clone();
        seen.sort();
        assert_eq!(seen, (0..100).collect::<Vec<i32>>());
    }

    #[test]
    fn no_gpu_is_a_clear_error() {
        if std::path::Path::new("/dev/nvidia0").exists() {
            return; // this check is for machines without a GPU
        }
        let e = new_cache(0, CacheGeometry { sets: 1, dim: 4 }).err().expect("no GPU here");
        assert!(e.message().contains("CUDA") || e.message().contains("cuda"), "{e}");
    }
}
