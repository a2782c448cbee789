"""CUDA shared memory as Triton's clients use it, through the CUDA runtime that torch has loaded
(ctypes; the GPU machine has no tritonclient): a cudaMalloc'd buffer shared with the server by
its cudaIpcMemHandle_t (64 bytes, the runtime's own; torch's storage sharing wraps it in a
format of its own)."""
import ctypes

import numpy as np


def cudart():
    """(the CUDA runtime library in this process, a checker of its return codes)."""
    import torch
    torch.cuda.init()
    with open("/proc/self/maps") as f:
        paths = sorted({line.split()[-1] for line in f if "libcudart.so" in line})
    if not paths:
        raise RuntimeError("no libcudart is loaded in this process")
    rt = ctypes.CDLL(paths[0])

    def check(what, rc):
        if rc != 0:
            raise RuntimeError(f"{what} failed: CUDA error {rc}")
    return rt, check


class Region:
    """`nbytes` of GPU memory registered with the server as region `name` (a context manager:
    unregistered and freed on exit)."""

    def __init__(self, client, name: str, nbytes: int, device: int = 0):
        self.rt, self.check = cudart()
        self.client, self.name, self.nbytes, self.device = client, name, nbytes, device
        self.ptr = ctypes.c_void_p()
        self.check("cudaMalloc", self.rt.cudaMalloc(ctypes.byref(self.ptr), ctypes.c_size_t(nbytes)))
        handle = ctypes.create_string_buffer(64)
        self.check("cudaIpcGetMemHandle", self.rt.cudaIpcGetMemHandle(handle, self.ptr))
        client.register_cuda_shm(name, handle.raw, device, nbytes)

    def write(self, array: np.ndarray) -> None:
        a = np.ascontiguousarray(array)
        assert a.nbytes <= self.nbytes, (a.nbytes, self.nbytes)
        self.check("cudaMemcpy", self.rt.cudaMemcpy(self.ptr, a.ctypes.data_as(ctypes.c_void_p),
                                                    ctypes.c_size_t(a.nbytes), 1))

    def write_tensor(self, tensor, offset: int = 0) -> None:
        """Copies a contiguous CUDA tensor into the region at `offset` (device to device)."""
        nbytes = tensor.numel() * tensor.element_size()
        assert offset + nbytes <= self.nbytes, (offset, nbytes, self.nbytes)
        self.check("cudaMemcpy", self.rt.cudaMemcpy(ctypes.c_void_p(self.ptr.value + offset),
                                                    ctypes.c_void_p(tensor.data_ptr()), ctypes.c_size_t(nbytes), 3))

    def read(self, shape, dtype) -> np.ndarray:
        out = np.empty(shape, dtype)
        assert out.nbytes <= self.nbytes, (out.nbytes, self.nbytes)
        self.check("cudaMemcpy", self.rt.cudaMemcpy(out.ctypes.data_as(ctypes.c_void_p), self.ptr,
                                                    ctypes.c_size_t(out.nbytes), 2))
        return out

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        try:
            self.client.unregister_cuda_shm(self.name)
        finally:
            self.rt.cudaFree(self.ptr)
