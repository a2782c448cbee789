// The GPU embedding cache's pooling kernels: pooled lookups over looked-up rows, bags of fixed
// hotness, resident tables and the caches' slots; and the fetched rows put in place (scatter).
// Compiled after cache.cu as one source (src/kernels.rs), whose
// types and helpers (i64, copy_row, f2h, h2f, the descriptors) they use.

// Pooled lookups: one block per bag, bags table-major (bag t * batch + b holds rows
// offsets[bag] .. offsets[bag + 1] of `rows`), the block's threads over the row's dims. A bag's
// rows (R: float, or fp16 bits where a batch lookup over fp16 caches wrote them so) are summed
// in fp32 in order (then divided by their count for the mean; an empty bag gives zeros) and
// written to out[b][t][:] as O: float, or fp16 bits.
__device__ __forceinline__ void put(float* p, float v) { *p = v; }
__device__ __forceinline__ void put(unsigned short* p, float v) { *p = f2h(v); }
__device__ __forceinline__ float val(float v) { return v; }
__device__ __forceinline__ float val(unsigned short h) { return h2f(h); }

// A bags kernel's thread: its bag (`lanes` threads a bag) and its place among them, then the
// bag's sample b and table t (bag = b * tables + t); false for a thread past the batch's bags.
// In 32 bits wherever the thread's index fits them (any batch of under 2^32 / lanes bags): a
// 64-bit division costs several times the instructions.
__device__ __forceinline__ bool bag_of(int lanes, int batch, int tables, long long* bag, int* gl, int* b, int* t) {
    unsigned long long g = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (g <= 0xffffffffULL) {
        unsigned u = (unsigned)g, q = u / (unsigned)lanes, r = q / (unsigned)tables;
        *bag = q;
        *gl = (int)(u - q * (unsigned)lanes);
        *b = (int)r;
        *t = (int)(q - r * (unsigned)tables);
    } else {
        *bag = (long long)(g / (unsigned long long)lanes);
        *gl = (int)(g % (unsigned long long)lanes);
        *b = (int)(*bag / tables);
        *t = (int)(*bag % tables);
    }
    return *bag < (long long)batch * tables;
}

template <typename R, typename O>
__device__ __forceinline__ void pool_bags_as(const R* __restrict__ rows, const int* __restrict__ offsets,
        int batch, int tables, int dim, int mean, O* __restrict__ out) {
    int bag = blockIdx.x;
    int t = bag / batch, b = bag % batch;
    int first = offsets[bag], last = offsets[bag + 1];
    for (int d = threadIdx.x; d < dim; d += blockDim.x) {
        float acc = 0.0f;
        for (int r = first; r < last; ++r) acc += val(rows[(size_t)r * dim + d]);
        if (mean && last - first > 1) acc = acc / (float)(last - first);
        put(out + ((size_t)b * tables + t) * dim + d, acc);
    }
}

extern "C" __global__ void pool_bags(const float* __restrict__ rows, const int* __restrict__ offsets,
        int batch, int tables, int dim, int mean, float* __restrict__ out) {
    pool_bags_as(rows, offsets, batch, tables, dim, mean, out);
}

extern "C" __global__ void pool_bags_h(const float* __restrict__ rows, const int* __restrict__ offsets,
        int batch, int tables, int dim, int mean, unsigned short* __restrict__ out) {
    pool_bags_as(rows, offsets, batch, tables, dim, mean, out);
}

extern "C" __global__ void pool_bags_s16(const unsigned short* __restrict__ rows, const int* __restrict__ offsets,
        int batch, int tables, int dim, int mean, float* __restrict__ out) {
    pool_bags_as(rows, offsets, batch, tables, dim, mean, out);
}

extern "C" __global__ void pool_bags_h_s16(const unsigned short* __restrict__ rows, const int* __restrict__ offsets,
        int batch, int tables, int dim, int mean, unsigned short* __restrict__ out) {
    pool_bags_as(rows, offsets, batch, tables, dim, mean, out);
}

