"""The exactness checks: rows the embedding model serves against the rows the fixture defines
(recomputed from its seed), and the single model's predictions against the ensemble's."""
import numpy as np

from .fixture import SEED, TABLES, synthetic_rows


def exactness_cuda_shm(client, name, dim, reqs, batch=1024):
    """Served rows of <name>_sparse for keys sent in CUDA shared memory (the lookup reads them
    on the GPU), against the fixture's rows. The keys are copied into a cudaMalloc'd buffer and
    shared with the server through its cudaIpcMemHandle_t, as Triton's own clients do."""
    from cuda_shm import Region
    worst, checked = 0.0, 0
    for k, (s, _) in enumerate(reqs):
        s = np.ascontiguousarray(s[:batch])
        with Region(client, f"exact_{name}_{k}", s.nbytes) as region:
            region.write(s)
            got = client.infer(f"{name}_sparse", {}, ["OUTPUT0"],
                               shm={"KEYS": (region.name, 0, s.nbytes, s.shape, np.int64)})["OUTPUT0"]
        for t in range(TABLES):
            worst = max(worst, float(np.abs(got[:, t, :].astype(np.float32) - synthetic_rows(SEED, t, s[:, t], dim)).max()))
        checked += s.size
    return {"rows_checked": checked, "rows_max_abs_diff": worst}


def exactness(client, name, rows, dim, reqs, batch=1024):
    """Served rows of <name>_sparse against the fixture's rows; the single model vs the ensemble."""
    worst_rows = 0.0
    checked = 0
    worst_pred = 0.0
    for s, d in reqs:
        s, d = s[:batch], d[:batch]
        got = client.infer(f"{name}_sparse", {"KEYS": s}, ["OUTPUT0"])["OUTPUT0"]
        for t in range(TABLES):
            want = synthetic_rows(SEED, t, s[:, t], dim)
            worst_rows = max(worst_rows, float(np.abs(got[:, t, :] - want).max()))
        checked += s.size
        ens = client.infer(f"{name}_ens", {"dense": d, "sparse": s}, ["prediction"])["prediction"]
        one = client.infer(f"{name}_one", {"dense": d, "sparse": s}, ["prediction"])["prediction"]
        worst_pred = max(worst_pred, float(np.abs(ens - one).max()))
    return {"rows_checked": checked, "rows_max_abs_diff": worst_rows, "single_vs_ensemble_max_abs_diff": worst_pred}


def exactness_problems(e, bound):
    """What an exactness result shows wrong: rows not the fixture's, or the single model's
    predictions farther than `bound` from the ensemble's."""
    problems = []
    if e.get("rows_max_abs_diff", 0.0) != 0.0:
        problems.append(f"served rows differ from the fixture's by {e['rows_max_abs_diff']}")
    diff = e.get("single_vs_ensemble_max_abs_diff")
    if diff is not None and not diff <= bound:
        problems.append(f"the single model's predictions differ from the ensemble's by {diff} (bound {bound})")
    return problems
