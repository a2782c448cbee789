#!/usr/bin/env python3
"""The bus between the host and the GPU alone: copies of page-locked host memory to the GPU and
back, on one stream and on four at once, each direction alone and both together (torch, CUDA
events around each round). What the served runs' copies (keys up, missed rows up, answers down)
are held against: `cache_runs.sh` samples the bus's traffic while each run serves
(`nvidia-smi dmon -s t`) and its summary sets it beside this.

    python3 bench/gpu/pcie_bandwidth.py [--mb 64] [--rounds 20]     # prints GB/s a case
"""
import argparse

import torch


def rate(directions, streams, mb, rounds):
    """GB/s (1e9 bytes) moved a second by `streams` streams, each copying `mb` MB in every
    direction of `directions` ('up', 'down') each round."""
    n = mb * 1 << 20
    pairs = []
    for _ in range(streams):
        host = torch.empty(n, dtype=torch.uint8).pin_memory()
        dev = torch.empty(n, dtype=torch.uint8, device="cuda")
        pairs.append((host, dev, torch.cuda.Stream()))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for warm in (True, False):
        torch.cuda.synchronize()
        start.record()
        for _ in range(2 if warm else rounds):
            for host, dev, s in pairs:
                with torch.cuda.stream(s):
                    if "up" in directions:
                        dev.copy_(host, non_blocking=True)
                    if "down" in directions:
                        host.copy_(dev, non_blocking=True)
        for _, _, s in pairs:
            torch.cuda.current_stream().wait_stream(s)
        end.record()
        torch.cuda.synchronize()
    secs = start.elapsed_time(end) / 1e3
    return streams * len(directions) * n * rounds / secs / 1e9


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=20)
    a = ap.parse_args()
    print(f"{torch.cuda.get_device_name()}: page-locked copies of {a.mb} MB, {a.rounds} rounds (GB/s)")
    print("| directions | 1 stream | 4 streams |")
    print("|---|---:|---:|")
    for d in (("up",), ("down",), ("up", "down")):
        r1, r4 = rate(d, 1, a.mb, a.rounds), rate(d, 4, a.mb, a.rounds)
        print(f"| {' and '.join(d)} | {r1:.1f} | {r4:.1f} |")


if __name__ == "__main__":
    main()