// Bags of fixed hotness pooled where a batch lookup wrote the rows of the keys as sent (row i for
// key i, keys [batch, width]): bag (b, t) is rows b * width + at[t] .. b * width + at[t + 1], every
// bag full; summed in key order (or averaged) into out [batch, tables, dim], as pool_bags does.
template <typename R, typename O>
__device__ __forceinline__ void pool_fixed_as(const R* __restrict__ rows, const int* __restrict__ at,
        int width, int batch, int tables, int dim, int mean, O* __restrict__ out) {
    int bag = blockIdx.x;
    int b = bag / tables, t = bag % tables;
    long long first = (long long)b * width + at[t], last = (long long)b * width + at[t + 1];
    for (int d = threadIdx.x; d < dim; d += blockDim.x) {
        float acc = 0.0f;
        for (long long r = first; r < last; ++r) acc += val(rows[(size_t)r * dim + d]);
        if (mean && last - first > 1) acc = acc / (float)(last - first);
        put(out + ((size_t)b * tables + t) * dim + d, acc);
    }
}

extern "C" __global__ void pool_fixed(const float* __restrict__ rows, const int* __restrict__ at,
        int width, int batch, int tables, int dim, int mean, float* __restrict__ out) {
    pool_fixed_as(rows, at, width, batch, tables, dim, mean, out);
}

extern "C" __global__ void pool_fixed_h(const float* __restrict__ rows, const int* __restrict__ at,
        int width, int batch, int tables, int dim, int mean, unsigned short* __restrict__ out) {
    pool_fixed_as(rows, at, width, batch, tables, dim, mean, out);
}

extern "C" __global__ void pool_fixed_s16(const unsigned short* __restrict__ rows, const int* __restrict__ at,
        int width, int batch, int tables, int dim, int mean, float* __restrict__ out) {
    pool_fixed_as(rows, at, width, batch, tables, dim, mean, out);
}

extern "C" __global__ void pool_fixed_h_s16(const unsigned short* __restrict__ rows, const int* __restrict__ at,
        int width, int batch, int tables, int dim, int mean, unsigned short* __restrict__ out) {
    pool_fixed_as(rows, at, width, batch, tables, dim, mean, out);
}

// A resident table's rows written in place (an update or a fill): one warp per key, row i of
// vecs to row keys[i]; keys past the table's nrows are not resident and are skipped. The host
// keeps only the last of a key's rows in one call.
template <typename S>
__device__ __forceinline__ void resident_write_as(const i64* __restrict__ keys, int n, const float* __restrict__ vecs,
        S* __restrict__ rows, long long nrows, int dim) {
    long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (warp >= n) return;
    i64 key = keys[warp];
    if (key < 0 || key >= nrows) return;
    copy_row(rows + (size_t)key * dim, vecs + (size_t)warp * dim, dim, lane);
}

extern "C" __global__ void resident_write(const i64* __restrict__ keys, int n, const float* __restrict__ vecs,
        float* __restrict__ rows, long long nrows, int dim) {
    resident_write_as(keys, n, vecs, rows, nrows, dim);
}

extern "C" __global__ void resident_write_s16(const i64* __restrict__ keys, int n, const float* __restrict__ vecs,
        unsigned short* __restrict__ rows, long long nrows, int dim) {
    resident_write_as(keys, n, vecs, rows, nrows, dim);
}

// 16 bytes of a row (8 fp16 or 4 fp32 values) added to acc, in order.
__device__ __forceinline__ void add16(float* acc, uint4 v, const unsigned short*) {
    unsigned w[4] = {v.x, v.y, v.z, v.w};
    #pragma unroll
    for (int q = 0; q < 4; ++q) {
        acc[2 * q] += h2f((unsigned short)(w[q] & 0xffffu));
        acc[2 * q + 1] += h2f((unsigned short)(w[q] >> 16));
    }
}
__device__ __forceinline__ void add16(float* acc, uint4 v, const float*) {
    acc[0] += __uint_as_float(v.x); acc[1] += __uint_as_float(v.y);
    acc[2] += __uint_as_float(v.z); acc[3] += __uint_as_float(v.w);
}

// 16 bytes of a fetched row as a cache of fp16 rows keeps them: fp32 values rounded to fp16
// (to nearest even) and back; fp16 bits are so already.
__device__ __forceinline__ float as_half(unsigned u) { return h2f(f2h(__uint_as_float(u))); }
__device__ __forceinline__ uint4 kept16(uint4 v, const float*) {
    return make_uint4(__float_as_uint(as_half(v.x)), __float_as_uint(as_half(v.y)),
                      __float_as_uint(as_half(v.z)), __float_as_uint(as_half(v.w)));
}
__device__ __forceinline__ uint4 kept16(uint4 v, const unsigned short*) { return v; }

