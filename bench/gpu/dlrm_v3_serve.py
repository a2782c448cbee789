#!/usr/bin/env python3
"""The example DLRM-v3 (models/dlrm_v3's model: Config.tiny(), its seed, the normaliser fixed)
served on a KIND_GPU instance by the sequence recommender engine, checked rather than timed
(issue 68's GPU half; run.sh dlrm-v3-serve):

- the network exported in this run as a CUDA AOTInductor package (its attention our Triton
  kernel, examples/dlrm_v3/kernels.py), the tables in the store's format, a config asking for
  one instance on GPU 0: the lookup's rows written on the GPU and read there by the package;
- requests of different history and candidate counts sent at once over HTTP, each answer equal
  to the reference (examples/dlrm_v3/model.py, eager, on the same GPU) for that request alone,
  within --tolerance; the statistics' executions beside the requests;
- a request with an id past the item table and one whose history length disagrees with its
  ids, sent with the others: both refused naming the input, every other request answered.

`--device cpu` runs the same with a CPU package on KIND_CPU: how the script is checked here.
`--tables fp16` writes the tables in fp16 (as the benchmark's) and exports the package on fp16
rows, so the lookup hands the network the rows as stored. `--gpus 0,1` puts an instance on each
GPU listed; with `--sharded` the tables are placed once over those GPUs
(`gpucache_placement: sharded`, no copies, every row in GPU memory), so an instance reads the
tables placed on the other GPU through peer access.

    python3 bench/gpu/dlrm_v3_serve.py --server $TRITONSERVER --backends $BACKENDS [--device cpu]
        [--tables fp16] [--gpus 0,1 --sharded]

Writes its lines to $OUT/dlrm_v3_serve.txt when OUT is set; exits 1 when a check fails.
"""
import argparse
import dataclasses
import os
import sys
import tempfile
import threading
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples"))
from dlrm_v3 import data as dv3_data  # noqa: E402
from dlrm_v3 import export  # noqa: E402
from dlrm_v3 import model as dv3  # noqa: E402
from dlrm_v3.client import feeds  # noqa: E402
from kserve_client import Client, InferError  # noqa: E402
from recsys.transcript import Transcript  # noqa: E402
from tritonserver_process import serve  # noqa: E402

say = Transcript("dlrm_v3_serve.txt").say
MODEL = export.NAME


def config(kind: str, sharded: bool = False) -> str:
    """models/dlrm_v3's config, its instance `kind`; `sharded`: the tables placed once over the
    instances' GPUs."""
    with open(os.path.join(HERE, "..", "..", "models", MODEL, "config.pbtxt")) as f:
        text = f.read().replace("kind: KIND_CPU", kind)
    if sharded:
        text += "".join(f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}\n' for k, v in (
            ("gpucache_placement", "sharded"), ("gpucache_sharded_replicate", "0"), ("gpucacheper", "1.0")))
    return text


