//! The GPU embedding cache's device side: its slots (keys, stamps, rows) in device
//! memory and the NVRTC kernels that read and write them. The policy (geometry,
//! epochs, counters of hits and misses, grouping inserts by set) belongs to the store
//! (`triton_rust_embedding::gpu`); this module only runs what it is told on the GPU.
//!
//! A lookup is one warp per key: the 32 lanes read the set's 32 keys at once, a
//! ballot finds the way, and the warp copies the row (float4 when `dim % 4 == 0`).
//! Empty slots hold `EMPTY_KEY`, so a lookup reads only the set's 32 keys (256 bytes
//! of tags for a row of `dim × 4`), never the stamps. One warp handles one set's
//! inserts in order, so two inserts never race for a victim. All of a cache's calls
//! go through its own stream, so a lookup and an insert never overlap.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use cudarc::driver::{
    result, CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg,
};
use parking_lot::Mutex;

use crate::driver::{cuda_err, gpu, real, GpuState};
use crate::mem::{DeviceView, DeviceViewMut};
use crate::{CudaError, Result};

/// Ways per set: the kernels use one warp per set.
pub const WAYS: usize = 32;

/// Fields of a table's descriptor for the whole-batch kernels (see `batch_lookup`).
const DESC: usize = 6;

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

// fp32 -> fp16 bits, rounded to nearest even (PTX cvt: no header needed under NVRTC).
__device__ __forceinline__ unsigned short f2h(float f) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

// A row of floats written as fp16 (a batch lookup whose output is TYPE_FP16).
__device__ __forceinline__ void copy_row(unsigned short* __restrict__ dst, const float* __restrict__ src, int dim, int lane) {
    if ((dim & 3) == 0 && (((size_t)src) & 15) == 0 && (((size_t)dst) & 7) == 0) {
        const float4* s = (const float4*)src; uint2* d = (uint2*)dst;
        for (int j = lane; j < (dim >> 2); j += 32) {
            float4 v = s[j];
            uint2 o;
            o.x = (unsigned)f2h(v.x) | ((unsigned)f2h(v.y) << 16);
            o.y = (unsigned)f2h(v.z) | ((unsigned)f2h(v.w) << 16);
            d[j] = o;
        }
    } else {
        for (int j = lane; j < dim; j += 32) dst[j] = f2h(src[j]);
    }
}

// The way of `key` in a set of 32 (one slot per lane: stamp st, key sk), the same on every
// lane: its own way when present; else -1 when only_if_present, else the least recently
// stamped way (lowest lane on ties), which lane 0 claims for key and counts (an insert, and
// an eviction when the way held a row). Callers in fill and insert share this choice.
__device__ __forceinline__ int way_for(u64 st, i64 sk, i64 key, int lane, int only_if_present,
        i64* slot_keys, u64 set, u64* counters) {
    unsigned hit = __ballot_sync(FULL, st != 0 && sk == key);
    if (hit != 0) return __ffs(hit) - 1;
    if (only_if_present) return -1;
    u64 best = st; int bl = lane;
    for (int off = 16; off > 0; off >>= 1) {
        u64 os = __shfl_down_sync(FULL, best, off);
        int ol = __shfl_down_sync(FULL, bl, off);
        if (os < best || (os == best && ol < bl)) { best = os; bl = ol; }
    }
    int way = __shfl_sync(FULL, bl, 0);
    u64 victim_stamp = __shfl_sync(FULL, best, 0);
    if (lane == 0) {
        atomicAdd(&counters[0], 1ULL);
        if (victim_stamp != 0) atomicAdd(&counters[1], 1ULL);
        slot_keys[set * 32 + way] = key;
    }
    return way;
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

// The whole-batch kernels. Table t's slots are described by desc[t*6 .. t*6+6] = (slot
// keys, slot stamps, slot rows, sets, set locks, counters). Key i belongs to table
// i % tables (interleaved: keys [batch, tables]) or to the t with key_start[t] <= i <
// key_start[t+1] (blocked: table after table); its row lands at out + i * dim either way.
__device__ __forceinline__ int table_of(long long i, int tables, int interleaved, const int* key_start) {
    if (interleaved) return (int)(i % tables);
    int t = 0;
    while (t + 1 < tables && i >= key_start[t + 1]) ++t;
    return t;
}

// One warp per key of keys[first .. first + n] (a launch per piece of the batch, each
// queued as soon as its keys are on the GPU): hits copy their row and stamp the slot;
// misses append their index i in the whole batch to miss[] (order not kept).
// Rows land as O: float, or fp16 bits (unsigned short) for a TYPE_FP16 output.
template <typename O>
__device__ __forceinline__ void batch_lookup_as(const i64* __restrict__ keys, long long first, int n, int tables, int interleaved,
        const int* __restrict__ key_start, const long long* __restrict__ desc, int dim, u64 epoch,
        O* __restrict__ out, int* __restrict__ miss, unsigned* __restrict__ miss_count) {
    long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (warp >= n) return;
    long long i = first + warp;
    int t = table_of(i, tables, interleaved, key_start);
    const i64* slot_keys = (const i64*)desc[t * 6];
    u64* slot_stamps = (u64*)desc[t * 6 + 1];
    const float* rows = (const float*)desc[t * 6 + 2];
    long long sets = desc[t * 6 + 3];
    i64 key = keys[i];
    bool match = false;
    u64 set = 0;
    if (sets > 0 && key != EMPTY_KEY) {
        set = mix64((u64)key) % (u64)sets;
        match = slot_keys[set * 32 + lane] == key;
    }
    unsigned m = __ballot_sync(FULL, match);
    if (m == 0) {
        if (lane == 0) miss[atomicAdd(miss_count, 1u)] = (int)i;
        return;
    }
    int way = __ffs(m) - 1;
    copy_row(out + (size_t)i * dim, rows + (set * 32 + way) * (size_t)dim, dim, lane);
    if (lane == 0) slot_stamps[set * 32 + way] = epoch;
}

extern "C" __global__ void batch_lookup(const i64* __restrict__ keys, long long first, int n, int tables, int interleaved,
        const int* __restrict__ key_start, const long long* __restrict__ desc, int dim, u64 epoch,
        float* __restrict__ out, int* __restrict__ miss, unsigned* __restrict__ miss_count) {
    batch_lookup_as(keys, first, n, tables, interleaved, key_start, desc, dim, epoch, out, miss, miss_count);
}

extern "C" __global__ void batch_lookup_h(const i64* __restrict__ keys, long long first, int n, int tables, int interleaved,
        const int* __restrict__ key_start, const long long* __restrict__ desc, int dim, u64 epoch,
        unsigned short* __restrict__ out, int* __restrict__ miss, unsigned* __restrict__ miss_count) {
    batch_lookup_as(keys, first, n, tables, interleaved, key_start, desc, dim, epoch, out, miss, miss_count);
}

// One warp per missed key of the last batch_lookup: inserts row j (fetched below the
// cache, already on the GPU) for key keys[miss[j]] when found[j]. A set takes at most 32
// of a fill's rows (a ticket per warp; more could not all stay, and warps queueing on one
// lock would hold SMs the network's kernels need). Those warps take the set's lock in
// turn (all lanes spin together, so no lane waits on another), read the set's tags past
// L1, and replace the way holding the key or the least recently stamped one, as
// cache_insert does.
extern "C" __global__ void batch_fill(const i64* __restrict__ keys, const int* __restrict__ miss,
        const unsigned char* __restrict__ found, int m, int tables, int interleaved,
        const int* __restrict__ key_start, const long long* __restrict__ desc, int dim, u64 epoch,
        const float* __restrict__ rows) {
    long long j = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (j >= m || !found[j]) return;
    int i = miss[j];
    int t = table_of(i, tables, interleaved, key_start);
    long long sets = desc[t * 6 + 3];
    i64 key = keys[i];
    if (sets <= 0 || key == EMPTY_KEY) return;
    i64* slot_keys = (i64*)desc[t * 6];
    u64* slot_stamps = (u64*)desc[t * 6 + 1];
    float* slot_rows = (float*)desc[t * 6 + 2];
    unsigned* locks = (unsigned*)desc[t * 6 + 4];
    u64* counters = (u64*)desc[t * 6 + 5];
    u64 set = mix64((u64)key) % (u64)sets;
    unsigned ticket = 0;
    if (lane == 0) ticket = atomicAdd(&locks[sets + set], 1u);
    if (__shfl_sync(FULL, ticket, 0) >= 32u) return;
    for (;;) {
        unsigned got = 0;
        if (lane == 0) got = atomicCAS(&locks[set], 0u, 1u) == 0u;
        if (__shfl_sync(FULL, got, 0)) break;
    }
    __threadfence();
    size_t slot = set * 32 + lane;
    u64 st = __ldcg(&slot_stamps[slot]);
    i64 sk = __ldcg(&slot_keys[slot]);
    int way = way_for(st, sk, key, lane, 0, slot_keys, set, counters);
    copy_row(slot_rows + (set * 32 + way) * (size_t)dim, rows + (size_t)j * dim, dim, lane);
    __syncwarp();
    if (lane == 0) {
        slot_stamps[set * 32 + way] = epoch;
        __threadfence();
        atomicExch(&locks[set], 0u);
    }
}

// One warp per row: writes rows[i] to out + idx[i] * out_stride (rows fetched below the cache).
template <typename O>
__device__ __forceinline__ void scatter_rows_as(const float* __restrict__ rows, const int* __restrict__ idx, int n,
        O* __restrict__ out, long long out_stride, int dim) {
    long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (warp >= n) return;
    copy_row(out + (size_t)idx[warp] * out_stride, rows + (size_t)warp * dim, dim, lane);
}

extern "C" __global__ void scatter_rows(const float* __restrict__ rows, const int* __restrict__ idx, int n,
        float* __restrict__ out, long long out_stride, int dim) {
    scatter_rows_as(rows, idx, n, out, out_stride, dim);
}

extern "C" __global__ void scatter_rows_h(const float* __restrict__ rows, const int* __restrict__ idx, int n,
        unsigned short* __restrict__ out, long long out_stride, int dim) {
    scatter_rows_as(rows, idx, n, out, out_stride, dim);
}

// One thread per missed key: out[j] = keys[idx[j]] (a batch whose keys came in GPU memory
// tells the host which keys missed).
extern "C" __global__ void gather_keys(const i64* __restrict__ keys, const int* __restrict__ idx, int m, i64* __restrict__ out) {
    long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (j < m) out[j] = keys[idx[j]];
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
        int way = way_for(st, sk, key, lane, only_if_present, slot_keys, set, counters);
        if (way < 0) continue;
        copy_row(rows + (set * 32 + way) * (size_t)dim, vecs + (size_t)i * dim, dim, lane);
        __syncwarp();
        if (lane == 0) slot_stamps[set * 32 + way] = epoch;
        __syncwarp();
    }
}
"#;