// Pooled lookups over resident tables, read where the keys are: `lanes` threads a bag, each
// holding 16 bytes of the row (dim * sizeof(S) / 16 lanes), so a bag's rows are read whole
// and summed in registers, and nothing but the pooled row is written (out[b][t][:], as O).
// Bag (b, t) is, fixed hotness (ragged == 0): keys[b * width + at[t] .. b * width + at[t+1]],
// -1 padding; ragged: keys[at[b * tables + t] .. at[b * tables + t + 1]], every key looked up.
// Rows are summed in key order in fp32 (as the host does), divided by the bag's count for the
// mean; an empty bag gives zeros. A key that is no row of its table (past it, negative) is
// counted in miss_count and contributes nothing: the caller then answers the batch by the
// path that reads below the GPU.
template <typename S, typename O>
__device__ __forceinline__ void pool_resident_as(const i64* __restrict__ keys, int batch, int width, int tables,
        const int* __restrict__ at, int ragged, const long long* __restrict__ desc, int dim, int lanes, int mean,
        O* __restrict__ out, unsigned* __restrict__ miss_count) {
    const int E = 16 / (int)sizeof(S);
    long long bag;
    int gl, b, t;
    if (!bag_of(lanes, batch, tables, &bag, &gl, &b, &t)) return;
    long long first, n;
    if (ragged) { first = at[bag]; n = (long long)at[bag + 1] - first; }
    else { first = (long long)b * width + at[t]; n = at[t + 1] - at[t]; }
    const S* rows = (const S*)desc[t * DESC + 2] + gl * E;
    long long nrows = -desc[t * DESC + 3];
    const i64* k = keys + first;
    float acc[E];
    #pragma unroll
    for (int e = 0; e < E; ++e) acc[e] = 0.0f;
    int count = 0, missed = 0;
    long long j = 0;
    // four keys' rows in flight at a time, added in key order
    for (; j + 4 <= n; j += 4) {
        i64 kk[4];
        uint4 v[4];
        bool use[4];
        #pragma unroll
        for (int u = 0; u < 4; ++u) kk[u] = k[j + u];
        #pragma unroll
        for (int u = 0; u < 4; ++u) {
            bool pad = !ragged && kk[u] == -1;
            bool in = kk[u] >= 0 && kk[u] < nrows;
            use[u] = in;
            count += pad ? 0 : 1;
            missed += (pad || in) ? 0 : 1;
            v[u] = in ? *(const uint4*)(rows + (size_t)kk[u] * dim) : make_uint4(0u, 0u, 0u, 0u);
        }
        #pragma unroll
        for (int u = 0; u < 4; ++u) if (use[u]) add16(acc, v[u], rows);
    }
    for (; j < n; ++j) {
        i64 key = k[j];
        bool pad = !ragged && key == -1;
        bool in = key >= 0 && key < nrows;
        count += pad ? 0 : 1;
        missed += (pad || in) ? 0 : 1;
        if (in) add16(acc, *(const uint4*)(rows + (size_t)key * dim), rows);
    }
    if (missed != 0 && gl == 0) atomicAdd(miss_count, (unsigned)missed);
    O* o = out + ((size_t)b * tables + t) * dim + gl * E;
    #pragma unroll
    for (int e = 0; e < E; ++e) put(o + e, (mean && count > 1) ? acc[e] / (float)count : acc[e]);
}

// Tables' rows (S) float or fp16, the pooled rows out (O) float or fp16.
extern "C" __global__ void pool_resident(const i64* __restrict__ keys, int batch, int width, int tables,
        const int* __restrict__ at, int ragged, const long long* __restrict__ desc, int dim, int lanes, int mean,
        float* __restrict__ out, unsigned* __restrict__ miss_count) {
    pool_resident_as<float, float>(keys, batch, width, tables, at, ragged, desc, dim, lanes, mean, out, miss_count);
}

extern "C" __global__ void pool_resident_h(const i64* __restrict__ keys, int batch, int width, int tables,
        const int* __restrict__ at, int ragged, const long long* __restrict__ desc, int dim, int lanes, int mean,
        unsigned short* __restrict__ out, unsigned* __restrict__ miss_count) {
    pool_resident_as<float, unsigned short>(keys, batch, width, tables, at, ragged, desc, dim, lanes, mean, out, miss_count);
}

