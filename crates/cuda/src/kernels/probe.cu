// The pooled lookup's probe (src/cache/batch_pool.rs), after cache.cu and pool.cu in one program:
// each key's slot in its table's cache found and stamped, the misses listed. Two ways to find it:
// probe_slots reads the key's set's 32 tags; probe_index reads the slot a key index names and the
// one tag there (a cache with a key index: every cached table of the lookup has one).
//
// A probe stamps one hit in N = d[10] of its table (1: every hit; a power of two; 0: none), those
// whose place in the batch hashes with the epoch to 0 modulo N: LFU adds N uses, so a slot's count
// is its hits' on average (src/stamps.rs HitStamps, the CPU's same rule); LRU writes the epoch.
// Each stamp is a read-modify-write of 8 bytes at a random place (LFU's an atomic): stamping every
// hit took 0.42 of a batch's 1.05 ms of probe and pooling on the caches' queue, served (an H200,
// docs/embedding-store.md#hit-stamps).
__device__ __forceinline__ void stamp_hit(const long long* __restrict__ d, long long s, long long i, u64 epoch) {
    long long every = d[10];
    u64* stamps = (u64*)d[1];
    bool lfu = d[6] != 0;
    if (every == 0 || (mix64((u64)i + epoch * 0x9e3779b97f4a7c15ULL) & (u64)(every - 1)) != 0) return;
    if (lfu) atomicAdd(&stamps[s], (u64)every);  // LFU: as many more uses
    else stamps[s] = epoch;
}

// probe_slots: keys of fixed hotness as sent ([batch, width], key i of table t where at[t] <=
// i % width < at[t+1]), LOOKUP_LANES lanes a key as batch_lookup reads the set's tags: slot[i]
// = the key's slot in its table's cache (a resident table's: the key's row), its hit stamped
// (stamp_hit above); or -1 for a miss, whose index goes to miss[] (order not kept) for the host
// to read below the cache. pos[i] = -1 for every key (pool_mark_misses then gives the
// misses their fetched row). A negative key (padding, a client's bad key) is counted in
// miss_count[1], slot -1: the caller then takes the path that leaves padding out. Only 8 bytes
// a key are written, not its row.
//
// A warp takes PROBE_STEPS groups of 32 / LOOKUP_LANES keys (contiguous): every key and its
// table first, then every key's tags read, then each compared, so each warp keeps PROBE_STEPS
// times one group's reads in flight (a key's chain, its key then its set's tags, waits on memory
// twice: measured alone, warps waited on loads two thirds of the time); its misses take their
// places in miss[] with one atomic.
#define PROBE_STEPS 4  // src/kernels.rs PROBE_STEPS
__device__ i64 no_tags[32];  // read in place of a set's tags by a key that is not probed
extern "C" __global__ void probe_slots(const i64* __restrict__ keys, int n, int width, int tables,
        const int* __restrict__ at, const long long* __restrict__ desc, u64 epoch,
        long long* __restrict__ slot, int* __restrict__ pos, int* __restrict__ miss, unsigned* __restrict__ miss_count) {
    const int L = LOOKUP_LANES, PER = 32 / LOOKUP_LANES, K = PROBE_STEPS;
    long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    int g = lane / L, gl = lane % L;
    long long first = warp * (PER * K);
    if (first >= n) return;  // the whole warp: all its keys are past the end
    const long long* d[K];
    i64 key[K];
    #pragma unroll
    for (int u = 0; u < K; ++u) {
        long long i = first + u * PER + g;
        bool live = i < n;
        d[u] = desc + (live ? table_of(i, tables, -width, at) : 0) * DESC;
        key[u] = live ? keys[i] : -1;
    }
    // every step's tags read before any is compared (no branch between the loads: a key not
    // probed reads no_tags instead), so the K reads wait on memory together
    u64 set[K];
    bool probe[K];
    const longlong2* tags[K];
    #pragma unroll
    for (int u = 0; u < K; ++u) {
        long long sets = d[u][3];
        probe[u] = sets > 0 && key[u] >= 0;
        set[u] = probe[u] ? set_of(key[u], sets) : 0;
        tags[u] = (const longlong2*)(probe[u] ? (const i64*)d[u][0] + set[u] * 32 + PER * gl : no_tags);
    }
    longlong2 v[K][PER / 2];
    #pragma unroll
    for (int u = 0; u < K; ++u)
        #pragma unroll
        for (int q = 0; q < PER / 2; ++q) v[u][q] = __ldg(tags[u] + q);
    unsigned bits[K];
    #pragma unroll
    for (int u = 0; u < K; ++u) {
        bits[u] = match_bits(v[u], key[u]);
        if (!probe[u]) bits[u] = 0;
    }
    unsigned missed = 0;  // bit u: this lane's key of step u missed (the group's lane 0 only)
    #pragma unroll
    for (int u = 0; u < K; ++u) {
        int way;
        bool found = group_way(bits[u], g, &way);
        long long i = first + u * PER + g;
        if (i >= n || gl != 0) continue;
        pos[i] = -1;
        if (key[u] < 0) {
            slot[i] = -1;
            atomicAdd(miss_count + 1, 1u);
            continue;
        }
        long long sets = d[u][3], s = -1;
        if (sets < 0) {
            if (key[u] < -sets) s = key[u];
        } else if (found) {
            s = (long long)set[u] * 32 + way;
            stamp_hit(d[u], s, i, epoch);
        }
        slot[i] = s;
        if (s < 0) missed |= 1u << u;
    }
    // the warp's misses: one place in miss[] each, taken with one atomic
    unsigned total = 0, below = (1u << lane) - 1u, off[K];
    #pragma unroll
    for (int u = 0; u < K; ++u) {
        unsigned b = __ballot_sync(FULL, (missed >> u) & 1u);
        off[u] = total + __popc(b & below);  // the warp's misses before this one
        total += __popc(b);
    }
    if (total == 0) return;
    unsigned base = 0;
    if (lane == 0) base = atomicAdd(miss_count, total);
    base = __shfl_sync(FULL, base, 0);
    #pragma unroll
    for (int u = 0; u < K; ++u)
        if ((missed >> u) & 1u) miss[base + off[u]] = (int)(first + u * PER + g);
}