/// The cache kernels of one device, compiled once.
pub(crate) struct Kernels {
    lookup: CudaFunction,
    insert: CudaFunction,
    scatter: CudaFunction,
    batch: CudaFunction,
    fill: CudaFunction,
    /// `batch` and `scatter` writing fp16 rows.
    batch_h: CudaFunction,
    scatter_h: CudaFunction,
    gather_keys: CudaFunction,
}

fn kernels(g: &GpuState) -> Result<Arc<Kernels>> {
    g.kernels
        .get_or_init(|| {
            // cudarc loads libnvrtc on first use and panics when it is absent.
            catch_unwind(AssertUnwindSafe(|| -> Result<Arc<Kernels>> {
                let ptx = cudarc::nvrtc::compile_ptx(KERNELS)
                    .map_err(|e| CudaError::internal(format!("NVRTC: {e:?}")))?;
                let module = g.ctx.load_module(ptx).map_err(cuda_err)?;
                Ok(Arc::new(Kernels {
                    lookup: module.load_function("cache_lookup").map_err(cuda_err)?,
                    insert: module.load_function("cache_insert").map_err(cuda_err)?,
                    scatter: module.load_function("scatter_rows").map_err(cuda_err)?,
                    batch: module.load_function("batch_lookup").map_err(cuda_err)?,
                    fill: module.load_function("batch_fill").map_err(cuda_err)?,
                    batch_h: module.load_function("batch_lookup_h").map_err(cuda_err)?,
                    scatter_h: module.load_function("scatter_rows_h").map_err(cuda_err)?,
                    gather_keys: module.load_function("gather_keys").map_err(cuda_err)?,
                }))
            }))
            .unwrap_or_else(|p| {
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                Err(CudaError::unavailable(format!(
                    "the GPU embedding cache needs the CUDA driver and NVRTC libraries: {msg}"
                )))
            })
        })
        .clone()
}

/// State of one device and its kernels, or the reason there is none.
fn device(id: i32) -> Result<(Arc<GpuState>, Arc<Kernels>)> {
    let g = gpu(id).map_err(|e| {
        if e.unavailable {
            CudaError::unavailable(format!(
                "the GPU embedding cache needs the CUDA driver and NVRTC libraries: {e}"
            ))
        } else {
            e
        }
    })?;
    let k = kernels(&g)?;
    Ok((g, k))
}

fn warps_config(warps: usize) -> LaunchConfig {
    let threads = warps as u64 * 32;
    let block = 256u64;
    LaunchConfig {
        grid_dim: (threads.div_ceil(block) as u32, 1, 1),
        block_dim: (block as u32, 1, 1),
        shared_mem_bytes: 0,
    }
}

struct Slots {
    keys: CudaSlice<i64>,
    stamps: CudaSlice<u64>,
    rows: CudaSlice<f32>,
    counters: CudaSlice<u64>,
    /// Per set, for `batch_fill`: a lock word (warps of one launch filling one set take
    /// it in turn), then after all sets' locks, a ticket count (how many of this fill's
    /// warps came for the set; only the first WAYS insert).
    locks: CudaSlice<u32>,
}