extern "C" __global__ void pool_resident_s16(const i64* __restrict__ keys, int batch, int width, int tables,
        const int* __restrict__ at, int ragged, const long long* __restrict__ desc, int dim, int lanes, int mean,
        float* __restrict__ out, unsigned* __restrict__ miss_count) {
    pool_resident_as<unsigned short, float>(keys, batch, width, tables, at, ragged, desc, dim, lanes, mean, out, miss_count);
}

extern "C" __global__ void pool_resident_h_s16(const i64* __restrict__ keys, int batch, int width, int tables,
        const int* __restrict__ at, int ragged, const long long* __restrict__ desc, int dim, int lanes, int mean,
        unsigned short* __restrict__ out, unsigned* __restrict__ miss_count) {
    pool_resident_as<unsigned short, unsigned short>(keys, batch, width, tables, at, ragged, desc, dim, lanes, mean, out, miss_count);
}

// pool_probe: each bag summed from the slots probe.cu found (probe_slots or probe_index),
// `lanes` threads a bag (each holding 16 bytes of a row of the caches' type S), four rows in
// flight at a time, added in key
// order in fp32, as pool_resident reads a resident table. A bag whose keys all hit is final at
// once, out[b][t][:] as O (divided by its count for the mean); one with a miss stays open: its
// hits' sum goes to partial (fp32, [bags, dim]) and open[bag] = 1.
template <typename S, typename O>
__device__ __forceinline__ void pool_probe_as(const long long* __restrict__ slot, int batch, int width, int tables,
        const int* __restrict__ at, const long long* __restrict__ desc, int dim, int lanes, int mean,
        O* __restrict__ out, float* __restrict__ partial, unsigned char* __restrict__ open) {
    const int E = 16 / (int)sizeof(S);
    long long bag;
    int gl, b, t;
    if (!bag_of(lanes, batch, tables, &bag, &gl, &b, &t)) return;
    const long long* s = slot + (long long)b * width + at[t];
    int n = at[t + 1] - at[t];
    const S* rows = (const S*)desc[t * DESC + 2] + gl * E;
    float acc[E];
    #pragma unroll
    for (int e = 0; e < E; ++e) acc[e] = 0.0f;
    int missed = 0, j = 0;
    for (; j + 4 <= n; j += 4) {
        long long ss[4];
        uint4 v[4];
        #pragma unroll
        for (int u = 0; u < 4; ++u) ss[u] = s[j + u];
        #pragma unroll
        for (int u = 0; u < 4; ++u)
            v[u] = ss[u] >= 0 ? *(const uint4*)(rows + (size_t)ss[u] * dim) : make_uint4(0u, 0u, 0u, 0u);
        #pragma unroll
        for (int u = 0; u < 4; ++u) {
            if (ss[u] >= 0) add16(acc, v[u], rows);
            else ++missed;
        }
    }
    for (; j < n; ++j) {
        long long x = s[j];
        if (x >= 0) add16(acc, *(const uint4*)(rows + (size_t)x * dim), rows);
        else ++missed;
    }
    if (gl == 0) open[bag] = missed > 0 ? 1 : 0;
    if (missed > 0) {
        float* p = partial + (size_t)bag * dim + gl * E;
        #pragma unroll
        for (int e = 0; e < E; ++e) p[e] = acc[e];
        return;
    }
    O* o = out + (size_t)bag * dim + gl * E;
    #pragma unroll
    for (int e = 0; e < E; ++e) put(o + e, (mean && n > 1) ? acc[e] / (float)n : acc[e]);
}

// Caches' rows (S) float or fp16, the pooled rows out (O) float or fp16.
extern "C" __global__ void pool_probe(const long long* __restrict__ slot, int batch, int width, int tables,
        const int* __restrict__ at, const long long* __restrict__ desc, int dim, int lanes, int mean,
        float* __restrict__ out, float* __restrict__ partial, unsigned char* __restrict__ open) {
    pool_probe_as<float, float>(slot, batch, width, tables, at, desc, dim, lanes, mean, out, partial, open);
}

