"""Compute from packed GGUF weights on the CPU: resident matrices kept in their file format and
multiplied by the native quantized kernels (activations rounded to 8-bit blocks on the fly, as
llama.cpp does), so a decode step reads each weight once, in its packed size.

    compute = PackedCompute(n_threads=2, max_tokens=512, max_row_len=4096)   # pool + scratch, once
    w = PackedMatrix(data, GGMLType.Q8_0, (N, K), compute)                   # bytes stay packed
    y = w(x)                                                                 # [T, N] = x[T, K] @ W^T

`PackedCompute` owns the persistent thread pool and the scratch every call rounds activations
into; both are made once per model (scratch is a memory-system buffer, counted by
`strata.memory.alloc`). Calls with more tokens than the scratch holds run in token chunks. The
float path (dequantize once, torch matmul) stays the reference: these kernels differ from it only
by the activation rounding. Touches no files: the bytes are handed in.
"""
from __future__ import annotations

import numpy as np
import torch

from strata import native
from strata.memory import alloc
from strata.quant import GGMLType, block_size, ggml_type, row_bytes

#: Tokens one call rounds at once (larger batches run in chunks of this many).
DEFAULT_MAX_TOKENS = 512


class PackedCompute:
    """The compute pool and activation scratch shared by a model's packed matrices and MoE
    layers. Not thread-safe: one model step at a time (as the model itself)."""

    def __init__(self, n_threads: int, max_tokens: int = DEFAULT_MAX_TOKENS, scratch_bytes: int = 0):
        self.pool = native.ComputePool(n_threads)
        self.max_tokens = max_tokens
        self.scratch = alloc.empty((max(scratch_bytes, 64),), torch.uint8, "cpu", "activation scratch")

    def reserve(self, nbytes: int) -> None:
        """Grow the scratch to `nbytes` (at load time only; decoding never grows it)."""
        if nbytes > self.scratch.numel():
            self.scratch = alloc.empty((nbytes,), torch.uint8, "cpu", "activation scratch")

    def close(self) -> None:
        self.pool.close()


class PackedMatrix:
    """A [N, K] weight matrix in ggml type `t`, packed bytes `data` (uint8, row-major blocks).

    Calling it with float32 x [T, K] gives x @ W^T [T, N] from the native kernels; `rows(ids)`
    dequantizes selected rows (an embedding lookup)."""

    def __init__(self, data: np.ndarray, t: GGMLType | int | str, shape: tuple[int, int], compute: PackedCompute):
        self.type, self.shape, self.compute = ggml_type(t), (int(shape[0]), int(shape[1])), compute
        n, k = self.shape
        self.row_bytes = row_bytes(self.type, k)
        if k % block_size(self.type)[0] or data.nbytes < n * self.row_bytes:
            raise ValueError(f"{self.type.name} matrix {list(self.shape)}: needs {n * self.row_bytes} packed bytes "
                             f"in whole blocks, found {data.nbytes}")
        self.data = data
        self._data_t = torch.from_numpy(data) if data.flags.writeable else torch.frombuffer(data, dtype=torch.uint8)
        compute.reserve(native.matmul_scratch_bytes(self.type, compute.max_tokens, k))

    @property
    def nbytes(self) -> int:
        return self.data.nbytes

    @classmethod
    def concat(cls, mats: list[PackedMatrix]) -> PackedMatrix:
        """The matrices stacked by rows (one product instead of several): same type and K."""
        t, k = mats[0].type, mats[0].shape[1]
        if any(m.type != t or m.shape[1] != k for m in mats):
            raise ValueError("only matrices of one type and row length stack")
        data = np.concatenate([m.data.reshape(-1)[:m.shape[0] * m.row_bytes] for m in mats])
        return cls(data, t, (sum(m.shape[0] for m in mats), k), mats[0].compute)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        n, k = self.shape
        x = x.reshape(-1, k)
        if x.dtype != torch.float32 or not x.is_contiguous():
            x = x.float().contiguous()
        out = torch.empty((x.shape[0], n), dtype=torch.float32)  # [T, N]
        c, step = self.compute, self.compute.max_tokens
        if x.shape[0] <= step:
            return native.matmul_into(c.pool, self.type, self._data_t, n, k, x, out, c.scratch)
        for t0 in range(0, x.shape[0], step):
            native.matmul_into(c.pool, self.type, self._data_t, n, k, x[t0:t0 + step], out[t0:t0 + step], c.scratch)
        return out

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` [T] dequantized to float32 [T, K]."""
        out = torch.empty((ids.numel(), self.shape[1]), dtype=torch.float32)
        return native.dequantize_rows(self.type, self.data, ids.tolist(), out)

    def __repr__(self) -> str:
        return f"PackedMatrix({self.type.name}, {list(self.shape)})"


__all__ = ["DEFAULT_MAX_TOKENS", "PackedCompute", "PackedMatrix"]