/// One table's cache slots on one GPU: `sets × WAYS` keys, stamps and rows of `dim`.
pub struct CacheSlots {
    kernels: Arc<Kernels>,
    _gpu: Arc<GpuState>,
    stream: Arc<CudaStream>,
    sets: usize,
    dim: usize,
    slots: Mutex<Slots>,
}

/// Host-side description of an insert: key indices grouped by set (see `cache_insert`).
pub struct InsertPlan<'a> {
    pub order: &'a [i32],
    pub group_start: &'a [i32],
    pub group_set: &'a [i64],
}

/// One instance's GPU work queue: its caches' lookups, fills and refreshes all go
/// through it, in order, so an insert never overlaps a lookup of the same slots.
#[derive(Clone)]
pub struct Queue {
    device: i32,
    stream: Arc<CudaStream>,
}

impl Queue {
    /// Waits for everything queued so far.
    pub(crate) fn wait(&self) -> Result<()> {
        self.stream.synchronize().map_err(cuda_err)
    }
    pub fn new(device: i32) -> Result<Queue> {
        let (g, _) = self::device(device)?;
        Ok(Queue { device, stream: g.new_stream()? })
    }
    pub fn device(&self) -> i32 {
        self.device
    }
}

impl CacheSlots {
    /// Empty slots hold `empty_key`, which must never be inserted. The slots' work goes
    /// through `queue`.
    pub fn new(queue: &Queue, sets: usize, dim: usize, empty_key: i64) -> Result<CacheSlots> {
        let (g, kernels) = self::device(queue.device)?;
        let stream = queue.stream.clone();
        let capacity = sets * WAYS;
        let slots = Slots {
            keys: stream.clone_htod(&vec![empty_key; capacity]).map_err(cuda_err)?,
            stamps: stream.alloc_zeros::<u64>(capacity).map_err(cuda_err)?,
            rows: stream.alloc_zeros::<f32>(capacity * dim).map_err(cuda_err)?,
            counters: stream.alloc_zeros::<u64>(2).map_err(cuda_err)?,
            locks: stream.alloc_zeros::<u32>(2 * sets.max(1)).map_err(cuda_err)?,
        };
        stream.synchronize().map_err(cuda_err)?;
        Ok(CacheSlots { kernels, _gpu: g, stream, sets, dim, slots: Mutex::new(slots) })
    }

    /// The slots' descriptor for [`BatchLookup`]: (keys, stamps, rows, sets, locks,
    /// counters). The addresses stay valid while `self` lives (never reallocated).
    fn raw(&self) -> [i64; DESC] {
        let slots = self.slots.lock();
        let addr = |p: u64| p as i64;
        let (k, _a) = slots.keys.device_ptr(&self.stream);
        let (st, _b) = slots.stamps.device_ptr(&self.stream);
        let (r, _c) = slots.rows.device_ptr(&self.stream);
        let (l, _d) = slots.locks.device_ptr(&self.stream);
        let (c, _e) = slots.counters.device_ptr(&self.stream);
        [addr(k), addr(st), addr(r), self.sets as i64, addr(l), addr(c)]
    }

    pub fn dim(&self) -> usize {
        self.dim
    }

    fn launch_lookup(
        &self,
        keys: &CudaSlice<i64>,
        n: usize,
        out: &mut cudarc::driver::CudaViewMut<'_, f32>,
        out_stride: usize,
        hit: &mut CudaSlice<u8>,
        epoch: u64,
    ) -> Result<()> {
        let slots = self.slots.lock();
        let (n_i, sets, dim, stride) =
            (n as i32, self.sets as i64, self.dim as i32, out_stride as i64);
        let mut b = self.stream.launch_builder(&self.kernels.lookup);
        b.arg(keys)
            .arg(&n_i)
            .arg(&slots.keys)
            .arg(&slots.stamps)
            .arg(&slots.rows)
            .arg(&sets)
            .arg(&dim)
            .arg(&epoch)
            .arg(out)
            .arg(&stride)
            .arg(hit);
        // SAFETY: argument types and order match cache_lookup; out holds n rows at out_stride.
        unsafe { b.launch(warps_config(n)) }.map_err(cuda_err)?;
        Ok(())
    }

    /// Looks host `keys` up into `rows`: row i at `offset + i * stride` floats. Returns
    /// a hit flag per key (rows of misses are left as they were).
    pub fn lookup_into(
        &self,
        keys: &[i64],
        epoch: u64,
        rows: &mut DeviceRows,
        offset: usize,
        stride: usize,
    ) -> Result<Vec<u8>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let need = offset + (keys.len() - 1) * stride + self.dim;
        if rows.len() < need {
            return Err(CudaError::internal(format!(
                "device rows buffer of {} floats is too small ({need})",
                rows.len()
            )));
        }
        let s = &self.stream;
        let d_keys = s.clone_htod(keys).map_err(cuda_err)?;
        let mut d_hit = s.alloc_zeros::<u8>(keys.len()).map_err(cuda_err)?;
        // rows was written on its own stream: finish that first
        rows.stream.synchronize().map_err(cuda_err)?;
        let mut view = rows.buf.slice_mut(offset..);
        self.launch_lookup(&d_keys, keys.len(), &mut view, stride, &mut d_hit, epoch)?;
        let mut hit = vec![0u8; keys.len()];
        s.memcpy_dtoh(&d_hit, &mut hit).map_err(cuda_err)?;
        s.synchronize().map_err(cuda_err)?;
        Ok(hit)
    }

    /// Looks host `keys` up into host `out` (row i at `i * dim`). Returns a hit flag per key.
    pub fn lookup_to_host(&self, keys: &[i64], epoch: u64, out: &mut [f32]) -> Result<Vec<u8>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let s = &self.stream;
        let d_keys = s.clone_htod(keys).map_err(cuda_err)?;
        let mut d_out = s.alloc_zeros::<f32>(keys.len() * self.dim).map_err(cuda_err)?;
        let mut d_hit = s.alloc_zeros::<u8>(keys.len()).map_err(cuda_err)?;
        let mut view = d_out.slice_mut(..);
        self.launch_lookup(&d_keys, keys.len(), &mut view, self.dim, &mut d_hit, epoch)?;
        let mut hit = vec![0u8; keys.len()];
        s.memcpy_dtoh(&d_hit, &mut hit).map_err(cuda_err)?;
        s.memcpy_dtoh(&d_out, out).map_err(cuda_err)?;
        s.synchronize().map_err(cuda_err)?;
        Ok(hit)
    }

    /// Inserts (or, with `only_if_present`, refreshes) rows, set by set as `plan` says.
    pub fn write(
        &self,
        keys: &[i64],
        vectors: &[f32],
        plan: &InsertPlan<'_>,
        epoch: u64,
        only_if_present: bool,
    ) -> Result<()> {
        if keys.is_empty() {
            return Ok(());
        }
        if vectors.len() != keys.len() * self.dim
            || plan.order.len() != keys.len()
            || plan.group_start.len() != plan.group_set.len() + 1
        {
            return Err(CudaError::internal("gpu cache: the insert does not match its keys"));
        }
        let mut slots = self.slots.lock();
        let s = &self.stream;
        let d_keys = s.clone_htod(keys).map_err(cuda_err)?;
        let d_vecs = s.clone_htod(vectors).map_err(cuda_err)?;
        let d_order = s.clone_htod(plan.order).map_err(cuda_err)?;
        let d_starts = s.clone_htod(plan.group_start).map_err(cuda_err)?;
        let d_sets = s.clone_htod(plan.group_set).map_err(cuda_err)?;
        let (groups, dim, flag) =
            (plan.group_set.len() as i32, self.dim as i32, only_if_present as i32);
        let Slots { keys: sk, stamps, rows, counters, .. } = &mut *slots;
        let mut b = s.launch_builder(&self.kernels.insert);
        b.arg(&d_keys).arg(&d_vecs).arg(&d_order).arg(&d_starts).arg(&d_sets).arg(&groups);
        b.arg(sk).arg(stamps).arg(rows).arg(&dim).arg(&epoch).arg(&flag).arg(counters);
        // SAFETY: argument types and order match cache_insert; the plan's sets are < sets.
        unsafe { b.launch(warps_config(plan.group_set.len())) }.map_err(cuda_err)?;
        s.synchronize().map_err(cuda_err)?;
        Ok(())
    }

    /// Launches a lookup of keys already on the GPU into `rows` (row i at `i * stride`
    /// floats) and returns without waiting: the kernel alone, for the hit-path benchmark.
    pub fn launch_resident(
        &self,
        keys: &mut DeviceKeys,
        epoch: u64,
        rows: &mut DeviceRows,
        stride: usize,
    ) -> Result<()> {
        let n = keys.len;
        if n == 0 {
            return Ok(());
        }
        if rows.len() < (n - 1) * stride + self.dim {
            return Err(CudaError::internal("device rows buffer is too small"));
        }
        keys.stream.synchronize().map_err(cuda_err)?;
        rows.stream.synchronize().map_err(cuda_err)?;
        let mut view = rows.buf.slice_mut(..);
        self.launch_lookup(&keys.keys, n, &mut view, stride, &mut keys.hit, epoch)
    }

    /// Waits for everything launched on this cache's stream.
    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().map_err(cuda_err)
    }

    /// The device counters: (insertions, evictions).
    pub fn counters(&self) -> Result<(u64, u64)> {
        let slots = self.slots.lock();
        let mut c = [0u64; 2];
        self.stream.memcpy_dtoh(&slots.counters, &mut c).map_err(cuda_err)?;
        self.stream.synchronize().map_err(cuda_err)?;
        Ok((c[0], c[1]))
    }
}

