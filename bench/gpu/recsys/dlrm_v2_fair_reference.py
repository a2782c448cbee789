"""bench/gpu/dlrm_v2_fair.py's bare PyTorch reference, run in a child process of its own
(dlrm_v2_fair.py --reference-worker): F.embedding_bag over the 26 fp16 tables and the network
torch.compile'd, as CUDA graphs, timed by CUDA events one after the other and overlapped on
streams; its accuracy on the served exactness check's pairs."""
import json
import time

from .dlrm_v2_fair_model import DIM, EXACT_PAIRS, HOT, TABLES, log


def accuracy_inputs(rows, alpha, pairs):
    """The served exactness check's pairs (dlrm_v2_perf.py's: dlrm_v2_plan.draw_pairs, seed 46): dense
    [n, 13] float32, the float64 sums of their rows [n, 26, 128], and per table the rows the bags
    read, in bag order (float32 holding the fixture's fp16 values exactly)."""
    import numpy as np
    from .dlrm_v2_model import START
    from .dlrm_v2_plan import draw_pairs
    from .fixture import SEED, synthetic_rows
    sparse, dense = draw_pairs(rows, pairs, alpha, seed=46)
    sums = np.empty((pairs, TABLES, DIM), np.float64)
    bag_rows = []
    for t, h in enumerate(HOT):
        r = synthetic_rows(SEED, t, sparse[:, START[t]:START[t] + h].reshape(-1), DIM)
        sums[:, t] = r.reshape(pairs, h, DIM).astype(np.float64).sum(1)
        bag_rows.append(r)
    return dense, sums, bag_rows