def send_all(port: int, jobs):
    """Every request's feeds sent at once, each from its own thread; [answer or InferError]."""
    got = [None] * len(jobs)
    start = threading.Barrier(len(jobs))

    def one(i):
        client = Client(f"localhost:{port}")
        start.wait()
        try:
            got[i] = client.infer(MODEL, jobs[i], ["predictions"])["predictions"]
        except InferError as e:
            got[i] = e
        finally:
            client.close()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return got


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", required=True)
    p.add_argument("--backends", required=True)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--port", type=int, default=8750)
    p.add_argument("--tables", choices=["fp32", "fp16"], default="fp32",
                   help="the tables' rows (fp16: the network takes them as stored)")
    p.add_argument("--gpus", default="0", help="the GPUs an instance each goes on (KIND_GPU)")
    p.add_argument("--sharded", action="store_true", help="the tables placed once over --gpus (see above)")
    p.add_argument("--tolerance", type=float, default=None,
                   help="max |served - reference| (default 2e-3 on a GPU: the kernel's dots may run on TF32; 1e-5 on the CPU)")
    a = p.parse_args()
    dev = a.device
    tol = a.tolerance if a.tolerance is not None else (2e-3 if dev == "cuda" else 1e-5)
    say(f"device: {torch.cuda.get_device_name(0) if dev == 'cuda' else 'CPU'}; torch {torch.__version__}")
    ranker = export.ranker()
    if a.tables == "fp16":
        ranker = dv3.HstuRanker(dataclasses.replace(ranker.cfg, table_dtype=torch.float16)).eval()
    cfg = ranker.cfg
    ok = True
    with tempfile.TemporaryDirectory() as repo:
        t0 = time.time()
        export.write_version(os.path.join(repo, MODEL, "1"), ranker, export.example_batch(), device=dev)
        kind = f"kind: KIND_GPU gpus: [ {', '.join(a.gpus.split(','))} ]" if dev == "cuda" else "kind: KIND_CPU"
        with open(os.path.join(repo, MODEL, "config.pbtxt"), "w") as f:
            f.write(config(kind, a.sharded))
        say(f"tables ({a.tables}) and a {dev} package written in {time.time() - t0:.0f} s; instances {kind}"
            + ("; the tables sharded over those GPUs" if a.sharded else ""))
        reference = ranker.to(dev)
        data = dv3_data.DataConfig.tiny(seconds_per_timestamp=3600, min_candidates=2)
        requests = dv3_data.generate_batch(data, a.requests, 1, 9).requests()
        jobs = [feeds(r) for r in requests]
        bad_id = feeds(requests[0])
        bad_id["hist_item_ids"] = bad_id["hist_item_ids"].copy()
        bad_id["hist_item_ids"][0, 0] = cfg.num_item_rows
        bad_len = feeds(requests[1])
        bad_len["hist_lengths"] = bad_len["hist_lengths"] + 1
        with serve(a.server, repo, a.backends, a.port, os.path.join(os.environ.get("OUT", repo), "dlrm_v3_server.log")) as client:
            before = client.stats(MODEL)
            got = send_all(a.port, jobs)
            after = client.stats(MODEL)
            worst = 0.0
            with torch.no_grad():
                for i, (r, answer) in enumerate(zip(requests, got)):
                    if isinstance(answer, InferError):
                        say(f"request {i}: refused: {answer}")
                        ok = False
                        continue
                    one = dv3.Batch.from_requests([r]).to(dev)
                    want = reference.score_candidates(one).float().cpu().numpy()
                    worst = max(worst, float(np.abs(answer - want).max()))
            n_exec = after["execution_count"] - before["execution_count"]
            n_inf = after["inference_count"] - before["inference_count"]
            fine = worst <= tol
            ok &= fine
            say(f"{len(requests)} requests at once over HTTP (histories "
                f"{min(len(r.item_ids) for r in requests)}-{max(len(r.item_ids) for r in requests)}, candidates "
                f"{min(len(r.cand_item_ids) for r in requests)}-{max(len(r.cand_item_ids) for r in requests)}): "
                f"{n_inf} inferences in {n_exec} executions; largest difference from the reference on the same "
                f"device {worst:.1e} ({'within' if fine else 'PAST'} {tol:g})")
            mixed = send_all(a.port, [bad_id, jobs[2], bad_len, jobs[3]])
            for what, answer, word in (("an id past the item table", mixed[0], "hist_item_ids"),
                                       ("hist_lengths one past its ids", mixed[2], "hist_lengths")):
                refused = isinstance(answer, InferError) and word in str(answer)
                ok &= refused
                say(f"{what}: {'refused: ' + str(answer) if isinstance(answer, InferError) else 'ANSWERED'}"
                    f"{'' if refused else ' (the input is not named: FAIL)'}")
            for i, answer in ((2, mixed[1]), (3, mixed[3])):
                same = not isinstance(answer, InferError) and float(np.abs(answer - got[i]).max()) <= tol
                ok &= same
                say(f"request {i} beside them: {'answered as before' if same else 'NOT answered as before: FAIL'}")
    say("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