impl Drop for CacheSlots {
    fn drop(&mut self) {
        let _ = self.stream.synchronize();
    }
}

/// Keys copied to the GPU once, with the hit flags of their last lookup.
pub struct DeviceKeys {
    stream: Arc<CudaStream>,
    keys: CudaSlice<i64>,
    hit: CudaSlice<u8>,
    len: usize,
}

impl DeviceKeys {
    pub fn new(device: i32, keys: &[i64]) -> Result<DeviceKeys> {
        let stream = gpu(device)?.new_stream()?;
        let d_keys = stream.clone_htod(keys).map_err(cuda_err)?;
        let hit = stream.alloc_zeros::<u8>(keys.len().max(1)).map_err(cuda_err)?;
        stream.synchronize().map_err(cuda_err)?;
        Ok(DeviceKeys { stream, keys: d_keys, hit, len: keys.len() })
    }
    /// Hit flag per key of the last lookup.
    pub fn hits(&self) -> Result<Vec<u8>> {
        let mut hit = vec![0u8; self.hit.len()];
        self.stream.memcpy_dtoh(&self.hit, &mut hit).map_err(cuda_err)?;
        self.stream.synchronize().map_err(cuda_err)?;
        hit.truncate(self.len);
        Ok(hit)
    }
}

/// A buffer of f32 rows in GPU memory that lookups write into (an embedding engine's
/// output on a GPU instance), with the copy-in of rows found below the cache.
pub struct DeviceRows {
    device: i32,
    kernels: Arc<Kernels>,
    stream: Arc<CudaStream>,
    buf: CudaSlice<f32>,
}

impl DeviceRows {
    pub fn new(device: i32, len: usize) -> Result<DeviceRows> {
        let (g, kernels) = self::device(device)?;
        let stream = g.new_stream()?;
        let buf = stream.alloc_zeros::<f32>(len.max(1)).map_err(cuda_err)?;
        stream.synchronize().map_err(cuda_err)?;
        Ok(DeviceRows { device, kernels, stream, buf })
    }
    /// Length in floats.
    pub fn len(&self) -> usize {
        self.buf.len()
    }
    pub fn is_empty(&self) -> bool {
        self.buf.len() == 0
    }
    /// The first `floats` floats as a byte view.
    pub fn view(&self, floats: usize) -> Option<DeviceView<'_>> {
        if floats > self.buf.len() {
            return None;
        }
        let (ptr, _sync) = self.buf.device_ptr(&self.stream);
        // SAFETY: our allocation, alive and unwritten while `&self` is borrowed.
        Some(unsafe { DeviceView::from_raw(self.device, ptr, floats * 4) })
    }
    /// Writes host rows (`dim` floats each) to rows `idx[i]` at `offset + idx[i] * stride`.
    pub fn scatter(
        &mut self,
        rows: &[f32],
        idx: &[usize],
        dim: usize,
        offset: usize,
        stride: usize,
    ) -> Result<()> {
        if idx.is_empty() {
            return Ok(());
        }
        if rows.len() != idx.len() * dim {
            return Err(CudaError::internal(
                "device rows: scatter rows do not match their indices",
            ));
        }
        let max = idx.iter().copied().max().unwrap_or(0);
        if offset + max * stride + dim > self.buf.len() {
            return Err(CudaError::internal("device rows: scatter past the end of the buffer"));
        }
        let s = &self.stream;
        let d_rows = s.clone_htod(rows).map_err(cuda_err)?;
        let idx32: Vec<i32> = idx.iter().map(|&i| i as i32).collect();
        let d_idx = s.clone_htod(&idx32).map_err(cuda_err)?;
        let (n, stride, dim_i) = (idx.len() as i32, stride as i64, dim as i32);
        let mut view = self.buf.slice_mut(offset..);
        let mut b = s.launch_builder(&self.kernels.scatter);
        b.arg(&d_rows).arg(&d_idx).arg(&n).arg(&mut view).arg(&stride).arg(&dim_i);
        // SAFETY: argument types and order match scatter_rows; indices were checked against the buffer.
        unsafe { b.launch(warps_config(idx.len())) }.map_err(cuda_err)?;
        s.synchronize().map_err(cuda_err)?;
        Ok(())
    }
}