// A key's slot through its table's key index (desc[8]: one u32 a key for keys 0 .. desc[9] - 1,
// 0xffffffff where none; way_for writes a key's slot there whenever it takes or finds a way, so a
// key held by a cache always has its slot there): the slot named, if its tag holds the key, else
// -1. An entry a key's eviction left behind names a slot holding another key (or EMPTY_KEY), so
// it reads as a miss; nothing clears it. A key past the index (or a table without one) scans its
// set's 32 tags, as batch_lookup would, lowest way first.
__device__ __forceinline__ long long indexed_slot(const long long* __restrict__ d, i64 key, long long sets) {
    const i64* tags = (const i64*)d[0];
    const unsigned* index = (const unsigned*)d[8];
    if (index != 0 && key < d[9]) {
        unsigned s = __ldg(index + key);
        return (long long)s < sets * 32 && __ldcg(tags + s) == key ? (long long)s : -1;
    }
    u64 set = set_of(key, sets);
    for (int w = 0; w < 32; ++w)
        if (tags[set * 32 + w] == key) return (long long)(set * 32 + w);
    return -1;
}

// probe_index: probe_slots's outputs (slot, pos, miss, miss_count) through the key indexes, one
// thread a key: a hit reads 4 bytes of index and 8 of tag instead of its set's 256 bytes of tags,
// and each thread's chain (key, index, tag) waits on memory three times, so the warps of a launch
// of one thread a key keep the reads in flight. A warp's misses take their places with one atomic.
extern "C" __global__ void probe_index(const i64* __restrict__ keys, int n, int width, int tables,
        const int* __restrict__ at, const long long* __restrict__ desc, u64 epoch,
        long long* __restrict__ slot, int* __restrict__ pos, int* __restrict__ miss, unsigned* __restrict__ miss_count) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    int lane = threadIdx.x & 31;
    bool missed = false;
    if (i < n) {  // no return before the ballot: every lane of the warp reaches it
        const long long* d = desc + table_of(i, tables, -width, at) * DESC;
        i64 key = keys[i];
        long long sets = d[3], s = -1;
        pos[i] = -1;
        if (key < 0) {
            atomicAdd(miss_count + 1, 1u);  // padding or a bad key: the caller's other path
        } else {
            if (sets < 0) {
                if (key < -sets) s = key;  // a resident table's row
            } else if (sets > 0) {
                s = indexed_slot(d, key, sets);
                if (s >= 0) stamp_hit(d, s, i, epoch);
            }
            missed = s < 0;
        }
        slot[i] = s;
    }
    unsigned b = __ballot_sync(FULL, missed);
    if (b == 0) return;
    unsigned base = 0;
    if (lane == 0) base = atomicAdd(miss_count, (unsigned)__popc(b));
    base = __shfl_sync(FULL, base, 0);
    if (missed) miss[base + __popc(b & ((1u << lane) - 1u))] = (int)i;
}
