#!/usr/bin/env python3
"""How to get host inputs onto the GPU fastest (issue 9): times, for a ResNet50 FP16 batch
of 1 and 128 (301 KB, 38.5 MB) in pageable host memory, each way of staging it, as the
CPU sees it (enqueue) and until the GPU has it (done):
  pin: src.pin_memory() then .to(dev, non_blocking) (torch's caching host allocator);
  pageable: src.to(dev) straight from pageable memory;
  buffer: copy into one reused pinned buffer, then one async copy;
  chunked: the same in 4 MB chunks, each chunk's async copy queued after its memcpy."""
import time

import torch

dev = torch.device("cuda:0")
print(f"GPU: {torch.cuda.get_device_name(dev)}; torch {torch.__version__}")
s = torch.cuda.Stream()
CH = 4 << 20


def timeit(fn, n):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    enq, done = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        s.synchronize()
        t2 = time.perf_counter()
        enq.append(t1 - t0)
        done.append(t2 - t0)
    enq.sort()
    done.sort()
    return enq[n // 2] * 1e6, done[n // 2] * 1e6


for batch in (1, 128):
    src = torch.randn(batch, 3, 224, 224).half()
    flat = src.view(-1).view(torch.uint8)
    n = flat.numel()
    pinned = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(n, dtype=torch.uint8, device=dev)
    print(f"batch {batch}: {n / 1e6:.1f} MB; pinned buffer is_pinned={pinned.is_pinned()}")

    def pin():
        with torch.cuda.stream(s):
            src.pin_memory().to(dev, non_blocking=True)

    def pageable():
        with torch.cuda.stream(s):
            src.to(dev)

    def buffer():
        with torch.cuda.stream(s):
            pinned.copy_(flat)
            dst.copy_(pinned, non_blocking=True)

    def chunked():
        with torch.cuda.stream(s):
            for o in range(0, n, CH):
                k = min(CH, n - o)
                pinned[o:o + k].copy_(flat[o:o + k])
                dst[o:o + k].copy_(pinned[o:o + k], non_blocking=True)

    def memcpy_only():
        pinned.copy_(flat)

    for name, fn in (("pin", pin), ("pageable", pageable), ("buffer", buffer), ("chunked", chunked), ("memcpy into pinned only", memcpy_only)):
        e, d = timeit(fn, 50 if batch > 1 else 300)
        print(f"  {name:<24} enqueue {e:8.0f} us   done {d:8.0f} us")