/// Device memory that grows and is never shrunk (a [`BatchLookup`]'s working buffers).
struct DevBuf {
    device: i32,
    addr: u64,
    bytes: usize,
}

impl DevBuf {
    fn new(device: i32) -> DevBuf {
        DevBuf { device, addr: 0, bytes: 0 }
    }
    /// Makes room for `bytes` (old contents are not kept) and returns the address.
    fn reserve(&mut self, bytes: usize) -> Result<u64> {
        if bytes > self.bytes {
            self.release();
            let want = bytes.next_power_of_two().max(256);
            gpu(self.device)?;
            // SAFETY: a plain allocation in the bound context; freed in `release`.
            self.addr = unsafe { result::malloc_sync(want) }.map_err(cuda_err)?;
            self.bytes = want;
        }
        Ok(self.addr)
    }
    fn release(&mut self) {
        if self.bytes > 0 && gpu(self.device).is_ok() {
            // SAFETY: our allocation, and nothing queued still uses it: `BatchLookup::run`
            // waits for its queue before a buffer can grow while a fill is queued, and
            // `BatchLookup`'s drop waits for it before the buffers go.
            let _ = unsafe { result::free_sync(self.addr) };
        }
        self.addr = 0;
        self.bytes = 0;
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        self.release();
    }
}

/// Page-locked host memory that grows (the copies to and from a [`BatchLookup`]).
pub(crate) struct HostBuf<T: Copy> {
    device: i32,
    ptr: *mut T,
    len: usize,
}

// SAFETY: the buffer is plain memory owned by its `BatchLookup`, used under `&mut`.
unsafe impl<T: Copy> Send for HostBuf<T> {}

impl<T: Copy> HostBuf<T> {
    pub(crate) fn new(device: i32) -> HostBuf<T> {
        HostBuf { device, ptr: std::ptr::null_mut(), len: 0 }
    }
    /// The first `len` elements (contents unspecified after a growth).
    pub(crate) fn slice(&mut self, len: usize) -> Result<&mut [T]> {
        if len > self.len {
            self.release();
            let want = len.next_power_of_two().max(64);
            gpu(self.device)?;
            // SAFETY: a page-locked allocation of `want` elements; freed in `release`.
            let p = unsafe { result::malloc_host(want * std::mem::size_of::<T>(), 0) }
                .map_err(cuda_err)?;
            // zeroed once so the slice never exposes uninitialised memory
            // SAFETY: `p` points to `want * size_of::<T>()` writable bytes.
            unsafe { std::ptr::write_bytes(p as *mut u8, 0, want * std::mem::size_of::<T>()) };
            self.ptr = p as *mut T;
            self.len = want;
        }
        // SAFETY: `ptr` holds `self.len >= len` initialised elements, borrowed mutably via `&mut self`.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr, len) })
    }
    fn release(&mut self) {
        if !self.ptr.is_null() && gpu(self.device).is_ok() {
            // SAFETY: our allocation; no copy into or out of it is in flight (see DevBuf).
            let _ = unsafe { result::free_host(self.ptr as *mut std::ffi::c_void) };
        }
        self.ptr = std::ptr::null_mut();
        self.len = 0;
    }
}

impl<T: Copy> Drop for HostBuf<T> {
    fn drop(&mut self) {
        self.release();
    }
}

/// What [`BatchLookup::run`] calls with the missed indices, their keys (the callee may
/// reorder the two together), the rows to fill, and a flag per row to set when the row was
/// found (rows not found, defaults, are not cached).
pub type FetchMisses<'f, E> =
    dyn FnMut(&mut [i32], &mut [i64], &mut [f32], &mut [u8]) -> std::result::Result<(), E> + 'f;

/// A batch's keys (int64), where the request had them.
#[derive(Debug, Clone, Copy)]
pub enum BatchKeys<'a> {
    Host(&'a [i64]),
    /// In GPU memory (a client's CUDA shared memory, an ensemble step's output), `8 × keys` bytes.
    Device(DeviceView<'a>),
}

impl BatchKeys<'_> {
    pub fn len(&self) -> usize {
        match self {
            BatchKeys::Host(k) => k.len(),
            BatchKeys::Device(v) => v.len() / 8,
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Where one [`BatchLookup::run`] spent its time, in microseconds.
#[derive(Debug, Clone, Copy, Default)]
pub struct BatchTimes {
    pub keys: usize,
    pub misses: usize,
    /// Keys to the GPU, the lookup kernel and the miss count back.
    pub lookup_us: u64,
    /// The miss list back and the caller's reads below the cache.
    pub fetch_us: u64,
    /// The fetched rows to the GPU, the scatter, and the wait for the rows.
    pub scatter_us: u64,
}

/// How a [`BatchLookup`] writes its rows: as the caches hold them (fp32), or as fp16
/// for a network that reads fp16 (half the bytes written, and no cast in the network).
/// The rows read below the cache and the caches themselves stay fp32 either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowFormat {
    F32,
    F16,
}

impl RowFormat {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            RowFormat::F32 => 4,
            RowFormat::F16 => 2,
        }
    }
}

/// Which table each key of a batch belongs to.
#[derive(Debug, Clone, Copy)]
pub enum KeyLayout<'a> {
    /// `[batch, tables]`: key i is table `i % tables`'s.
    Interleaved,
    /// Table after table: `counts[t]` keys of table t.
    Blocked(&'a [usize]),
}

/// One instance's lookup of a whole batch, every table at once: the keys go to the GPU
/// once (from page-locked memory), one kernel serves every hit of every table and lists
/// the misses, the misses come back in one copy, are read below the cache by the
/// caller, go back in one copy and are scattered into place by one more kernel. Rows
/// land in this lookup's own output buffer, or the caller's ([`BatchLookup::run_keys`]),
/// row i at element `i * dim`, as fp32 or fp16 ([`RowFormat`]). The rows read
/// below the cache are already on the GPU afterwards, so [`BatchLookup::fill_last`]
/// inserts them into the caches with one more kernel, queued after the response's rows
/// are complete and never waited for. Every buffer is kept and reused; nothing is
/// allocated per batch once the largest batch was seen, and the queue is waited on twice
/// per batch (after the miss count, and when the rows are in place).
pub struct BatchLookup {
    queue: Queue,
    /// The keys' copies to the GPU, beside the queue's lookups: a piece's lookup waits for
    /// its own copy only, so the next piece's DMA overlaps it.
    upload: Arc<CudaStream>,
    kernels: Arc<Kernels>,
    tables: usize,
    dim: usize,
    format: RowFormat,
    key_upload: KeyUpload,
    /// The last run wrote its rows into the caller's buffer (`run_keys` with an `out`).
    external: bool,
    desc: DevBuf,
    keys: (HostBuf<i64>, DevBuf),
    starts: (HostBuf<i32>, DevBuf),
    miss: (HostBuf<i32>, DevBuf),
    count: (HostBuf<u32>, DevBuf),
    fetched: (HostBuf<f32>, DevBuf),
    found: (HostBuf<u8>, DevBuf),
    /// The missed keys, for the fetcher (gathered on the GPU when the keys came there).
    missed_keys: (HostBuf<i64>, DevBuf),
    out: DevBuf,
    /// The last run's misses, which `fill_last` may insert: (count, interleaved).
    last: Option<(usize, i32)>,
    /// A fill is queued and may still run (buffers it reads must not be freed).
    fill_queued: bool,
    /// The most keys a run has had room for.
    max_keys: usize,
    /// Each cached table's fill tickets (address, sets), zeroed before a fill.
    tickets: Vec<(u64, usize)>,
}