extern "C" __global__ void pool_probe_h(const long long* __restrict__ slot, int batch, int width, int tables,
        const int* __restrict__ at, const long long* __restrict__ desc, int dim, int lanes, int mean,
        unsigned short* __restrict__ out, float* __restrict__ partial, unsigned char* __restrict__ open) {
    pool_probe_as<float, unsigned short>(slot, batch, width, tables, at, desc, dim, lanes, mean, out, partial, open);
}

extern "C" __global__ void pool_probe_s16(const long long* __restrict__ slot, int batch, int width, int tables,
        const int* __restrict__ at, const long long* __restrict__ desc, int dim, int lanes, int mean,
        float* __restrict__ out, float* __restrict__ partial, unsigned char* __restrict__ open) {
    pool_probe_as<unsigned short, float>(slot, batch, width, tables, at, desc, dim, lanes, mean, out, partial, open);
}

extern "C" __global__ void pool_probe_h_s16(const long long* __restrict__ slot, int batch, int width, int tables,
        const int* __restrict__ at, const long long* __restrict__ desc, int dim, int lanes, int mean,
        unsigned short* __restrict__ out, float* __restrict__ partial, unsigned char* __restrict__ open) {
    pool_probe_as<unsigned short, unsigned short>(slot, batch, width, tables, at, desc, dim, lanes, mean, out, partial, open);
}

// One thread per missed key: out[j] = keys[idx[j]] (a batch whose keys came in GPU memory
// tells the host which keys missed).
extern "C" __global__ void gather_keys(const i64* __restrict__ keys, const int* __restrict__ idx, int m, i64* __restrict__ out) {
    long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (j < m) out[j] = keys[idx[j]];
}

// Row j of the fetched rows is key miss[j]'s (the fetcher's order): pos[miss[j]] = j.
extern "C" __global__ void pool_mark_misses(const int* __restrict__ miss, int m, int* __restrict__ pos) {
    long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (j < m) pos[miss[j]] = (int)j;
}

// A pooled lookup's misses made distinct, so the host reads each row once and the fill inserts
// it once: one thread per miss j of miss[0..m) (index i = miss[j], key keys[i], of table t with
// at[t] <= i % width < at[t+1]), over `table` (cap places, a power of two, zeroed before). The
// first miss of a (table, key) to claim a place (owner i + 1) is listed in uniq[] (counts[0]);
// every other is listed in dups[] as the pair (i, its owner's i) (counts[1]). Orders not kept.
// mult[owner's i] (zeroed before) counts the misses of its row, for the LFU sketch
// (batch_fill_count).
extern "C" __global__ void dedupe_misses(const i64* __restrict__ keys, const int* __restrict__ miss, int m,
        int width, int tables, const int* __restrict__ at, int* __restrict__ table, long long cap,
        int* __restrict__ uniq, int* __restrict__ dups, unsigned* __restrict__ counts, int* __restrict__ mult) {
    long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= m) return;
    int i = miss[j];
    i64 key = keys[i];
    int t = table_of(i, tables, -width, at);
    u64 h = mix64((u64)key ^ (0x9e3779b97f4a7c15ULL * (u64)(t + 1))) & (u64)(cap - 1);
    for (;;) {
        int was = atomicCAS(&table[h], 0, i + 1);
        if (was == 0) {
            uniq[atomicAdd(&counts[0], 1u)] = i;
            atomicAdd(&mult[i], 1);
            return;
        }
        int o = was - 1;
        if (keys[o] == key && table_of(o, tables, -width, at) == t) {
            atomicAdd(&mult[o], 1);
            unsigned d = atomicAdd(&counts[1], 1u);
            dups[2 * d] = i;
            dups[2 * d + 1] = o;
            return;
        }
        h = (h + 1) & (u64)(cap - 1);
    }
}

// Each repeated miss (dups[2k], its owner dups[2k + 1]) given its owner's fetched row, after
// pool_mark_misses gave the owners theirs.
extern "C" __global__ void pool_mark_repeats(const int* __restrict__ dups, int d, int* __restrict__ pos) {
    long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (k < d) pos[dups[2 * k]] = pos[dups[2 * k + 1]];
}

