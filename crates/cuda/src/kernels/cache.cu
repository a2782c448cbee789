// The GPU embedding cache's kernels (see src/cache/mod.rs for what each does and why),
// compiled at run time by NVRTC (src/kernels.rs) once per device.
typedef long long i64;
typedef unsigned long long u64;
#define FULL 0xffffffffu
#define EMPTY_KEY ((i64)0x8000000000000000ULL)
#define DESC 11  // fields of a table's descriptor (src/cache/slots.rs DESC)

__device__ __forceinline__ u64 mix64(u64 k) {
    k ^= k >> 33; k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33; k *= 0xc4ceb9fe1a85ec53ULL;
    k ^= k >> 33; return k;
}

// The set of `key` among `sets` (> 0): the high 64 bits of its hash times `sets`, as even as
// `% sets` with a multiply for a 64-bit division (src/cache.rs `CacheGeometry::set_of` too).
__device__ __forceinline__ u64 set_of(i64 key, long long sets) {
    return __umul64hi(mix64((u64)key), (u64)sets);
}

// A row copied by `lanes` lanes of a warp (lane: this one's place among them).
__device__ __forceinline__ void copy_row(float* __restrict__ dst, const float* __restrict__ src, int dim, int lane, int lanes = 32) {
    if ((dim & 3) == 0 && ((((size_t)dst) | ((size_t)src)) & 15) == 0) {
        const float4* s = (const float4*)src; float4* d = (float4*)dst;
        for (int j = lane; j < (dim >> 2); j += lanes) d[j] = s[j];
    } else {
        for (int j = lane; j < dim; j += lanes) dst[j] = src[j];
    }
}

// fp32 -> fp16 bits, rounded to nearest even (PTX cvt: no header needed under NVRTC).
__device__ __forceinline__ unsigned short f2h(float f) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

// One element written as its row's type: fp32 as is, fp16 rounded to nearest even.
__device__ __forceinline__ void set_value(float* d, float v) { *d = v; }
__device__ __forceinline__ void set_value(unsigned short* d, float v) { *d = f2h(v); }

// A row of floats written as fp16 (a batch lookup whose output is TYPE_FP16).
__device__ __forceinline__ void copy_row(unsigned short* __restrict__ dst, const float* __restrict__ src, int dim, int lane, int lanes = 32) {
    if ((dim & 3) == 0 && (((size_t)src) & 15) == 0 && (((size_t)dst) & 7) == 0) {
        const float4* s = (const float4*)src; uint2* d = (uint2*)dst;
        for (int j = lane; j < (dim >> 2); j += lanes) {
            float4 v = s[j];
            uint2 o;
            o.x = (unsigned)f2h(v.x) | ((unsigned)f2h(v.y) << 16);
            o.y = (unsigned)f2h(v.z) | ((unsigned)f2h(v.w) << 16);
            d[j] = o;
        }
    } else {
        for (int j = lane; j < dim; j += lanes) dst[j] = f2h(src[j]);
    }
}