/// How a batch's keys go to the GPU: in pieces of `piece_keys` keys, each piece's DMA and
/// lookup queued as soon as it is in page-locked memory, copied there by up to `threads`
/// tasks, none with fewer than two pieces. The default (1 MiB pieces, up to 8 tasks) is the
/// best `examples/batch_lookup_bench.rs` found on an H100 host for a batch of 65536 × 26 keys
/// (13.6 MB): 0.84 ms for keys and kernel with fp16 rows against 0.87 ms for 2 MiB pieces on
/// 4 tasks, 1.75 ms in one piece, 1.47 ms in 512 KiB pieces
/// (`bench/gpu/results/recsys_h100/nov23c_ab1/batch_lookup_bench.log`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyUpload {
    pub piece_keys: usize,
    pub threads: usize,
}

impl Default for KeyUpload {
    fn default() -> KeyUpload {
        KeyUpload { piece_keys: 128 << 10, threads: 8 }
    }
}

impl KeyUpload {
    /// Keys per task for a batch of `n` keys: whole pieces.
    fn part(self, n: usize) -> usize {
        let piece = self.piece_keys.max(1);
        let threads = (n / (2 * piece)).clamp(1, self.threads.max(1));
        n.div_ceil(threads).next_multiple_of(piece)
    }
}

pub(crate) fn htod<T: Copy>(queue: &Queue, dst: u64, src: &[T]) -> Result<()> {
    // SAFETY (callers): `dst` has room for `src`; `src` is page-locked and outlives the
    // queue's next synchronisation, which every caller reaches before touching it again.
    unsafe { result::memcpy_htod_async(dst, src, queue.stream.cu_stream()) }.map_err(cuda_err)
}

fn dtoh<T: Copy>(queue: &Queue, dst: &mut [T], src: u64) -> Result<()> {
    // SAFETY (callers): `src` holds `dst.len()` elements; `dst` is page-locked and is
    // read only after the queue is synchronised.
    unsafe { result::memcpy_dtoh_async(dst, src, queue.stream.cu_stream()) }.map_err(cuda_err)
}

impl BatchLookup {
    /// A lookup over `caches` (one per table, `None` for a table without a cache), all on
    /// `queue`, every table of dim `dim`, its rows written as `format`.
    pub fn new(
        queue: &Queue,
        caches: &[Option<&CacheSlots>],
        dim: usize,
        format: RowFormat,
    ) -> Result<BatchLookup> {
        let (_, kernels) = self::device(queue.device)?;
        let d = queue.device;
        if let Some(c) = caches.iter().flatten().find(|c| c.dim != dim) {
            return Err(CudaError::internal(format!(
                "batch lookup: a cache of dim {} in a lookup of dim {dim}",
                c.dim
            )));
        }
        let table_desc: Vec<i64> =
            caches.iter().flat_map(|c| c.map_or([0; DESC], |c| c.raw())).collect();
        let tickets = table_desc
            .chunks(DESC)
            .filter(|d| d[3] > 0)
            .map(|d| (d[4] as u64 + d[3] as u64 * 4, d[3] as usize))
            .collect();
        let mut desc = DevBuf::new(d);
        let at = desc.reserve(table_desc.len().max(1) * 8)?;
        gpu(d)?;
        // SAFETY: `desc` has room for the table descriptors; a synchronous copy.
        unsafe { result::memcpy_htod_sync(at, &table_desc) }.map_err(cuda_err)?;
        Ok(BatchLookup {
            queue: queue.clone(),
            upload: queue.stream.fork().map_err(cuda_err)?,
            kernels,
            tables: caches.len(),
            dim,
            format,
            key_upload: KeyUpload::default(),
            external: false,
            desc,
            keys: (HostBuf::new(d), DevBuf::new(d)),
            starts: (HostBuf::new(d), DevBuf::new(d)),
            miss: (HostBuf::new(d), DevBuf::new(d)),
            count: (HostBuf::new(d), DevBuf::new(d)),
            fetched: (HostBuf::new(d), DevBuf::new(d)),
            found: (HostBuf::new(d), DevBuf::new(d)),
            missed_keys: (HostBuf::new(d), DevBuf::new(d)),
            out: DevBuf::new(d),
            last: None,
            fill_queued: false,
            max_keys: 0,
            tickets,
        })
    }

    pub fn dim(&self) -> usize {
        self.dim
    }

    /// How the next runs send their keys to the GPU.
    pub fn set_key_upload(&mut self, how: KeyUpload) {
        self.key_upload = how;
    }

    /// Looks `keys` up (table of each key as `layout` says), stamping hits with `epoch`.
    /// `fetch(missed, rows, found)` is given the indices that missed, in no particular
    /// order (it may reorder them), a page-locked buffer of `missed.len() * dim` floats to
    /// fill with their rows (row j for `missed[j]` as it leaves them), and a flag per row
    /// to set when the row is worth caching. Returns when every row is in place in
    /// [`BatchLookup::rows`].
    pub fn run<E: From<CudaError>>(
        &mut self,
        keys: &[i64],
        layout: KeyLayout<'_>,
        epoch: u64,
        fetch: &mut FetchMisses<'_, E>,
    ) -> std::result::Result<BatchTimes, E> {
        self.run_to(BatchKeys::Host(keys), layout, epoch, fetch, None)
    }

    /// As [`BatchLookup::run`] for keys on the host or already in GPU memory (on this
    /// lookup's GPU: one copy on the GPU instead of the trip from the host, the missed keys
    /// gathered there for the fetcher), the rows written into `out` when given (on this
    /// lookup's GPU, room for every row) instead of the lookup's own buffer;
    /// [`BatchLookup::rows`] then has none.
    pub fn run_keys<E: From<CudaError>>(
        &mut self,
        keys: BatchKeys<'_>,
        layout: KeyLayout<'_>,
        epoch: u64,
        fetch: &mut FetchMisses<'_, E>,
        out: Option<&mut DeviceViewMut<'_>>,
    ) -> std::result::Result<BatchTimes, E> {
        if let BatchKeys::Device(v) = &keys {
            if v.device() != self.queue.device || v.len() % 8 != 0 {
                return Err(CudaError::internal(format!(
                    "batch lookup: {} bytes of keys on GPU {} for a lookup on GPU {}",
                    v.len(),
                    v.device(),
                    self.queue.device
                ))
                .into());
            }
        }
        let into = match out {
            Some(o) => Some(self.check_out(keys.len(), o)?),
            None => None,
        };
        self.run_to(keys, layout, epoch, fetch, into)
    }

