"""bench/gpu/dlrm_v2_perf.py's exactness check before the timed runs: dlrm_v2_lookup's pooled rows
against float64 sums of the fixture's rows (recomputed from its seed), and dlrm_v2's predictions
against the PyTorch fp32 network on those sums."""
import time

import numpy as np

from .dlrm_v2_model import DIM, HOT, QUERY, START, calibration
from .dlrm_v2_plan import draw_pairs
from .fixture import SEED, TABLES, synthetic_rows
from .measure import METRICS_SETTLE_S, device_counts, metrics_text, per_device


def pooled_float64(sparse):
    """Each pair's bags summed in float64 from the fixture's rows (recomputed from its seed): [n, 26, 128]."""
    n = len(sparse)
    out = np.empty((n, TABLES, DIM), np.float64)
    for t, h in enumerate(HOT):
        keys = sparse[:, START[t]:START[t] + h].reshape(-1)
        out[:, t] = synthetic_rows(SEED, t, keys, DIM).reshape(n, h, DIM).astype(np.float64).sum(1)
    return out


def exactness(a, rows, failures):
    """dlrm_v2_lookup's pooled rows against float64 sums, dlrm_v2's predictions against the
    PyTorch fp32 network (the weights the package was exported from) on those sums."""
    import torch
    from .networks import dense_network
    ref32 = dense_network("dcnv2", "fp32", "cuda")
    ref16 = dense_network("dcnv2", a.network_precision, "cuda", cross=a.dcnv2_cross,
                          calibration=calibration(a))  # the exported module itself
    from concurrent.futures import ThreadPoolExecutor
    from kserve_client import Client
    sparse, dense = draw_pairs(rows, a.exact_requests * QUERY, a.alpha, seed=46)
    want = pooled_float64(sparse)
    worst = bad = 0
    worst32 = worst16 = 0.0
    text = metrics_text(a.port)
    before = {m: device_counts(a.port, m, text) for m in ("dlrm_v2_lookup", "dlrm_v2")}

    def ask(i):
        # every request from a client of its own, all at once: Triton spreads them over the
        # instances, so the instances of every GPU answer some (printed below)
        sl = slice(i * QUERY, (i + 1) * QUERY)
        c = Client(f"localhost:{a.port}")
        try:
            got = c.infer("dlrm_v2_lookup", {"KEYS": sparse[sl]}, ["OUTPUT0"])["OUTPUT0"].astype(np.float64)
            pred = c.infer("dlrm_v2", {"dense": dense[sl], "sparse": sparse[sl]}, ["prediction"])["prediction"]
        finally:
            c.close()
        return got, pred

    with ThreadPoolExecutor(max_workers=min(32, a.exact_requests)) as pool:
        answers = list(pool.map(ask, range(a.exact_requests)))
    time.sleep(METRICS_SETTLE_S)  # one publishing interval of the backend's metrics
    text = metrics_text(a.port)
    served = {m: per_device(before[m], device_counts(a.port, m, text), 1.0) for m in before}
    print("  exactness requests answered per GPU (share of inferences): " + "; ".join(
        f"{m} " + ", ".join(f"{d} {v:.2f}" for d, v in sorted(shares.items())) for m, shares in served.items()),
        flush=True)
    for i, (got, pred) in enumerate(answers):
        sl = slice(i * QUERY, (i + 1) * QUERY)
        diff = np.abs(got - want[sl])
        bad += int((diff > a.lookup_atol + a.lookup_rtol * np.abs(want[sl])).sum())
        worst = max(worst, float(diff.max()))
        with torch.no_grad():
            d = torch.from_numpy(dense[sl]).cuda()
            p = torch.from_numpy(want[sl]).float().cuda()
            w32 = ref32(d, p).cpu().numpy()
            w16 = ref16(d, p).cpu().numpy()
        worst32 = max(worst32, float(np.abs(pred - w32).max()))
        worst16 = max(worst16, float(np.abs(pred - w16).max()))
    lookup = {"requests": a.exact_requests, "pooled_rows": a.exact_requests * QUERY * TABLES, "max_abs_diff": worst,
              "bad_values": bad, "rtol": a.lookup_rtol, "atol": a.lookup_atol, "per_gpu": served}
    pred = {"predictions": a.exact_requests * QUERY, "max_abs_diff_fp32": worst32, "max_abs_diff_fp16": worst16,
            "bound": a.prediction_bound}
    print(f"  dlrm_v2_lookup: {lookup['pooled_rows']:,} pooled rows ({a.exact_requests} requests of 270 pairs, full bags) "
          f"against float64 sums of the fixture's rows: max abs diff {worst:.3g}; bound |diff| <= {a.lookup_atol} + "
          f"{a.lookup_rtol} x |sum| (fp16 rounding of the result): {bad} values outside", flush=True)
    print(f"  dlrm_v2: {pred['predictions']:,} predictions against the PyTorch fp32 network on those sums: max abs diff "
          f"{worst32:.3g} (bound {a.prediction_bound}); against the {a.network_precision} network the package was "
          f"exported from: "
          f"{worst16:.3g}", flush=True)
    if bad:
        failures.append(f"dlrm_v2_lookup: {bad} pooled values outside {a.lookup_atol} + {a.lookup_rtol} x |sum| "
                        f"(max abs diff {worst:.3g})")
    if not worst32 <= a.prediction_bound:
        failures.append(f"dlrm_v2: predictions {worst32:.3g} from the PyTorch fp32 reference (bound {a.prediction_bound})")
    del ref32, ref16
    torch.cuda.empty_cache()
    return {"lookup": lookup, "prediction": pred}