// fp16 bits -> fp32 (exact).
__device__ __forceinline__ float h2f(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

// A row kept as fp16 (a cache whose rows are fp16) copied as it is: 16 bytes a lane.
__device__ __forceinline__ void copy_row(unsigned short* __restrict__ dst, const unsigned short* __restrict__ src, int dim, int lane, int lanes = 32) {
    if ((dim & 7) == 0 && ((((size_t)dst) | ((size_t)src)) & 15) == 0) {
        const uint4* s = (const uint4*)src; uint4* d = (uint4*)dst;
        for (int j = lane; j < (dim >> 3); j += lanes) d[j] = s[j];
    } else {
        for (int j = lane; j < dim; j += lanes) dst[j] = src[j];
    }
}

// A row kept as fp16 written as floats.
__device__ __forceinline__ void copy_row(float* __restrict__ dst, const unsigned short* __restrict__ src, int dim, int lane, int lanes = 32) {
    if ((dim & 3) == 0 && (((size_t)src) & 7) == 0 && (((size_t)dst) & 15) == 0) {
        const uint2* s = (const uint2*)src; float4* d = (float4*)dst;
        for (int j = lane; j < (dim >> 2); j += lanes) {
            uint2 v = s[j];
            float4 o;
            o.x = h2f((unsigned short)(v.x & 0xffffu)); o.y = h2f((unsigned short)(v.x >> 16));
            o.z = h2f((unsigned short)(v.y & 0xffffu)); o.w = h2f((unsigned short)(v.y >> 16));
            d[j] = o;
        }
    } else {
        for (int j = lane; j < dim; j += lanes) dst[j] = h2f(src[j]);
    }
}

// LFU (src/cache/slots.rs: a sketch of 2 rows of `width` counters, a power of two). An insert
// counts all its keys' misses first (sketch_add, one kernel), then places them reading each
// key's count (sketch_read: the least of its counters), so the counts are the same in whatever
// order the warps run, and the same as HostCache's (CachePolicy::sketch_index).
__device__ __forceinline__ unsigned* sketch_at(unsigned* sketch, long long width, i64 key, int r) {
    u64 seed = 0x9e3779b97f4a7c15ULL * (u64)(r + 1);
    return sketch + (size_t)r * width + (mix64((u64)key ^ seed) & (u64)(width - 1));
}

// `amount` more misses of key (saturating).
__device__ __forceinline__ void sketch_add(unsigned* sketch, long long width, i64 key, unsigned amount = 1u) {
    for (int r = 0; r < 2; ++r) {
        unsigned* c = sketch_at(sketch, width, key, r);
        unsigned old = *c, was;
        do {  // saturating
            was = old;
            if (was == 0xffffffffu) break;
            unsigned next = was > 0xffffffffu - amount ? 0xffffffffu : was + amount;
            old = atomicCAS(c, was, next);
        } while (old != was);
    }
}

__device__ __forceinline__ u64 sketch_read(unsigned* sketch, long long width, i64 key) {
    unsigned a = __ldcg(sketch_at(sketch, width, key, 0)), b = __ldcg(sketch_at(sketch, width, key, 1));
    return (u64)(a < b ? a : b);
}

// One thread per key of a one-table insert (cache_insert after it): its miss counted.
extern "C" __global__ void sketch_count(const i64* __restrict__ keys, int n, unsigned* __restrict__ sketch, long long width) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && keys[i] != EMPTY_KEY) sketch_add(sketch, width, keys[i]);
}

// The stamp a written way gets: LRU the epoch; LFU a new key its sketched count, a key already
// there the higher of its count and that (a refresh leaves it).
__device__ __forceinline__ u64 next_stamp(int fresh, u64 old, u64 count, u64 epoch, int lfu, int only_if_present) {
    if (!lfu) return epoch;
    if (fresh) return count;
    if (only_if_present) return old;
    return count > old ? count : old;
}

// The way of `key` in a set of 32 (one slot per lane: stamp st, key sk), the same on every
// lane: its own way when present (*fresh 0); else -1 when only_if_present; else the way with
// the lowest stamp (lowest lane on ties: LRU's least recent, LFU's least frequent). LFU
// (count > 0, the key's sketched misses) gives it up only to a key counted more often than
// it (else -1). Lane 0 claims the way for key and counts an insert, and an eviction when the
// way held a row; *fresh 1. Callers in fill and insert share this choice. A key index (index,
// keys 0 .. irows - 1; probe.cu) gets the slot of a key found or placed.
__device__ __forceinline__ int way_for(u64 st, i64 sk, i64 key, int lane, int only_if_present,
        u64 count, i64* slot_keys, u64 set, u64* counters, int* fresh, unsigned* index, long long irows) {
    unsigned hit = __ballot_sync(FULL, st != 0 && sk == key);
    *fresh = 0;
    bool indexed = lane == 0 && index != 0 && key >= 0 && key < irows;
    if (hit != 0) {
        if (indexed) index[key] = (unsigned)(set * 32 + __ffs(hit) - 1);
        return __ffs(hit) - 1;
    }
    if (only_if_present) return -1;
    u64 best = st; int bl = lane;
    for (int off = 16; off > 0; off >>= 1) {
        u64 os = __shfl_down_sync(FULL, best, off);
        int ol = __shfl_down_sync(FULL, bl, off);
        if (os < best || (os == best && ol < bl)) { best = os; bl = ol; }
    }
    int way = __shfl_sync(FULL, bl, 0);
    u64 victim_stamp = __shfl_sync(FULL, best, 0);
    if (count != 0 && victim_stamp != 0 && count <= victim_stamp) return -1;
    *fresh = 1;
    if (lane == 0) {
        atomicAdd(&counters[0], 1ULL);
        if (victim_stamp != 0) atomicAdd(&counters[1], 1ULL);
        slot_keys[set * 32 + way] = key;
        if (indexed) index[key] = (unsigned)(set * 32 + way);
    }
    return way;
}

