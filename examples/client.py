#!/usr/bin/env python3
"""Send sample requests to the ResNet50 and BERT QA models served by libtriton_rust.

    python examples/client.py                              # HTTP on localhost:8000
    python examples/client.py --grpc --url localhost:8001  # gRPC
    python examples/client.py --models bert --bert bert_small

ResNet50 gets a random image (fixed seed) and prints the top-5 class ids and logits.
BERT gets a fake tokenized question/context pair (ids from a fixed seed, segment ids 0 then 1,
mask 1 then 0 on padding) and prints the best answer span with its start/end logits.
Exits non-zero on any error.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

SEQ_LEN = 384


def fake_squad_example(seed: int, seq_len: int = SEQ_LEN, vocab_size: int = 30522):
    """[CLS] question [SEP] context [SEP] padding, as int32 arrays of shape [1, seq_len]."""
    rng = np.random.default_rng(seed)
    q_len, c_len = 14, 200
    total = q_len + c_len + 3
    ids = np.zeros((1, seq_len), dtype=np.int32)
    seg = np.zeros((1, seq_len), dtype=np.int32)
    mask = np.zeros((1, seq_len), dtype=np.int32)
    toks = rng.integers(1000, vocab_size, size=total, dtype=np.int32)
    toks[0] = 101             # [CLS]
    toks[q_len + 1] = 102     # [SEP] after the question
    toks[total - 1] = 102     # [SEP] after the context
    ids[0, :total] = toks
    seg[0, q_len + 2:total] = 1
    mask[0, :total] = 1
    context = (q_len + 2, total - 1)  # [first, last) token positions of the context
    return ids, seg, mask, context


def best_span(start_logits, end_logits, first, last, max_answer_len=30):
    """Best (start, end) with first <= start <= end < last and end - start < max_answer_len."""
    best = (first, first, -np.inf)
    for s in range(first, last):
        e_hi = min(last, s + max_answer_len)
        e = s + int(np.argmax(end_logits[s:e_hi]))
        score = float(start_logits[s] + end_logits[e])
        if score > best[2]:
            best = (s, e, score)
    return best


class Client:
    def __init__(self, url: str, use_grpc: bool, timeout: float):
        self.use_grpc = use_grpc
        self.timeout = timeout
        if use_grpc:
            import tritonclient.grpc as tc
        else:
            import tritonclient.http as tc
        self.tc = tc
        if use_grpc:
            self.client = tc.InferenceServerClient(url=url)
        else:
            self.client = tc.InferenceServerClient(url=url, connection_timeout=timeout,
                                                   network_timeout=timeout)

    def check_ready(self, model: str):
        if not self.client.is_server_live():
            raise RuntimeError("server is not live")
        if not self.client.is_model_ready(model):
            raise RuntimeError(f"model {model!r} is not ready")

    def infer(self, model: str, inputs: dict, outputs: list) -> dict:
        tc = self.tc
        req_inputs = []
        for name, arr in inputs.items():
            dtype = {np.float32: "FP32", np.int32: "INT32", np.int64: "INT64"}[arr.dtype.type]
            i = tc.InferInput(name, list(arr.shape), dtype)
            i.set_data_from_numpy(arr)
            req_inputs.append(i)
        req_outputs = [tc.InferRequestedOutput(n) for n in outputs]
        kwargs = {"client_timeout": self.timeout} if self.use_grpc else {}
        res = self.client.infer(model, req_inputs, outputs=req_outputs, **kwargs)
        result = {}
        for n in outputs:
            arr = res.as_numpy(n)
            if arr is None:
                raise RuntimeError(f"{model}: response has no output {n!r}")
            result[n] = arr
        return result


def query_resnet50(client: Client, model: str, seed: int):
    client.check_ready(model)
    rng = np.random.default_rng(seed)
    image = rng.standard_normal((1, 3, 224, 224), dtype=np.float32)
    out = client.infer(model, {"INPUT__0": image}, ["OUTPUT__0"])["OUTPUT__0"]
    if out.shape != (1, 1000):
        raise RuntimeError(f"{model}: OUTPUT__0 has shape {out.shape}, expected (1, 1000)")
    if not np.isfinite(out).all():
        raise RuntimeError(f"{model}: OUTPUT__0 has non-finite values")
    top5 = np.argsort(-out[0])[:5]
    print(f"{model}: top-5 classes")
    for rank, c in enumerate(top5, start=1):
        print(f"  {rank}. class {int(c):4d}  logit {float(out[0, c]):.4f}")


def query_bert(client: Client, model: str, seed: int):
    client.check_ready(model)
    ids, seg, mask, (first, last) = fake_squad_example(seed)
    out = client.infer(model, {"input__0": ids, "input__1": seg, "input__2": mask},
                       ["output__0", "output__1"])
    start, end = out["output__0"], out["output__1"]
    for n, a in out.items():
        if a.shape != (1, SEQ_LEN):
            raise RuntimeError(f"{model}: {n} has shape {a.shape}, expected (1, {SEQ_LEN})")
        if not np.isfinite(a).all():
            raise RuntimeError(f"{model}: {n} has non-finite values")
    s, e, score = best_span(start[0], end[0], first, last)
    print(f"{model}: context tokens [{first}, {last}), best answer span tokens {s}..{e}")
    print(f"  start logit {float(start[0, s]):.4f}  end logit {float(end[0, e]):.4f}  "
          f"score {score:.4f}")


def query_fastpitch(client: Client, model: str, seed: int):
    """Two 'sentences' of symbol ids (padded with 0 to 128) -> mel spectrograms."""
    rng = np.random.default_rng(seed)
    ids = np.zeros((2, 128), dtype=np.int64)
    for i, n in enumerate((40, 90)):
        ids[i, :n] = rng.integers(1, 148, n)
    out = client.infer(model, {"INPUT__0": ids}, ["OUTPUT__0", "OUTPUT__1", "OUTPUT__2"])
    mel, lens, dur = out["OUTPUT__0"], out["OUTPUT__1"], out["OUTPUT__2"]
    print(f"{model}: mel {tuple(mel.shape)} (batch, 80 mel bins, frames)")
    for i in range(2):
        n = int(lens[i, 0])
        print(f"  item {i}: {int((ids[i] != 0).sum())} symbols -> {n} frames "
              f"(mean duration {dur[i][ids[i] != 0].mean():.2f}), mel range [{mel[i, :, :n].min():.3f}, {mel[i, :, :n].max():.3f}]")


def query_recommender(client: Client, model: str, seed: int):
    """Four users: 13 dense features and 26 categorical ids -> click probability."""
    rng = np.random.default_rng(seed)
    dense = rng.standard_normal((4, 13)).astype(np.float32)
    sparse = rng.integers(0, 1000, (4, 26)).astype(np.int64)
    out = client.infer(model, {"dense": dense, "sparse": sparse}, ["prediction"])["prediction"]
    print(f"{model}: click probabilities " + ", ".join(f"{p:.4f}" for p in out[:, 0]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default=None,
                    help="server address (default localhost:8000, or localhost:8001 with --grpc)")
    ap.add_argument("--grpc", action="store_true", help="use gRPC instead of HTTP")
    ap.add_argument("--models", default="resnet50,bert",
                    help="comma-separated: resnet50, bert (default: both)")
    ap.add_argument("--bert", default="bert_large", choices=["bert_large", "bert_small"],
                    help="which BERT model to query (default bert_large)")
    ap.add_argument("--resnet", default="resnet50", help="ResNet50 model name (default resnet50)")
    ap.add_argument("--seed", type=int, default=0, help="seed for the sample inputs")
    ap.add_argument("--timeout", type=float, default=120.0, help="request timeout in seconds")
    args = ap.parse_args(argv)

    url = args.url or ("localhost:8001" if args.grpc else "localhost:8000")
    wanted = [m.strip() for m in args.models.split(",") if m.strip()]
    known = ("resnet50", "bert", "bert_large", "bert_small", "fastpitch", "dlrm", "dcnv2", "wide_deep")
    bad = [m for m in wanted if m not in known]
    if bad or not wanted:
        ap.error(f"--models: unknown {bad}; use some of {', '.join(known)}")

    try:
        client = Client(url, args.grpc, args.timeout)
        for m in wanted:
            if m == "resnet50":
                query_resnet50(client, args.resnet, args.seed)
            elif m == "fastpitch":
                query_fastpitch(client, m, args.seed)
            elif m in ("dlrm", "dcnv2", "wide_deep"):
                query_recommender(client, m, args.seed)
            else:
                query_bert(client, m if m != "bert" else args.bert, args.seed)
    except Exception as exc:  # any failure -> non-zero exit with a clear message
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
