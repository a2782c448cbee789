// Every kernel a process runs on the GPU, with its start and end on the GPU's clock, for
// seeing what runs beside what while a server serves (the GPU cache's lookups beside the
// networks): a CUDA injection library. Loaded by the CUDA driver into any process whose
// environment names it (CUDA_INJECTION64_PATH=.../libkernel_trace.so) and says where to write
// (TRITON_RUST_KERNEL_TRACE=FILE), in the process named by TRITON_RUST_KERNEL_TRACE_PROCESS
// (tritonserver unless set: the clients beside it use CUDA too); it enables CUPTI's concurrent-kernel activity records and
// writes one binary record a kernel (start_ns u64, end_ns u64, stream u32, name u32: an index
// into the names, each written once as a record with start 0 and end its length, then its
// bytes). bench/gpu/kernel_trace.py reads the file. Built by bench/gpu/pack.sh (its own tool,
// outside the backend) against CUPTI's headers from PyPI (nvidia-cuda-cupti); CUPTI itself is
// opened at run time from TRITON_RUST_CUPTI (the libcupti.so.13 of the torch on the GPU
// machine), so nothing else the process loads is looked for anywhere new.
#define _GNU_SOURCE  // program_invocation_short_name
#include <cupti.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BUFFER_BYTES (8u << 20)
#define SLOTS 8192  // a power of two, well over the kernels a server runs

static FILE *out;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
// CUPTI shares one name string among every record of a kernel, so the pointer names it
static const char *slot_name[SLOTS];
static uint32_t slot_index[SLOTS];
static uint32_t name_count;
static uint64_t dropped;

// CUPTI's functions this uses, found in TRITON_RUST_CUPTI
static CUptiResult (*get_next)(uint8_t *, size_t, CUpti_Activity **);
static CUptiResult (*get_dropped)(CUcontext, uint32_t, size_t *);
static CUptiResult (*flush_all)(uint32_t);

// A kernel name's index, the name written out the first time it is seen (under `lock`).
static uint32_t name_index(const char *name) {
    if (name == NULL) name = "?";
    uintptr_t h = ((uintptr_t)name >> 3) * 0x9e3779b97f4a7c15ull;
    for (uint32_t probe = 0; probe < SLOTS; ++probe) {
        uint32_t s = (uint32_t)((h >> 40) + probe) & (SLOTS - 1);
        if (slot_name[s] == name) return slot_index[s];
        if (slot_name[s] != NULL) continue;
        slot_name[s] = name;
        slot_index[s] = name_count++;
        uint64_t head[2] = {0, strlen(name)};
        uint32_t tail[2] = {0, slot_index[s]};
        fwrite(head, sizeof head, 1, out);
        fwrite(tail, sizeof tail, 1, out);
        fwrite(name, 1, head[1], out);
        return slot_index[s];
    }
    return UINT32_MAX;  // the table full: one index for every other kernel
}

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    *buffer = aligned_alloc(8, BUFFER_BYTES);
    *size = *buffer ? BUFFER_BYTES : 0;
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size,
                                      size_t valid) {
    (void)size;
    CUpti_Activity *r = NULL;
    pthread_mutex_lock(&lock);
    while (get_next(buffer, valid, &r) == CUPTI_SUCCESS) {
        if (r->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && r->kind != CUPTI_ACTIVITY_KIND_KERNEL)
            continue;
        // CUPTI 13's record; CUPTI 12's (CUpti_ActivityKernel9) has these fields at the same places
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)r;
        uint64_t when[2] = {k->start, k->end};
        uint32_t what[2] = {k->streamId, name_index(k->name)};
        fwrite(when, sizeof when, 1, out);
        fwrite(what, sizeof what, 1, out);
    }
    size_t lost = 0;
    if (get_dropped(ctx, stream, &lost) == CUPTI_SUCCESS) dropped += lost;
    pthread_mutex_unlock(&lock);
    free(buffer);
}

static void finish(void) {
    flush_all(1);
    pthread_mutex_lock(&lock);
    if (dropped) fprintf(stderr, "kernel_trace: %llu records dropped\n", (unsigned long long)dropped);
    fflush(out);
    pthread_mutex_unlock(&lock);
}

// Called by the CUDA driver at its initialization in a process that names this library.
int InitializeInjection(void) {
    const char *only = getenv("TRITON_RUST_KERNEL_TRACE_PROCESS");
    if (strcmp(program_invocation_short_name, only ? only : "tritonserver") != 0) return 1;
    const char *path = getenv("TRITON_RUST_KERNEL_TRACE"), *lib = getenv("TRITON_RUST_CUPTI");
    void *cupti = lib ? dlopen(lib, RTLD_NOW | RTLD_LOCAL) : NULL;
    if (cupti == NULL) {
        fprintf(stderr, "kernel_trace: no CUPTI at TRITON_RUST_CUPTI (%s); not tracing\n", lib ? dlerror() : "unset");
        return 1;
    }
    CUptiResult (*register_callbacks)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc) =
        (CUptiResult(*)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc))dlsym(cupti, "cuptiActivityRegisterCallbacks");
    CUptiResult (*enable)(CUpti_ActivityKind) = (CUptiResult(*)(CUpti_ActivityKind))dlsym(cupti, "cuptiActivityEnable");
    CUptiResult (*flush_period)(uint32_t) = (CUptiResult(*)(uint32_t))dlsym(cupti, "cuptiActivityFlushPeriod");
    get_next = (CUptiResult(*)(uint8_t *, size_t, CUpti_Activity **))dlsym(cupti, "cuptiActivityGetNextRecord");
    get_dropped = (CUptiResult(*)(CUcontext, uint32_t, size_t *))dlsym(cupti, "cuptiActivityGetNumDroppedRecords");
    flush_all = (CUptiResult(*)(uint32_t))dlsym(cupti, "cuptiActivityFlushAll");
    if (!register_callbacks || !enable || !flush_period || !get_next || !get_dropped || !flush_all) {
        fprintf(stderr, "kernel_trace: %s lacks CUPTI's activity functions; not tracing\n", lib);
        return 1;
    }
    if (path == NULL || (out = fopen(path, "wb")) == NULL) {
        fprintf(stderr, "kernel_trace: no TRITON_RUST_KERNEL_TRACE file to write; not tracing\n");
        return 1;
    }
    if (register_callbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
        enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
        fprintf(stderr, "kernel_trace: CUPTI refused the kernel records; not tracing\n");
        return 1;
    }
    flush_period(1000);  // each second, so a killed server still leaves most of it
    atexit(finish);
    fprintf(stderr, "kernel_trace: every kernel's start and end into %s\n", path);
    return 1;
}