// One warp per key: hits copy their row to out and stamp the slot with epoch. Rows are
// kept as S: float, or fp16 bits (unsigned short) in a cache whose rows are fp16.
template <typename S>
__device__ __forceinline__ void cache_lookup_as(const i64* __restrict__ keys, int n,
        const i64* __restrict__ slot_keys, u64* __restrict__ slot_stamps,
        const S* __restrict__ rows, long long sets, int dim, u64 epoch, int lfu,
        float* __restrict__ out, long long out_stride, unsigned char* __restrict__ hit) {
    long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (warp >= n) return;
    i64 key = keys[warp];
    if (sets < 0) {  // a resident table (-sets rows): row `key`, no tags, no stamps
        bool in = key >= 0 && key < -sets;
        if (in) copy_row(out + (size_t)warp * out_stride, rows + (size_t)key * dim, dim, lane);
        if (lane == 0) hit[warp] = in ? 1 : 0;
        return;
    }
    u64 set = set_of(key, sets);
    size_t slot = set * 32 + lane;
    // Empty slots hold EMPTY_KEY, which is never inserted: only the tags are read.
    bool match = key != EMPTY_KEY && slot_keys[slot] == key;
    unsigned m = __ballot_sync(FULL, match);
    if (m == 0) { if (lane == 0) hit[warp] = 0; return; }
    int way = __ffs(m) - 1;
    copy_row(out + (size_t)warp * out_stride, rows + (set * 32 + way) * (size_t)dim, dim, lane);
    if (lane == 0) {
        hit[warp] = 1;
        if (lfu) atomicAdd(&slot_stamps[set * 32 + way], 1ULL);
        else slot_stamps[set * 32 + way] = epoch;
    }
}

extern "C" __global__ void cache_lookup(const i64* __restrict__ keys, int n,
        const i64* __restrict__ slot_keys, u64* __restrict__ slot_stamps,
        const float* __restrict__ rows, long long sets, int dim, u64 epoch, int lfu,
        float* __restrict__ out, long long out_stride, unsigned char* __restrict__ hit) {
    cache_lookup_as(keys, n, slot_keys, slot_stamps, rows, sets, dim, epoch, lfu, out, out_stride, hit);
}

extern "C" __global__ void cache_lookup_s16(const i64* __restrict__ keys, int n,
        const i64* __restrict__ slot_keys, u64* __restrict__ slot_stamps,
        const unsigned short* __restrict__ rows, long long sets, int dim, u64 epoch, int lfu,
        float* __restrict__ out, long long out_stride, unsigned char* __restrict__ hit) {
    cache_lookup_as(keys, n, slot_keys, slot_stamps, rows, sets, dim, epoch, lfu, out, out_stride, hit);
}

// The whole-batch kernels. Table t's slots are described by desc[t*DESC .. t*DESC+DESC] =
// (slot keys, slot stamps, slot rows, sets, set locks, counters, LFU sketch or 0 under LRU,
// the sketch's width, the key index or 0, the keys it covers, the probes' hit stamp rate: see
// probe.cu); a resident table (every row on the GPU, row = key) says -rows for sets
// and has no keys, stamps, locks or sketch. Key i belongs to table
// i % tables (interleaved > 0: keys [batch, tables]), to the t with key_start[t] <= i <
// key_start[t+1] (interleaved 0, blocked: table after table), or, for fixed hotness (interleaved
// = -width: keys [batch, width] as sent), to key_start[tables + 1 + i % width], each place's table
// put after the starts (src/cache/batch.rs `place_layout`). Its row lands at out + i * dim in every
// layout. A batch's keys are counted in int (0 <= i < 2^31): 32-bit remainders.
__device__ __forceinline__ int table_of(long long i, int tables, int interleaved, const int* key_start) {
    if (interleaved > 0) return (int)((unsigned)i % (unsigned)tables);
    if (interleaved < 0) return key_start[tables + 1 + (unsigned)i % (unsigned)(-interleaved)];
    int t = 0;
    while (t + 1 < tables && i >= key_start[t + 1]) ++t;
    return t;
}

