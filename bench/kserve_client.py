"""A minimal KServe v2 HTTP client with the binary tensor extension, needing only
``requests`` and ``numpy`` (so it runs where tritonclient is not installed, e.g. the GPU
machine). One ``infer`` call = one POST with raw tensor bytes both ways."""
import base64
import http.client
import json
from typing import Dict, List
from urllib.parse import urlparse

import numpy as np

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
        if not url.startswith("http"):
            url = "http://" + url
        u = urlparse(url)
        self.host, self.port = u.hostname, u.port or 80
        self.conn = http.client.HTTPConnection(self.host, self.port, timeout=300)

    def _request(self, method: str, path: str, body: bytes = b"", headers=None):
        # one persistent connection; reconnect once if the server closed it
        for attempt in (0, 1):
            try:
                self.conn.request(method, path, body=body, headers=headers or {})
                r = self.conn.getresponse()
                return r.status, dict(r.getheaders()), r.read()
            except (http.client.HTTPException, ConnectionError):
                self.conn.close()
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=300)
                if attempt:
                    raise

    def _post_json(self, path: str, body: dict):
        status, _, content = self._request("POST", path, json.dumps(body).encode(), {"Content-Type": "application/json"})
        if status != 200:
            raise InferError(status, content.decode(errors="replace"))

    def register_cuda_shm(self, region: str, raw_handle: bytes, device_id: int, byte_size: int):
        """Registers a CUDA IPC memory handle (cudaIpcMemHandle_t bytes) as a shared-memory region."""
        self._post_json(f"/v2/cudasharedmemory/region/{region}/register",
                        {"raw_handle": {"b64": base64.b64encode(raw_handle).decode()}, "device_id": device_id,
                         "byte_size": byte_size})

    def unregister_cuda_shm(self, region: str):
        self._post_json(f"/v2/cudasharedmemory/region/{region}/unregister", {})

    def register_system_shm(self, region: str, key: str, byte_size: int, offset: int = 0):
        """Registers POSIX shared memory `key` (shm_open's name, e.g. "/pool") as a region."""
        self._post_json(f"/v2/systemsharedmemory/region/{region}/register",
                        {"key": key, "offset": offset, "byte_size": byte_size})

    def unregister_system_shm(self, region: str):
        self._post_json(f"/v2/systemsharedmemory/region/{region}/unregister", {})

    def infer(self, model: str, inputs: Dict[str, np.ndarray], outputs: List[str], shm=None,
              out_shm=None) -> Dict[str, np.ndarray]:
        """``shm``: inputs already in a registered region, name -> (region, offset, byte size,
        shape, numpy dtype); the rest travel in the body. ``out_shm``: outputs to be written into
        a registered region, name -> (region, offset, byte size); for those the answer holds
        (shape, numpy dtype) of what was written, the others come back in the body."""
        out_shm = out_shm or {}
        header = {"inputs": [], "outputs": []}
        for o in outputs:
            if o in out_shm:
                region, offset, size = out_shm[o]
                header["outputs"].append({"name": o, "parameters": {
                    "shared_memory_region": region, "shared_memory_offset": offset, "shared_memory_byte_size": size}})
            else:
                header["outputs"].append({"name": o, "parameters": {"binary_data": True}})
        for name, (region, offset, size, shape, dtype) in (shm or {}).items():
            header["inputs"].append({"name": name, "shape": list(shape), "datatype": _DT[np.dtype(dtype)],
                                     "parameters": {"shared_memory_region": region, "shared_memory_offset": offset,
                                                    "shared_memory_byte_size": size}})
        blobs = []
        for name, arr in inputs.items():
            arr = np.ascontiguousarray(arr)
            b = arr.tobytes()
            header["inputs"].append({"name": name, "shape": list(arr.shape), "datatype": _DT[arr.dtype],
                                     "parameters": {"binary_data_size": len(b)}})
            blobs.append(b)
        head = json.dumps(header).encode()
        status, headers, content = self._request(
            "POST", f"/v2/models/{model}/infer", b"".join([head] + blobs),
            {"Inference-Header-Content-Length": str(len(head)), "Content-Type": "application/octet-stream"})
        if status != 200:
            try:
                msg = json.loads(content).get("error", content.decode(errors="replace"))
            except ValueError:
                msg = content.decode(errors="replace")
            raise InferError(status, msg)
        lower = {k.lower(): v for k, v in headers.items()}
        hlen = int(lower.get("inference-header-content-length", len(content)))
        meta = json.loads(content[:hlen])
        at = hlen
        out = {}
        for o in meta["outputs"]:
            if o["name"] in out_shm:
                out[o["name"]] = (tuple(o["shape"]), _NP[o["datatype"]])
                continue
            size = o["parameters"]["binary_data_size"]
            out[o["name"]] = np.frombuffer(content[at:at + size], dtype=_NP[o["datatype"]]).reshape(o["shape"])
            at += size
        return out

    def ready(self) -> bool:
        try:
            return self._request("GET", "/v2/health/ready")[0] == 200
        except OSError:
            return False

    def stats(self, model: str) -> dict:
        return json.loads(self._request("GET", f"/v2/models/{model}/stats")[2])["model_stats"][0]

    def close(self):
        self.conn.close()