    /// The address of `out` when it has room for the rows of `n` keys on this lookup's GPU.
    fn check_out(&self, n: usize, out: &mut DeviceViewMut<'_>) -> Result<u64> {
        let need = n * self.dim * self.format.size();
        if out.device() != self.queue.device || out.len() < need {
            return Err(CudaError::internal(format!(
                "batch lookup: an output of {} bytes on GPU {} for {need} bytes of rows on GPU {}",
                out.len(),
                out.device(),
                self.queue.device
            )));
        }
        out.raw_addr().ok_or_else(|| CudaError::internal("batch lookup: a simulated output buffer"))
    }

    fn run_to<E: From<CudaError>>(
        &mut self,
        keys: BatchKeys<'_>,
        layout: KeyLayout<'_>,
        epoch: u64,
        fetch: &mut FetchMisses<'_, E>,
        into: Option<u64>,
    ) -> std::result::Result<BatchTimes, E> {
        let n = keys.len();
        self.external = into.is_some();
        let mut times = BatchTimes { keys: n, ..BatchTimes::default() };
        if n == 0 {
            return Ok(times);
        }
        let t0 = std::time::Instant::now();
        let us = |t: std::time::Instant| t.elapsed().as_micros() as u64;
        if n > i32::MAX as usize {
            return Err(
                CudaError::internal("batch lookup: more than 2^31 keys in one batch").into()
            );
        }
        let (q, dim) = (self.queue.clone(), self.dim);
        gpu(q.device)?;
        self.last = None;
        if self.fill_queued && n > self.max_keys {
            // buffers are about to grow (be freed): the queued fill reads them
            q.stream.synchronize().map_err(cuda_err)?;
        }
        self.fill_queued = false;
        self.max_keys = self.max_keys.max(n);
        let out = match into {
            Some(addr) => addr,
            None => self.out.reserve(n * dim * self.format.size())?,
        };
        let d_keys = self.keys.1.reserve(n * 8)?;
        let (interleaved, d_starts) = match layout {
            KeyLayout::Interleaved => {
                if self.tables == 0 || n % self.tables != 0 {
                    return Err(CudaError::internal(format!(
                        "batch lookup: {n} keys are not whole rows of {} tables",
                        self.tables
                    ))
                    .into());
                }
                (1i32, self.starts.1.reserve(8)?)
            }
            KeyLayout::Blocked(counts) => {
                if counts.len() != self.tables || counts.iter().sum::<usize>() != n {
                    return Err(CudaError::internal(
                        "batch lookup: the per-table counts do not match the keys",
                    )
                    .into());
                }
                let h = self.starts.0.slice(counts.len() + 1)?;
                h[0] = 0;
                for (t, c) in counts.iter().enumerate() {
                    h[t + 1] = h[t] + *c as i32;
                }
                let d = self.starts.1.reserve(h.len() * 4)?;
                htod(&q, d, h)?;
                (0i32, d)
            }
        };
        let d_miss = self.miss.1.reserve(n * 4)?;
        let d_count = self.count.1.reserve(4)?;
        // SAFETY: `d_count` holds at least 4 bytes.
        unsafe { result::memset_d8_async(d_count, 0, 4, q.stream.cu_stream()) }
            .map_err(cuda_err)?;
        let (tables, dim_i, desc) = (self.tables as i32, dim as i32, self.desc.addr);
        let kernel =
            if self.format == RowFormat::F16 { &self.kernels.batch_h } else { &self.kernels.batch };
        let up = &self.upload;
        let piece_keys = self.key_upload.piece_keys.max(1);
        // the keys' buffer is overwritten only after the queue's earlier work (a fill) read it
        up.join(&q.stream).map_err(cuda_err)?;
        // The keys go up in pieces, each looked up as soon as it is on the GPU, so copying
        // the next piece into page-locked memory and its DMA overlap the last one's lookup.
        let piece = |first: usize, keys: &[i64], pinned: &mut [i64]| -> Result<()> {
            for (j, (from, to)) in
                keys.chunks(piece_keys).zip(pinned.chunks_mut(piece_keys)).enumerate()
            {
                to.copy_from_slice(from);
                let at = first + j * piece_keys;
                // SAFETY: `d_keys` has room for n keys; `to` is page-locked and not written
                // again before the queue's synchronisation below, which follows this copy
                // (the lookup of this piece waits for it).
                unsafe {
                    result::memcpy_htod_async(d_keys + (at * 8) as u64, &*to, up.cu_stream())
                }
                .map_err(cuda_err)?;
                q.stream.wait(&up.record_event(None).map_err(cuda_err)?).map_err(cuda_err)?;
                let (at_i, len_i) = (at as i64, to.len() as i32);
                let mut b = q.stream.launch_builder(kernel);
                b.arg(&d_keys)
                    .arg(&at_i)
                    .arg(&len_i)
                    .arg(&tables)
                    .arg(&interleaved)
                    .arg(&d_starts)
                    .arg(&desc)
                    .arg(&dim_i)
                    .arg(&epoch);
                b.arg(&out).arg(&d_miss).arg(&d_count);
                // SAFETY: argument types and order match batch_lookup; this stream waits for
                // the copy of keys[at .. at + len] queued just before; every buffer was sized
                // above for n keys and n rows, and the descriptors name live cache slots.
                unsafe { b.launch(warps_config(to.len())) }.map_err(cuda_err)?;
            }
            Ok(())
        };
        let sent = match keys {
            BatchKeys::Host(keys) => {
                let h_keys = self.keys.0.slice(n)?;
                crate::upload::in_parts(q.device, self.key_upload.part(n), keys, h_keys, &piece)
            }
            BatchKeys::Device(v) => (|| -> Result<()> {
                let src = real(v.raw_addr())?;
                // SAFETY: `d_keys` has room for n keys; `src` holds them (checked by
                // `run_keys`) and stays valid through this call, which waits on the queue
                // below; the copy is ordered before this run's kernel and any later fill.
                unsafe { result::memcpy_dtod_async(d_keys, src, n * 8, q.stream.cu_stream()) }
                    .map_err(cuda_err)?;
                let (at_i, len_i) = (0i64, n as i32);
                let mut b = q.stream.launch_builder(kernel);
                b.arg(&d_keys)
                    .arg(&at_i)
                    .arg(&len_i)
                    .arg(&tables)
                    .arg(&interleaved)
                    .arg(&d_starts)
                    .arg(&desc)
                    .arg(&dim_i)
                    .arg(&epoch);
                b.arg(&out).arg(&d_miss).arg(&d_count);
                // SAFETY: as for a piece above, the whole batch at once, behind its copy on this stream.
                unsafe { b.launch(warps_config(n)) }.map_err(cuda_err)?;
                Ok(())
            })(),
        };
        if sent.is_err() {
            // nothing queued may still read the page-locked keys when the next run rewrites them
            let _ = up.synchronize();
            let _ = q.stream.synchronize();
        }
        sent?;
        let h_count = self.count.0.slice(1)?;
        dtoh(&q, h_count, d_count)?;
        q.stream.synchronize().map_err(cuda_err)?;
        let m = (h_count[0] as usize).min(n);
        times.misses = m;
        times.lookup_us = us(t0);
        let t1 = std::time::Instant::now();
        if m > 0 {
            let h_miss = self.miss.0.slice(m)?;
            dtoh(&q, h_miss, d_miss)?;
            q.stream.synchronize().map_err(cuda_err)?;
            let h_mkeys = self.missed_keys.0.slice(m)?;
            match keys {
                BatchKeys::Host(keys) => {
                    for (k, &i) in h_mkeys.iter_mut().zip(h_miss.iter()) {
                        *k = keys[i as usize];
                    }
                }
                BatchKeys::Device(_) => {
                    let d_mkeys = self.missed_keys.1.reserve(m * 8)?;
                    let m_i = m as i32;
                    let mut b = q.stream.launch_builder(&self.kernels.gather_keys);
                    b.arg(&d_keys).arg(&d_miss).arg(&m_i).arg(&d_mkeys);
                    let cfg = LaunchConfig {
                        grid_dim: ((m as u32).div_ceil(256), 1, 1),
                        block_dim: (256, 1, 1),
                        shared_mem_bytes: 0,
                    };
                    // SAFETY: argument types and order match gather_keys; the m indices in
                    // `d_miss` are < n, `d_keys` holds n keys and `d_mkeys` room for m.
                    unsafe { b.launch(cfg) }.map_err(cuda_err)?;
                    dtoh(&q, h_mkeys, d_mkeys)?;
                    q.stream.synchronize().map_err(cuda_err)?;
                }
            }
            let rows = self.fetched.0.slice(m * dim)?;
            let found = self.found.0.slice(m)?;
            found.fill(0);
            fetch(h_miss, h_mkeys, rows, found)?;
            times.fetch_us = us(t1);
            let d_rows = self.fetched.1.reserve(m * dim * 4)?;
            htod(&q, d_rows, rows)?;
            let d_found = self.found.1.reserve(m)?;
            htod(&q, d_found, found)?;
            // the miss list, in the fetcher's order, goes back as the scatter's indices
            htod(&q, d_miss, h_miss)?;
            let (m_i, stride, dim_i) = (m as i32, dim as i64, dim as i32);
            let scatter = if self.format == RowFormat::F16 {
                &self.kernels.scatter_h
            } else {
                &self.kernels.scatter
            };
            let mut b = q.stream.launch_builder(scatter);
            b.arg(&d_rows).arg(&d_miss).arg(&m_i).arg(&out).arg(&stride).arg(&dim_i);
            // SAFETY: argument types and order match scatter_rows(_h) (`out` by address,
            // rows of `format`); every index is < n.
            unsafe { b.launch(warps_config(m)) }.map_err(cuda_err)?;
            self.last = Some((m, interleaved));
        }
        q.stream.synchronize().map_err(cuda_err)?;
        times.scatter_us = us(t1).saturating_sub(times.fetch_us);
        Ok(times)
    }