// LOOKUP_LANES lanes a key of keys[first .. first + n], so 32 / LOOKUP_LANES keys a warp (a
// launch per piece of the batch, each queued as soon as its keys are on the GPU): each lane
// of a key's group reads 32 / LOOKUP_LANES of the set's 32 tags, 16 bytes at a time, so a
// warp keeps several keys' reads in flight; hits copy their row and stamp the slot (the lowest
// matching way, as cache_lookup takes); misses append their index i in the whole batch to
// miss[] (order not kept). Rows land as O: float, or fp16 bits (unsigned short) for a
// TYPE_FP16 output; the cache keeps them as S (the same choice).
#ifndef LOOKUP_LANES  // src/kernels.rs may set it first (TRITON_RUST_LOOKUP_LANES)
#define LOOKUP_LANES 8
#endif

// A lane's share of a set's tags (v: 32 / LOOKUP_LANES of them) against key: bit p, its p-th holds it.
__device__ __forceinline__ unsigned match_bits(const longlong2* v, i64 key) {
    unsigned bits = 0;
    #pragma unroll
    for (int q = 0; q < 16 / LOOKUP_LANES; ++q)
        bits |= ((unsigned)(v[q].x == key) << (2 * q)) | ((unsigned)(v[q].y == key) << (2 * q + 1));
    return bits;
}

// A key's group's match_bits joined (every lane calls it): whether any way holds it, *way the lowest.
__device__ __forceinline__ bool group_way(unsigned bits, int g, int* way) {
    const int L = LOOKUP_LANES, PER = 32 / LOOKUP_LANES;
    unsigned any = (__ballot_sync(FULL, bits != 0) >> (g * L)) & ((1u << L) - 1u);
    int at = any != 0 ? __ffs(any) - 1 : 0;
    unsigned its = __shfl_sync(FULL, bits, g * L + at);
    *way = PER * at + __ffs(its) - 1;
    return any != 0;
}

// Whether `key` is among `set`'s 32 tags (read where `probe`, 32 / LOOKUP_LANES a lane), *way its lowest way.
__device__ __forceinline__ bool group_find(const i64* __restrict__ slot_keys, u64 set, i64 key, bool probe,
        int g, int gl, int* way) {
    const int PER = 32 / LOOKUP_LANES;
    unsigned bits = 0;
    if (probe) {
        longlong2 v[PER / 2];
        const longlong2* tags = (const longlong2*)(slot_keys + set * 32 + PER * gl);
        #pragma unroll
        for (int q = 0; q < PER / 2; ++q) v[q] = tags[q];
        bits = match_bits(v, key);
    }
    return group_way(bits, g, way);
}

template <typename S, typename O>
__device__ __forceinline__ void batch_lookup_as(const i64* __restrict__ keys, long long first, int n, int tables, int interleaved,
        const int* __restrict__ key_start, const long long* __restrict__ desc, int dim, u64 epoch,
        O* __restrict__ out, int* __restrict__ miss, unsigned* __restrict__ miss_count) {
    const int L = LOOKUP_LANES, PER = 32 / LOOKUP_LANES;  // lanes a key; keys a warp = tags a lane
    long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    int g = lane / L, gl = lane % L;
    if (warp * PER >= n) return;  // the whole warp: all its keys are past the end
    long long w = warp * PER + g;
    bool live = w < n;
    long long i = first + w;
    int t = live ? table_of(i, tables, interleaved, key_start) : 0;
    const i64* slot_keys = (const i64*)desc[t * DESC];
    u64* slot_stamps = (u64*)desc[t * DESC + 1];
    const S* rows = (const S*)desc[t * DESC + 2];
    long long sets = desc[t * DESC + 3];
    i64 key = live ? keys[i] : EMPTY_KEY;
    bool probe = sets > 0 && key != EMPTY_KEY;
    u64 set = probe ? set_of(key, sets) : 0;
    int way;
    bool found = group_find(slot_keys, set, key, probe, g, gl, &way);
    if (!live) return;
    if (interleaved < 0 && key < 0) {  // fixed hotness: padding or a bad key, counted, not looked up
        if (gl == 0) atomicAdd(miss_count + 1, 1u);
        return;
    }
    if (sets < 0) {  // a resident table (-sets rows): row `key`; a key past them misses
        if (key < 0 || key >= -sets) {
            if (gl == 0) miss[atomicAdd(miss_count, 1u)] = (int)i;
        } else {
            copy_row(out + (size_t)i * dim, rows + (size_t)key * dim, dim, gl, L);
        }
        return;
    }
    if (!found) {
        if (gl == 0) miss[atomicAdd(miss_count, 1u)] = (int)i;
        return;
    }
    copy_row(out + (size_t)i * dim, rows + (set * 32 + way) * (size_t)dim, dim, gl, L);
    if (gl == 0) {
        if (desc[t * DESC + 6] != 0) atomicAdd(&slot_stamps[set * 32 + way], 1ULL);  // LFU: one more use
        else slot_stamps[set * 32 + way] = epoch;
    }
}