// The open bags closed: `lanes` threads a bag, each 16 bytes of a fetched row (R: float, or
// fp16 bits); a bag's hits' sum (partial) plus its missed keys' fetched rows, in key order,
// written to out[b][t][:] as O (divided by its count for the mean). So a bag's sum is its
// hits' rows in key order, then its misses' in key order, in fp32. With round16 (caches of fp16
// rows, fp32 rows fetched) each fetched row is first rounded to fp16, as the cache rounds it
// when it goes in: a bag's sum is the same whether its keys hit or missed.
template <typename R, typename O>
__device__ __forceinline__ void pool_close_as(const R* __restrict__ fetched, const int* __restrict__ pos,
        const unsigned char* __restrict__ open, int batch, int width, int tables, const int* __restrict__ at,
        int dim, int lanes, int mean, int round16, const float* __restrict__ partial, O* __restrict__ out) {
    const int E = 16 / (int)sizeof(R);
    long long bag;
    int gl, b, t;
    if (!bag_of(lanes, batch, tables, &bag, &gl, &b, &t) || !open[bag]) return;
    long long first = (long long)b * width + at[t];
    int n = at[t + 1] - at[t];
    const float* p = partial + (size_t)bag * dim + gl * E;
    float acc[E];
    #pragma unroll
    for (int e = 0; e < E; ++e) acc[e] = p[e];
    const R* r = fetched + gl * E;
    for (int j = 0; j < n; ++j) {
        int row = pos[first + j];
        if (row < 0) continue;
        uint4 v = *(const uint4*)(r + (size_t)row * dim);
        add16(acc, round16 ? kept16(v, r) : v, r);
    }
    O* o = out + (size_t)bag * dim + gl * E;
    #pragma unroll
    for (int e = 0; e < E; ++e) put(o + e, (mean && n > 1) ? acc[e] / (float)n : acc[e]);
}

extern "C" __global__ void pool_close(const float* __restrict__ fetched, const int* __restrict__ pos,
        const unsigned char* __restrict__ open, int batch, int width, int tables, const int* __restrict__ at,
        int dim, int lanes, int mean, int round16, const float* __restrict__ partial, float* __restrict__ out) {
    pool_close_as<float, float>(fetched, pos, open, batch, width, tables, at, dim, lanes, mean, round16, partial, out);
}

extern "C" __global__ void pool_close_h(const float* __restrict__ fetched, const int* __restrict__ pos,
        const unsigned char* __restrict__ open, int batch, int width, int tables, const int* __restrict__ at,
        int dim, int lanes, int mean, int round16, const float* __restrict__ partial, unsigned short* __restrict__ out) {
    pool_close_as<float, unsigned short>(fetched, pos, open, batch, width, tables, at, dim, lanes, mean, round16, partial, out);
}

extern "C" __global__ void pool_close_r16(const unsigned short* __restrict__ fetched, const int* __restrict__ pos,
        const unsigned char* __restrict__ open, int batch, int width, int tables, const int* __restrict__ at,
        int dim, int lanes, int mean, int round16, const float* __restrict__ partial, float* __restrict__ out) {
    pool_close_as<unsigned short, float>(fetched, pos, open, batch, width, tables, at, dim, lanes, mean, round16, partial, out);
}

extern "C" __global__ void pool_close_h_r16(const unsigned short* __restrict__ fetched, const int* __restrict__ pos,
        const unsigned char* __restrict__ open, int batch, int width, int tables, const int* __restrict__ at,
        int dim, int lanes, int mean, int round16, const float* __restrict__ partial, unsigned short* __restrict__ out) {
    pool_close_as<unsigned short, unsigned short>(fetched, pos, open, batch, width, tables, at, dim, lanes, mean, round16, partial, out);
}

// One warp per row: writes rows[i] to out + idx[i] * out_stride (rows fetched below the cache).
template <typename O, typename R>
__device__ __forceinline__ void scatter_rows_as(const R* __restrict__ rows, const int* __restrict__ idx, int n,
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

// The same of rows fetched as fp16 bits, written as fp32 (exactly) or fp16 (copied).
extern "C" __global__ void scatter_rows_r16(const unsigned short* __restrict__ rows, const int* __restrict__ idx, int n,
        float* __restrict__ out, long long out_stride, int dim) {
    scatter_rows_as(rows, idx, n, out, out_stride, dim);
}

extern "C" __global__ void scatter_rows_h_r16(const unsigned short* __restrict__ rows, const int* __restrict__ idx, int n,
        unsigned short* __restrict__ out, long long out_stride, int dim) {
    scatter_rows_as(rows, idx, n, out, out_stride, dim);
}
