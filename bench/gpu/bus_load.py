#!/usr/bin/env python3
"""Keeps the bus busy carrying page-locked host memory up to the GPU, as a served 10% cache's
missed rows go up (80 M rows a second of 256 bytes: about 20 GB/s), so that a plain host gather
run beside it shows what the host's memory reads while the GPU's copies read it too.

    python3 bench/gpu/bus_load.py --seconds 40 [--gbps 20] [--mb 42]   # 0 GB/s: as fast as it goes

Copies of --mb MB (a served batch's rows) from four page-locked buffers in turn, on one stream,
each waited for; with --gbps the next copy starts no sooner than that rate allows. Prints the
rate it kept (GB/s, 1e9 bytes) when the time is up.
"""
import argparse
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--gbps", type=float, default=20.0, help="0: as fast as the bus goes")
    ap.add_argument("--mb", type=int, default=42)
    a = ap.parse_args()
    n = a.mb << 20
    hosts = [torch.full((n,), i, dtype=torch.uint8).pin_memory() for i in range(4)]
    dev = torch.empty(n, dtype=torch.uint8, device="cuda")
    stream = torch.cuda.Stream()
    moved, begun = 0, time.perf_counter()
    with torch.cuda.stream(stream):
        while (now := time.perf_counter()) - begun < a.seconds:
            if a.gbps > 0 and moved / 1e9 / a.gbps > now - begun:
                time.sleep(min(moved / 1e9 / a.gbps - (now - begun), 0.01))
                continue
            dev.copy_(hosts[(moved // n) % len(hosts)], non_blocking=True)
            stream.synchronize()
            moved += n
    took = time.perf_counter() - begun
    target = f"{a.gbps:g} GB/s asked" if a.gbps > 0 else "as fast as it goes"
    print(f"bus load: {moved / 1e9 / took:.1f} GB/s up for {took:.0f} s ({target}, copies of {a.mb} MB)", flush=True)


if __name__ == "__main__":
    main()