extern "C" __global__ void batch_lookup(const i64* __restrict__ keys, long long first, int n, int tables, int interleaved,
        const int* __restrict__ key_start, const long long* __restrict__ desc, int dim, u64 epoch,
        float* __restrict__ out, int* __restrict__ miss, unsigned* __restrict__ miss_count) {
    batch_lookup_as<float>(keys, first, n, tables, interleaved, key_start, desc, dim, epoch, out, miss, miss_count);
}

extern "C" __global__ void batch_lookup_h(const i64* __restrict__ keys, long long first, int n, int tables, int interleaved,
        const int* __restrict__ key_start, const long long* __restrict__ desc, int dim, u64 epoch,
        unsigned short* __restrict__ out, int* __restrict__ miss, unsigned* __restrict__ miss_count) {
    batch_lookup_as<float>(keys, first, n, tables, interleaved, key_start, desc, dim, epoch, out, miss, miss_count);
}

// The same over caches whose rows are fp16.
extern "C" __global__ void batch_lookup_s16(const i64* __restrict__ keys, long long first, int n, int tables, int interleaved,
        const int* __restrict__ key_start, const long long* __restrict__ desc, int dim, u64 epoch,
        float* __restrict__ out, int* __restrict__ miss, unsigned* __restrict__ miss_count) {
    batch_lookup_as<unsigned short>(keys, first, n, tables, interleaved, key_start, desc, dim, epoch, out, miss, miss_count);
}

extern "C" __global__ void batch_lookup_h_s16(const i64* __restrict__ keys, long long first, int n, int tables, int interleaved,
        const int* __restrict__ key_start, const long long* __restrict__ desc, int dim, u64 epoch,
        unsigned short* __restrict__ out, int* __restrict__ miss, unsigned* __restrict__ miss_count) {
    batch_lookup_as<unsigned short>(keys, first, n, tables, interleaved, key_start, desc, dim, epoch, out, miss, miss_count);
}

// Whether the fill's j-th missed row goes into a cache, and if so its table's descriptor d
// (desc + t * DESC), its key and its set: not when it was not found below the cache, nor for a
// table without a cache or the empty key. The fill and the reset of its tickets both ask
// this, so they agree on every set.
__device__ __forceinline__ bool fill_target(const i64* __restrict__ keys, const int* __restrict__ miss,
        const unsigned char* __restrict__ found, long long j, int m, int tables, int interleaved,
        const int* __restrict__ key_start, const long long* __restrict__ desc,
        const long long** d, i64* key, u64* set) {
    if (j >= m || !found[j]) return false;
    int i = miss[j];
    int t = table_of(i, tables, interleaved, key_start);
    long long sets = desc[t * DESC + 3];
    *key = keys[i];
    if (sets <= 0 || *key == EMPTY_KEY) return false;
    *d = desc + t * DESC;
    *set = set_of(*key, sets);
    return true;
}

