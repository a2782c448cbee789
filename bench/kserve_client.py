"""A minimal KServe v2 HTTP client with the binary tensor extension, needing only
``requests`` and ``numpy`` (so it runs where tritonclient is not installed, e.g. the GPU
machine). One ``infer`` call = one POST with raw tensor bytes both ways."""
import json
from typing import Dict, List

import numpy as np
import requests

_DT = {np.dtype(np.float32): "FP32", np.dtype(np.float16): "FP16", np.dtype(np.int64): "INT64",
       np.dtype(np.int32): "INT32", np.dtype(np.float64): "FP64", np.dtype(np.uint8): "UINT8",
       np.dtype(np.bool_): "BOOL"}
_NP = {v: k for k, v in _DT.items()}


class InferError(RuntimeError):
    def __init__(self, status: int, message: str):
        super().__init__(f"[{status}] {message}")
        self.status = status
        self.message = message


class Client:
    def __init__(self, url: str):
        self.url = url.rstrip("/")
        if not self.url.startswith("http"):
            self.url = "http://" + self.url
        self.session = requests.Session()

    def infer(self, model: str, inputs: Dict[str, np.ndarray], outputs: List[str]) -> Dict[str, np.ndarray]:
        header = {"inputs": [], "outputs": [{"name": o, "parameters": {"binary_data": True}} for o in outputs]}
        blobs = []
        for name, arr in inputs.items():
            arr = np.ascontiguousarray(arr)
            b = arr.tobytes()
            header["inputs"].append({"name": name, "shape": list(arr.shape), "datatype": _DT[arr.dtype],
                                     "parameters": {"binary_data_size": len(b)}})
            blobs.append(b)
        head = json.dumps(header).encode()
        r = self.session.post(f"{self.url}/v2/models/{model}/infer", data=b"".join([head] + blobs),
                              headers={"Inference-Header-Content-Length": str(len(head)),
                                       "Content-Type": "application/octet-stream"})
        if r.status_code != 200:
            try:
                msg = r.json().get("error", r.text)
            except ValueError:
                msg = r.text
            raise InferError(r.status_code, msg)
        hlen = int(r.headers.get("Inference-Header-Content-Length", len(r.content)))
        meta = json.loads(r.content[:hlen])
        at = hlen
        out = {}
        for o in meta["outputs"]:
            size = o["parameters"]["binary_data_size"]
            out[o["name"]] = np.frombuffer(r.content[at:at + size], dtype=_NP[o["datatype"]]).reshape(o["shape"])
            at += size
        return out

    def ready(self) -> bool:
        try:
            return self.session.get(f"{self.url}/v2/health/ready", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def stats(self, model: str) -> dict:
        return self.session.get(f"{self.url}/v2/models/{model}/stats").json()["model_stats"][0]
