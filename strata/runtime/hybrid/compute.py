"""Hybrid routed-expert compute: a layer's device experts on the device, its CPU share on the CPU.

    hybrid = HybridCompute(memory, model_file, n_threads)       # pool, scratch, host buffers, once
    out = hybrid(memory, layer, x, weights, expert_ids)         # [T, D], what RoutedExperts returns

Used when the memory offers its host tier to the CPU (`TieredConfig.hybrid`, `memory.hybrid`). Per
window of at most `max_tokens` tokens: x is copied once into a host float32 buffer (pinned on
CUDA); per chunk of experts, the split (split.py) divides them; the CPU experts run
in one native fused MoE call (`native.moe_swiglu` over the host tier's slots) on a worker thread
while this thread acquires the device experts and queues their GEMMs as the float path does; then
the CPU's float32 sum is copied to the device and added. Activations of the CPU share are rounded
to 8-bit blocks by the kernels, so results differ from the device-only path by that rounding.
Every buffer is made here, once; a step allocates none. Must not: decide which experts go to the
CPU (plan.py and split.py do), or read files (the file's regions are looked at only to size the scratch).
"""
from __future__ import annotations

import time
import weakref
from concurrent.futures import ThreadPoolExecutor, wait

import numpy as np
import torch

from strata import native
from strata.errors import StrataError
from strata.gguf import ModelFile
from strata.memory import alloc
from strata.memory.parts import file_parts

from strata.models.moe import float_experts
from strata.models.packed import DEFAULT_MAX_TOKENS  # tokens one window holds: host buffers and scratch are sized for it

from .split import HybridExec, HybridSplit


class HybridCompute:
    """The CPU side of hybrid compute, shared by a model's MoE layers (one step at a time)."""

    def __init__(self, memory, model_file: ModelFile, n_threads: int, max_tokens: int = DEFAULT_MAX_TOKENS):
        self.side = memory.hybrid  # the compact host tier and what the split reads of the memory
        if self.side is None:
            raise StrataError(f"{memory!r}: hybrid compute is off (TieredConfig.hybrid)")
        hp = model_file.hparams
        self.max_tokens, D = max_tokens, hp.n_embd
        pin = memory.device.type == "cuda"
        self.pool = native.ComputePool(n_threads)
        scratch = max(native.moe_scratch_bytes(file_parts(model_file, layer), max_tokens,
                                               max_tokens * hp.n_experts_used)
                      for layer in model_file.expert_layers)
        self.scratch = alloc.empty((scratch,), torch.uint8, "cpu", "hybrid scratch")
        self.x_host = alloc.empty((max_tokens, D), torch.float32, "cpu", "hybrid x", pin=pin)  # [T, D]
        self.out_host = alloc.empty((max_tokens, D), torch.float32, "cpu", "hybrid out", pin=pin)  # [T, D]
        self.exec = HybridExec(model_file, self.side.host, self.side.layers, self.side.stats, lock=self.side.lock)
        self.worker = ThreadPoolExecutor(1, thread_name_prefix="strata-hybrid")
        weakref.finalize(self, self.worker.shutdown, False)

    def close(self) -> None:
        self.worker.shutdown()
        self.pool.close()

    def __call__(self, memory, layer: int, x: torch.Tensor, weights: torch.Tensor,
                 expert_ids: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(x)  # [T, D]
        for t0 in range(0, x.shape[0], self.max_tokens):
            t1 = t0 + self.max_tokens
            self._window(memory, layer, x[t0:t1], out[t0:t1], weights[t0:t1], expert_ids[t0:t1])
        return out

    def _window(self, memory, layer: int, x: torch.Tensor, out: torch.Tensor, weights: torch.Tensor,
                expert_ids: torch.Tensor) -> None:
        T, K = expert_ids.shape
        ids = expert_ids.cpu().numpy()  # [T, K]
        order = np.argsort(ids, axis=None, kind="stable")  # [T*K] assignments grouped by expert
        used, starts, counts = np.unique(ids.reshape(-1)[order], return_index=True, return_counts=True)
        token_ids = (order // K).astype(np.int32)  # [T*K]
        router_w = weights.float().cpu().numpy().reshape(-1)[order]  # [T*K]
        x_host, out_host = self.x_host[:T], self.out_host[:T]
        x_host.copy_(x)  # device -> host (a no-op copy on the CPU device)
        out_host.zero_()
        order_dev = torch.from_numpy(order).to(x.device)
        w_flat = weights.reshape(-1)  # [T*K]
        used_cpu = False
        for i in range(0, used.size, memory.max_acquire):
            j = slice(i, i + memory.max_acquire)
            split = self.exec.split(layer, used[j].tolist(), counts[j].tolist(),
                                    on_device=lambda e: self.side.on_device(layer, e))
            job = None
            try:
                if split.cpu_ids:
                    used_cpu = True
                    job = self.worker.submit(self._cpu, T, split, used[j], starts[j], counts[j], token_ids, router_w)
                if split.device_ids:
                    self._device(memory, layer, split.device_ids, used[j], starts[j], counts[j], x, out,
                                 order_dev, w_flat, K)
            finally:  # the host slots stay pinned until the kernels are done with them
                if job is not None:
                    wait([job])
                self.exec.release(layer, split)
            if job is not None:
                self.exec.observe_cpu(layer, split, job.result())
        if used_cpu:
            out.add_(out_host.to(out.device, out.dtype))

    def _cpu(self, T: int, split: HybridSplit, used: np.ndarray, starts: np.ndarray, counts: np.ndarray, token_ids: np.ndarray,
             router_w: np.ndarray) -> float:
        """The CPU experts' assignments gathered (expert by expert) and run in one fused call;
        returns its seconds."""
        pos = {int(e): k for k, e in enumerate(used)}
        sel = [pos[e] for e in split.cpu_ids]
        picks = np.concatenate([np.arange(starts[k], starts[k] + counts[k]) for k in sel])  # [A]
        offsets = np.zeros(len(sel) + 1, dtype=np.int64)
        np.cumsum(counts[sel], out=offsets[1:])
        t0 = time.perf_counter()
        native.moe_swiglu(self.pool, self.x_host[:T], self.out_host[:T], split.cpu.parts,
                          np.asarray(split.cpu.index, dtype=np.int32), offsets, token_ids[picks],
                          np.ascontiguousarray(router_w[picks]), self.scratch)
        return time.perf_counter() - t0

    def _device(self, memory, layer: int, device_ids: list[int], used: np.ndarray, starts: np.ndarray,
                counts: np.ndarray, x: torch.Tensor, out: torch.Tensor, order: torch.Tensor,
                w_flat: torch.Tensor, K: int) -> None:
        """The device experts, one GEMM each over their tokens (as RoutedExperts' float path); the
        time of copies the acquire made from host hits only is the copy rate's evidence."""
        pos = {int(e): k for k, e in enumerate(used)}
        spans = [(int(starts[pos[e]]), int(starts[pos[e]] + counts[pos[e]])) for e in device_ids]
        n0, s0 = self.side.copies()
        float_experts(memory, layer, device_ids, spans, order, K, x, w_flat, out)
        n1, s1 = self.side.copies()
        if n1 > n0:
            self.exec.observe_copy((n1 - n0) * self.exec.expert_bytes(layer), s1 - s0)


__all__ = ["HybridCompute"]