// One warp per missed key of the last batch_lookup: inserts row j (fetched below the
// cache, already on the GPU; R: fp32, or fp16 bits as an fp16 table stores them) for key
// keys[miss[j]] when found[j]. A set takes at most 32
// of a fill's rows (a ticket per warp; more could not all stay, and warps queueing on one
// lock would hold SMs the network's kernels need). Those warps take the set's lock in
// turn (all lanes spin together, so no lane waits on another), read the set's tags past
// L1, and replace the way holding the key or the one way_for gives up, as cache_insert
// does (LFU: batch_fill_count counted every missed key in the sketch first, whether it
// goes in or not).
template <typename S, typename R>
__device__ __forceinline__ void batch_fill_as(const i64* __restrict__ keys, const int* __restrict__ miss,
        const unsigned char* __restrict__ found, int m, int tables, int interleaved,
        const int* __restrict__ key_start, const long long* __restrict__ desc, int dim, u64 epoch,
        const R* __restrict__ rows) {
    long long j = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    const long long* d;
    i64 key;
    u64 set;
    if (!fill_target(keys, miss, found, j, m, tables, interleaved, key_start, desc, &d, &key, &set)) return;
    long long sets = d[3];
    i64* slot_keys = (i64*)d[0];
    u64* slot_stamps = (u64*)d[1];
    S* slot_rows = (S*)d[2];
    unsigned* locks = (unsigned*)d[4];
    u64* counters = (u64*)d[5];
    unsigned* sketch = (unsigned*)d[6];
    int lfu = sketch != 0;
    u64 count = lfu ? sketch_read(sketch, d[7], key) : 0;  // batch_fill_count ran before
    if (lfu) {
        // Most LFU misses count no more than every row of their set: refused here, before a
        // ticket or the lock. While a fill runs (alone on the caches' queue) a set's least
        // stamp only grows, so the lock would refuse them too; a warp of this fill that put
        // the same key in meanwhile did so with the same row and count.
        size_t at = set * 32 + lane;
        u64 st0 = __ldcg(&slot_stamps[at]);
        i64 sk0 = __ldcg(&slot_keys[at]);
        unsigned present = __ballot_sync(FULL, st0 != 0 && sk0 == key);
        u64 least = st0;
        for (int off = 16; off > 0; off >>= 1) {
            u64 o = __shfl_xor_sync(FULL, least, off);
            least = o < least ? o : least;
        }
        if (present == 0 && least != 0 && count != 0 && count <= least) return;
    }
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
    int fresh;
    int way = way_for(st, sk, key, lane, 0, count, slot_keys, set, counters, &fresh, (unsigned*)d[8], d[9]);
    if (way >= 0) {
        u64 old = __shfl_sync(FULL, st, way);
        copy_row(slot_rows + (set * 32 + way) * (size_t)dim, rows + (size_t)j * dim, dim, lane);
        __syncwarp();
        if (lane == 0) slot_stamps[set * 32 + way] = next_stamp(fresh, old, count, epoch, lfu, 0);
    }
    if (lane == 0) {
        __threadfence();
        atomicExch(&locks[set], 0u);
    }
}

extern "C" __global__ void batch_fill(const i64* __restrict__ keys, const int* __restrict__ miss,
        const unsigned char* __restrict__ found, int m, int tables, int interleaved,
        const int* __restrict__ key_start, const long long* __restrict__ desc, int dim, u64 epoch,
        const float* __restrict__ rows) {
    batch_fill_as<float, float>(keys, miss, found, m, tables, interleaved, key_start, desc, dim, epoch, rows);
}

// The same into caches whose rows are fp16 (each row rounded once, as a TYPE_FP16 lookup
// of an fp32 cache rounds it).
extern "C" __global__ void batch_fill_s16(const i64* __restrict__ keys, const int* __restrict__ miss,
        const unsigned char* __restrict__ found, int m, int tables, int interleaved,
        const int* __restrict__ key_start, const long long* __restrict__ desc, int dim, u64 epoch,
        const float* __restrict__ rows) {
    batch_fill_as<unsigned short, float>(keys, miss, found, m, tables, interleaved, key_start, desc, dim, epoch, rows);
}

// The two fills of rows fetched as fp16 (tables stored so): into fp32 caches (widened
// exactly) and into fp16 caches (copied).
extern "C" __global__ void batch_fill_r16(const i64* __restrict__ keys, const int* __restrict__ miss,
        const unsigned char* __restrict__ found, int m, int tables, int interleaved,
        const int* __restrict__ key_start, const long long* __restrict__ desc, int dim, u64 epoch,
        const unsigned short* __restrict__ rows) {
    batch_fill_as<float, unsigned short>(keys, miss, found, m, tables, interleaved, key_start, desc, dim, epoch, rows);
}