    /// Queues the insertion of the last run's rows found below the cache into the caches
    /// (stamped with `epoch`) and returns without waiting: the next run's work queues
    /// behind it. At most once per run; nothing to do when the last run had no misses.
    pub fn fill_last(&mut self, epoch: u64) -> Result<()> {
        let Some((m, interleaved)) = self.last.take() else { return Ok(()) };
        let q = self.queue.clone();
        gpu(q.device)?;
        let (keys, miss, found, starts, rows) = (
            self.keys.1.addr,
            self.miss.1.addr,
            self.found.1.addr,
            self.starts.1.addr,
            self.fetched.1.addr,
        );
        let (m_i, tables, dim_i, desc) =
            (m as i32, self.tables as i32, self.dim as i32, self.desc.addr);
        for &(addr, sets) in &self.tickets {
            // SAFETY: `addr` is the ticket half of a live cache's lock array, `sets` words.
            unsafe { result::memset_d8_async(addr, 0, sets * 4, q.stream.cu_stream()) }
                .map_err(cuda_err)?;
        }
        let mut b = q.stream.launch_builder(&self.kernels.fill);
        b.arg(&keys)
            .arg(&miss)
            .arg(&found)
            .arg(&m_i)
            .arg(&tables)
            .arg(&interleaved)
            .arg(&starts)
            .arg(&desc)
            .arg(&dim_i)
            .arg(&epoch)
            .arg(&rows);
        // SAFETY: argument types and order match batch_fill; the buffers hold the last
        // run's keys, misses, flags and rows (m of each), untouched since, and stay
        // allocated until the queue has passed this kernel (see `run` and `Drop`).
        unsafe { b.launch(warps_config(m)) }.map_err(cuda_err)?;
        self.fill_queued = true;
        Ok(())
    }

    /// The first `elements` elements of the output (of `format`), as bytes (valid until the next run).
    pub fn rows(&self, elements: usize) -> Option<DeviceView<'_>> {
        let bytes = elements * self.format.size();
        if self.external || bytes > self.out.bytes {
            return None;
        }
        // SAFETY: our allocation, complete (run synchronised) and only written through `&mut self`.
        Some(unsafe { DeviceView::from_raw(self.queue.device, self.out.addr, bytes) })
    }
}

impl Drop for BatchLookup {
    fn drop(&mut self) {
        // a queued fill may still read the buffers freed below
        if gpu(self.queue.device).is_ok() {
            let _ = self.queue.stream.synchronize();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_uploads_split_into_whole_pieces_over_at_most_the_tasks_set() {
        for how in [KeyUpload::default(), KeyUpload { piece_keys: 256 << 10, threads: 4 }] {
            let piece = how.piece_keys;
            for n in [1, 1000, piece, 2 * piece - 1, 2 * piece, 65536 * 26, 131072 * 26, 50_000_000]
            {
                let per = how.part(n);
                let threads = n.div_ceil(per);
                assert!(
                    per % piece == 0 && (1..=how.threads).contains(&threads),
                    "{how:?} n {n}: {per} keys per thread"
                );
                assert_eq!(
                    threads == 1,
                    n < 4 * piece,
                    "{how:?} n {n}: one thread below two pieces per thread"
                );
            }
        }
        assert_eq!(
            KeyUpload::default(),
            KeyUpload { piece_keys: 128 << 10, threads: 8 },
            "1 MiB pieces on up to 8 tasks, as measured"
        );
        let coarser = KeyUpload { piece_keys: 256 << 10, threads: 4 };
        assert_eq!((65536 * 26_usize).div_ceil(coarser.part(65536 * 26)), 3);
        assert_eq!(
            (65536 * 26_usize).div_ceil(KeyUpload::default().part(65536 * 26)),
            5,
            "1 MiB pieces: five tasks of three pieces, the last of what is left"
        );
        assert_eq!(
            KeyUpload { piece_keys: 0, threads: 0 }.part(10),
            10,
            "nonsense settings still cover the keys"
        );
    }
}