class Timer:
    """Batches launched on streams, timed by CUDA events (host clock on the CPU)."""

    def __init__(self, cuda):
        import torch
        self.torch, self.cuda = torch, cuda

    def stream(self):
        return self.torch.cuda.Stream() if self.cuda else None

    def run(self, lanes, rounds):
        """lanes: [(stream, [launch, ...])]; each round launches the next of each lane's launches on
        its stream. Seconds from before the first launch to the end of the last batch of every lane."""
        torch = self.torch
        if not self.cuda:
            t0 = time.perf_counter()
            for r in range(rounds):
                for _, ls in lanes:
                    ls[r % len(ls)]()
            return time.perf_counter() - t0
        main = torch.cuda.current_stream()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(main)
        for s, _ in lanes:
            s.wait_stream(main)
        for r in range(rounds):
            for s, ls in lanes:
                with torch.cuda.stream(s):
                    ls[r % len(ls)]()
        for s, _ in lanes:
            main.wait_stream(s)
        end.record(main)
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    def batches_per_s(self, lanes, total, repeats):
        """The median over `repeats` windows of batches a second, each window about `total` batches
        spread over the lanes (after one short window to warm up)."""
        rounds = max(2, total // len(lanes))
        self.run(lanes, max(2, rounds // 4))
        rates = sorted(rounds * len(lanes) / self.run(lanes, rounds) for _ in range(repeats))
        return rates[len(rates) // 2], rates


def reference_worker(a):
    """The bare PyTorch reference of every precision; writes its figures to --reference-worker."""
    import numpy as np
    import torch
    import torch.nn.functional as F
    import stream_load
    import dlrm_v2
    from .fixture import SEED, fixture_rows
    from .networks import dense_network, linear_flops
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    tm = Timer(cuda)
    rows = fixture_rows(a.scale)
    B = a.batch
    out = {"batch": B, "device": torch.cuda.get_device_name(0) if cuda else "cpu", "torch": torch.__version__,
           "scale": a.scale, "rows": sum(rows), "table_gb": sum(rows) * DIM * 2 / 1e9, "cross": a.cross,
           "streams": a.stream_list, "iters": a.iters, "repeats": a.repeats, "cuda_graphs": cuda,
           "compiled": cuda, "precisions": {}}

    t0 = time.time()
    n_exact = min(EXACT_PAIRS, B)
    ex_dense, ex_sums, ex_rows = accuracy_inputs(rows, a.alpha, n_exact)
    with torch.no_grad():
        ex_pooled = torch.stack([F.embedding_bag(torch.arange(len(r), device=dev),
                                                 torch.from_numpy(r).to(dev).half(),
                                                 torch.arange(n_exact, device=dev) * h, mode="sum")
                                 for r, h in zip(ex_rows, HOT)], dim=1)
        ref32 = dense_network("dcnv2", "fp32", dev)
        ex_d = torch.from_numpy(ex_dense).to(dev)
        want = ref32(ex_d, torch.from_numpy(ex_sums).float().to(dev)).float()
    del ref32, ex_rows
    out["accuracy_inputs_s"] = time.time() - t0
    log(f"  accuracy inputs: the served check's {n_exact:,} pairs, their rows pooled by F.embedding_bag, the fp32 "
        f"network on their float64 sums ({time.time() - t0:.0f} s); pooled fp16 against float64: max abs diff "
        f"{float((ex_pooled.double().cpu() - torch.from_numpy(ex_sums)).abs().max()):.3g}")

    t0 = time.time()
    # values do not matter for timing; the shapes are the served tables'
    tables = [torch.empty((r, DIM), dtype=torch.half, device=dev).normal_(0.0, 0.05) for r in rows]
    offsets = [torch.arange(B, device=dev, dtype=torch.int64) * h for h in HOT]
    gen = torch.Generator(device=dev).manual_seed(SEED + 65)
    n_slots = max(4, max(a.stream_list))
    # each slot a batch of its own: keys (the served Zipf law), dense features, its graphs' buffers
    slots = [{"keys": [stream_load.torch_spread(stream_load.torch_zipf_ranks(gen, r, a.alpha, B * h, dev), r)
                       for r, h in zip(rows, HOT)],
              "dense": torch.rand(B, 13, device=dev, generator=gen)} for _ in range(n_slots)]
    if cuda:
        torch.cuda.synchronize()
    out["tables_s"] = time.time() - t0
    log(f"  {len(tables)} fp16 tables in {'HBM' if cuda else 'memory'} ({out['table_gb']:.1f} GB), {n_slots} batches "
        f"of {B:,} pairs' keys ({time.time() - t0:.0f} s)")

    def lookup(keys):
        return torch.stack([F.embedding_bag(k, w, o, mode="sum") for k, w, o in zip(keys, tables, offsets)], dim=1)

    calib = dlrm_v2.calibration_inputs()
    for prec in a.precision_list:
        x = {}
        out["precisions"][prec] = x
        t0 = time.time()
        with torch.no_grad():
            pooled0 = lookup(slots[0]["keys"])
        net = fn = None
        # the served package's form first; should its compile fail, the cross layers as written (said)
        for cross in dict.fromkeys([a.cross if cuda else "torch", "torch"]):
            torch._dynamo.reset()
            try:
                net = dense_network("dcnv2", prec, dev, cross=cross, calibration=calib if prec == "fp8" else None)
                fn = torch.compile(net, dynamic=False) if cuda else net
                with torch.no_grad():
                    fn(slots[0]["dense"], pooled0)
                if cuda:
                    torch.cuda.synchronize()
                x["cross"] = cross
                break
            except Exception as e:  # noqa: BLE001 - said in the results
                x.setdefault("errors", []).append(f"cross {cross}: {str(e)[:400]}")
                log(f"  {prec}: the network with cross layers {cross} failed: {str(e)[:400]}")
                net = fn = None
        if fn is None:
            x["error"] = "the network did not compile"
            continue
        fpp, layers = linear_flops(net)
        x["flops_per_pair"], x["linear_layers"] = fpp, layers
        x["compile_s"] = time.time() - t0
        log(f"  {prec}: the network ({fpp / 1e6:.2f} MFLOP a pair over {layers} linear layers, cross layers "
            f"{x['cross']}) {'compiled' if cuda else 'eager'} at batch {B:,} in {x['compile_s']:.0f} s")

        # the launches: CUDA graphs of each slot's lookup + network, lookup alone, network alone
        t0 = time.time()
        graphs, keep = [], []

        def capture(body):
            """A launch of `body`: a CUDA graph of it (warmed up on the capture stream first), or,
            where capture fails or on the CPU, the call itself. (launch, its output)."""
            if not cuda or x.get("graphs") is False:
                return body, None
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(2):
                    body()
            torch.cuda.current_stream().wait_stream(s)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=s):
                res = body()
            graphs.append(g)
            keep.append(res)
            return g.replay, res

        try:
            with torch.no_grad():
                net_in = {"dense": slots[0]["dense"], "pooled": pooled0}
                net_launch, net_out = capture(lambda: fn(net_in["dense"], net_in["pooled"]))
                lookup_launch = [capture(lambda s=s: lookup(s["keys"]))[0] for s in slots[:4]]
                step_launch = [capture(lambda s=s: fn(s["dense"], lookup(s["keys"])))[0] for s in slots]
            x["graphs"] = cuda
        except Exception as e:  # noqa: BLE001 - the eager launches are timed instead, and that is said
            log(f"  {prec}: CUDA graph capture failed ({str(e)[:300]}); timing the eager launches instead")
            x["graphs"], x["graph_error"] = False, str(e)[:500]
            graphs.clear()
            keep.clear()
            torch.cuda.synchronize()
            net_in = {"dense": slots[0]["dense"], "pooled": pooled0}
            net_launch, net_out = (lambda: fn(net_in["dense"], net_in["pooled"])), None
            lookup_launch = [(lambda s=s: lookup(s["keys"])) for s in slots[:4]]
            step_launch = [(lambda s=s: fn(s["dense"], lookup(s["keys"]))) for s in slots]
        x["capture_s"] = time.time() - t0

        with torch.no_grad():
            one = tm.stream()
            net_rate, _ = tm.batches_per_s([(one, [net_launch])], a.iters, a.repeats)
            lookup_rate, _ = tm.batches_per_s([(one, lookup_launch)], a.iters, a.repeats)
            serial_rate, serial_all = tm.batches_per_s([(one, step_launch)], a.iters, a.repeats)
            x["net_s"], x["lookup_s"] = 1 / net_rate, 1 / lookup_rate
            x["tflops"] = fpp * B * net_rate / 1e12
            x["lookup_gb_per_s"] = B * sum(HOT) * DIM * 2 * lookup_rate / 1e9
            x["serial_pairs_per_s"] = B * serial_rate
            x["serial_windows"] = [B * r for r in serial_all]
            x["ideal_pairs_per_s"] = B / max(x["net_s"], x["lookup_s"])
            x["overlap"] = {}
            if cuda:
                for n in a.stream_list:
                    streams = [tm.stream() for _ in range(n)]
                    lanes = [(s, [step_launch[i] for i in range(len(step_launch)) if i % n == j])
                             for j, s in enumerate(streams)]
                    rate, rates = tm.batches_per_s(lanes, a.iters, a.repeats)
                    x["overlap"][str(n)] = {"pairs_per_s": B * rate, "windows": [B * r for r in rates]}
            best = max(x["overlap"].items(), key=lambda kv: kv[1]["pairs_per_s"]) if x["overlap"] else None
            x["overlap_best_streams"] = int(best[0]) if best else None
            x["overlap_pairs_per_s"] = best[1]["pairs_per_s"] if best else None

            # accuracy: the timed network (its graph) on the served check's pairs
            n = n_exact
            net_in["dense"][:n].copy_(ex_d)
            net_in["pooled"][:n].copy_(ex_pooled)
            if net_out is not None:
                net_launch()
                got = net_out[:n].float()
            else:
                got = fn(net_in["dense"], net_in["pooled"])[:n].float()
            diff = (got - want).abs()
            x["accuracy_fp32"] = float(diff.max())
            x["accuracy_mean_fp32"] = float(diff.mean())
            x["accuracy_pairs"] = n
        log(f"  {prec} reference, batch {B:,}: network {x['net_s'] * 1e3:.3f} ms ({x['tflops']:.0f} TFLOP/s), lookup "
            f"{x['lookup_s'] * 1e3:.3f} ms ({x['lookup_gb_per_s']:.0f} GB/s of rows); one after the other "
            f"{x['serial_pairs_per_s'] / 1e6:.2f} M pairs/s; overlapped "
            + (", ".join(f"{k} streams {v['pairs_per_s'] / 1e6:.2f} M" for k, v in x["overlap"].items()) or "-")
            + f"; ideal overlap {x['ideal_pairs_per_s'] / 1e6:.2f} M; predictions vs fp32 max abs diff "
            f"{x['accuracy_fp32']:.3g} ({'CUDA graphs' if x['graphs'] else 'eager launches'})")
        del graphs, keep, net, fn, step_launch, lookup_launch, net_launch, net_out, pooled0, net_in
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        with open(a.reference_worker, "w") as f:
            json.dump(out, f, indent=1)  # each precision's figures kept should a later one fail
    with open(a.reference_worker, "w") as f:
        json.dump(out, f, indent=1)
    return 0