extern "C" __global__ void batch_fill_s16_r16(const i64* __restrict__ keys, const int* __restrict__ miss,
        const unsigned char* __restrict__ found, int m, int tables, int interleaved,
        const int* __restrict__ key_start, const long long* __restrict__ desc, int dim, u64 epoch,
        const unsigned short* __restrict__ rows) {
    batch_fill_as<unsigned short, unsigned short>(keys, miss, found, m, tables, interleaved, key_start, desc, dim, epoch, rows);
}

// One thread per missed key of the fill just before it on the same queue: zeroes the ticket
// count of every set that fill took tickets for (fill_target, as the fill asks it), so the next fill
// finds them all zero without clearing every set of every table.
extern "C" __global__ void batch_fill_reset(const i64* __restrict__ keys, const int* __restrict__ miss,
        const unsigned char* __restrict__ found, int m, int tables, int interleaved,
        const int* __restrict__ key_start, const long long* __restrict__ desc) {
    long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long* d;
    i64 key;
    u64 set;
    if (!fill_target(keys, miss, found, j, m, tables, interleaved, key_start, desc, &d, &key, &set)) return;
    ((unsigned*)d[4])[d[3] + set] = 0u;
}

// One thread per missed key, before the fill on the same queue: counts the miss of every key
// the fill will place in an LFU cache (fill_target, as the fill asks it). When the run's misses
// were made distinct (dedupe_misses), mult[i] is how many of the batch's keys missed the row of
// key index i, all counted, as they were when every miss was listed; mult 0: one each.
extern "C" __global__ void batch_fill_count(const i64* __restrict__ keys, const int* __restrict__ miss,
        const unsigned char* __restrict__ found, int m, int tables, int interleaved,
        const int* __restrict__ key_start, const long long* __restrict__ desc, const int* __restrict__ mult) {
    long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long* d;
    i64 key;
    u64 set;
    if (!fill_target(keys, miss, found, j, m, tables, interleaved, key_start, desc, &d, &key, &set)) return;
    if (d[6] != 0) sketch_add((unsigned*)d[6], d[7], key, mult ? (unsigned)mult[miss[j]] : 1u);
}

// Four missed keys a warp, eight lanes each (miss[j], j < m; the reads of four rows in flight
// at once, each crossing the bus; a grid of fewer warps than m / 4 steps over the misses, so
// the reads waiting on the bus hold only the SMs the launch gives them): row j of `rows`
// (fp32; fp16 bits in the _r16 form) is the row of key keys[miss[j]] read in place from its
// table's rows in page-locked host memory this GPU maps (host + t * HOST_DESC: the rows'
// address on the GPU, how many rows, bytes an element (2: fp16, 4: fp32), the default value's
// bits), and found[j] = 1; a key outside those rows gets the default value and found[j] = 0.
// counts[t] counts table t's misses, counts[tables + t] those defaulted.
#define HOST_DESC 4
#define HOST_ROWS_PER_WARP 4
template <typename R>
__device__ __forceinline__ void read_host_rows_as(const i64* __restrict__ keys, const int* __restrict__ miss, int m,
        int tables, int interleaved, const int* __restrict__ key_start, const long long* __restrict__ host, int dim,
        R* __restrict__ rows, unsigned char* __restrict__ found, unsigned* __restrict__ counts) {
    const int L = 32 / HOST_ROWS_PER_WARP;
    long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    long long stride = ((long long)gridDim.x * blockDim.x >> 5) * HOST_ROWS_PER_WARP;
    int lane = threadIdx.x & 31, gl = lane % L;
    // a grid smaller than the misses steps over them (no lane waits on another here)
    for (long long j = warp * HOST_ROWS_PER_WARP + lane / L; j < m; j += stride) {
        int i = miss[j];
        int t = table_of(i, tables, interleaved, key_start);
        const long long* h = host + t * HOST_DESC;
        i64 key = keys[i];
        R* dst = rows + (size_t)j * dim;
        bool in = key >= 0 && key < h[1];
        if (in && h[2] == 2) copy_row(dst, (const unsigned short*)h[0] + (size_t)key * dim, dim, gl, L);
        else if (in) copy_row(dst, (const float*)h[0] + (size_t)key * dim, dim, gl, L);
        else for (int d = gl; d < dim; d += L) set_value(dst + d, __int_as_float((int)h[3]));
        if (gl == 0) {
            found[j] = in ? 1 : 0;
            atomicAdd(counts + t, 1u);
            if (!in) atomicAdd(counts + tables + t, 1u);
        }
    }
}

