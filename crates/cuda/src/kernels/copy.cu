// Many copies of device memory in one launch (src/copy.rs): a batch's inputs gathered from
// its requests' buffers, and its outputs written into the requests' responses. One launch
// costs the driver once; a copy call per part cost it once a part (about 10 us each from
// the CUDA-IPC memory of clients' shared-memory regions, measured on an H100).
// Compiled at run time by NVRTC (src/kernels.rs) once per device.
typedef unsigned long long u64;
#define COPY_PARTS 128

// The parts of one launch, passed by value (3 KB of the 4 KB of kernel parameters).
struct Parts {
    u64 src[COPY_PARTS];
    u64 dst[COPY_PARTS];
    u64 len[COPY_PARTS];
};

template <typename T>
__device__ __forceinline__ void copy_as(const T* __restrict__ s, T* __restrict__ d, u64 n, u64 i, u64 step) {
    for (; i < n; i += step) d[i] = s[i];
}

// Block row y copies part y, in the widest unit both of its ends and its length allow.
extern "C" __global__ void copy_parts(Parts p, int n) {
    int k = blockIdx.y;
    if (k >= n) return;
    u64 s = p.src[k], d = p.dst[k], len = p.len[k];
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x, step = (u64)gridDim.x * blockDim.x;
    u64 all = s | d | len;
    if ((all & 15) == 0) copy_as((const uint4*)s, (uint4*)d, len >> 4, i, step);
    else if ((all & 7) == 0) copy_as((const uint2*)s, (uint2*)d, len >> 3, i, step);
    else if ((all & 3) == 0) copy_as((const unsigned*)s, (unsigned*)d, len >> 2, i, step);
    else copy_as((const unsigned char*)s, (unsigned char*)d, len, i, step);
}
