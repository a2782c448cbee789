"""CUDA shared memory as Triton's clients use it, through the CUDA runtime that torch has loaded
(ctypes; the GPU machine has no tritonclient): a cudaMalloc'd buffer shared with the server by
its cudaIpcMemHandle_t (64 bytes, the runtime's own; torch's storage sharing wraps it in a
format of its own)."""
import contextlib
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
        with self._on_device():
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
            with self._on_device():
                self.rt.cudaFree(self.ptr)

    @contextlib.contextmanager
    def _on_device(self):
        """The region's GPU current for the calls inside (the memory is made and freed there),
        the caller's again after."""
        was = ctypes.c_int()
        self.check("cudaGetDevice", self.rt.cudaGetDevice(ctypes.byref(was)))
        self.check("cudaSetDevice", self.rt.cudaSetDevice(self.device))
        try:
            yield
        finally:
            self.check("cudaSetDevice", self.rt.cudaSetDevice(was.value))


def read_outputs(raw, meta, offsets):
    """{output: array} from the bytes `raw` of a region the server wrote them into: each at
    its offset (`offsets`), of the shape and type the answer's metadata `meta` gives."""
    got = {}
    for o, off in offsets.items():
        shape, dtype = meta[o]
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        got[o] = raw[off:off + n].view(dtype).reshape(shape)
    return got


def infer_through(client, name, feeds, outputs, gpu, body):
    """`client.infer` with every input written into one CUDA shared-memory region on GPU `gpu`
    and the outputs written into another there, then read back; `body`: the same request's
    answer in the body, which sizes the outputs' region."""
    # twice the body's answer: an output of variable length (FastPitch's) may come out longer
    sizes = [2 * int(np.asarray(body[o]).nbytes) for o in outputs]
    align = lambda n: (n + 255) // 256 * 256  # noqa: E731
    in_sizes = [align(np.ascontiguousarray(v).nbytes) for v in feeds.values()]
    with Region(client, f"in_{name}", sum(in_sizes), gpu) as rin, \
            Region(client, f"out_{name}", sum(align(n) for n in sizes), gpu) as rout:
        whole, shm, at = bytearray(sum(in_sizes)), {}, 0
        for (k, v), n in zip(feeds.items(), in_sizes):
            v = np.ascontiguousarray(v)
            whole[at:at + v.nbytes] = v.tobytes()
            shm[k] = (rin.name, at, v.nbytes, v.shape, v.dtype)
            at += n
        rin.write(np.frombuffer(bytes(whole), np.uint8))
        out_shm, at = {}, 0
        for o, n in zip(outputs, sizes):
            out_shm[o] = (rout.name, at, n)
            at += align(n)
        meta = client.infer(name, {}, outputs, shm=shm, out_shm=out_shm)
        return read_outputs(rout.read((at,), np.uint8), meta, {o: out_shm[o][1] for o in outputs})