extern "C" __global__ void read_host_rows(const i64* __restrict__ keys, const int* __restrict__ miss, int m,
        int tables, int interleaved, const int* __restrict__ key_start, const long long* __restrict__ host, int dim,
        float* __restrict__ rows, unsigned char* __restrict__ found, unsigned* __restrict__ counts) {
    read_host_rows_as(keys, miss, m, tables, interleaved, key_start, host, dim, rows, found, counts);
}

// The same into rows fetched as fp16 bits (every table's rows stored so).
extern "C" __global__ void read_host_rows_r16(const i64* __restrict__ keys, const int* __restrict__ miss, int m,
        int tables, int interleaved, const int* __restrict__ key_start, const long long* __restrict__ host, int dim,
        unsigned short* __restrict__ rows, unsigned char* __restrict__ found, unsigned* __restrict__ counts) {
    read_host_rows_as(keys, miss, m, tables, interleaved, key_start, host, dim, rows, found, counts);
}

// One warp per set: inserts (or, with only_if_present, refreshes) that set's keys in order.
template <typename S>
__device__ __forceinline__ void cache_insert_as(const i64* __restrict__ keys, const float* __restrict__ vecs,
        const int* __restrict__ order, const int* __restrict__ group_start,
        const long long* __restrict__ group_set, int groups,
        i64* __restrict__ slot_keys, u64* __restrict__ slot_stamps, S* __restrict__ rows,
        int dim, u64 epoch, int only_if_present, u64* __restrict__ counters,
        unsigned* __restrict__ sketch, long long width, unsigned* __restrict__ index, long long irows) {
    long long g = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (g >= groups) return;
    u64 set = (u64)group_set[g];
    size_t slot = set * 32 + lane;
    for (int idx = group_start[g]; idx < group_start[g + 1]; ++idx) {
        int i = order[idx];
        i64 key = keys[i];
        if (key == EMPTY_KEY) continue;
        int lfu = sketch != 0;
        // LFU: an insert is a miss of the key, counted by sketch_count before this kernel
        u64 count = (lfu && !only_if_present) ? sketch_read(sketch, width, key) : 0;
        u64 st = slot_stamps[slot];
        i64 sk = slot_keys[slot];
        int fresh;
        int way = way_for(st, sk, key, lane, only_if_present, count, slot_keys, set, counters, &fresh, index, irows);
        if (way < 0) continue;
        u64 old = __shfl_sync(FULL, st, way);
        copy_row(rows + (set * 32 + way) * (size_t)dim, vecs + (size_t)i * dim, dim, lane);
        __syncwarp();
        if (lane == 0) slot_stamps[set * 32 + way] = next_stamp(fresh, old, count, epoch, lfu, only_if_present);
        __syncwarp();
    }
}

extern "C" __global__ void cache_insert(const i64* __restrict__ keys, const float* __restrict__ vecs,
        const int* __restrict__ order, const int* __restrict__ group_start,
        const long long* __restrict__ group_set, int groups,
        i64* __restrict__ slot_keys, u64* __restrict__ slot_stamps, float* __restrict__ rows,
        int dim, u64 epoch, int only_if_present, u64* __restrict__ counters,
        unsigned* __restrict__ sketch, long long width, unsigned* __restrict__ index, long long irows) {
    cache_insert_as(keys, vecs, order, group_start, group_set, groups, slot_keys, slot_stamps, rows, dim, epoch, only_if_present, counters, sketch, width, index, irows);
}

extern "C" __global__ void cache_insert_s16(const i64* __restrict__ keys, const float* __restrict__ vecs,
        const int* __restrict__ order, const int* __restrict__ group_start,
        const long long* __restrict__ group_set, int groups,
        i64* __restrict__ slot_keys, u64* __restrict__ slot_stamps, unsigned short* __restrict__ rows,
        int dim, u64 epoch, int only_if_present, u64* __restrict__ counters,
        unsigned* __restrict__ sketch, long long width, unsigned* __restrict__ index, long long irows) {
    cache_insert_as(keys, vecs, order, group_start, group_set, groups, slot_keys, slot_stamps, rows, dim, epoch, only_if_present, counters, sketch, width, index, irows);
}
