"""Calibrated conversion: GPTQ layer by layer (`--calib`), or importance-weighted rounding (`--imatrix`).

GPTQ (`calibrate`): the calibration tokens' hidden states [N, D] start as the (quantized)
embeddings; for each layer L in turn,
  1. layer L is built in float from the checkpoint (the planned tensors' values) and run over the
     hidden states, every matrix recording its input Hessian (experts: the tokens routed to them);
  2. each of its quantized matrices is quantized with GPTQ for its Hessian (`gptq`); an expert that
     saw fewer than `min_tokens(K)` routed tokens (a quarter of its row length, at least 16: fewer
     would leave H too low-rank for the compensation to generalise) falls back to importance-
     weighted rounding with the diagonal of all of the layer's routed tokens for that matrix,
     and to plain rounding when the layer saw none; tensors no product reads (3-D latent
     attention slabs) and float types are rounded as without calibration;
  3. the layer is rebuilt from the quantized values and run again: its output, which carries the
     quantization error of every layer so far, is the next layer's input (GPTQ's sequential form).
The quantized bytes of each layer go to a spill file beside the output and the planned tensors
read them back when the file is written, so memory holds one layer (weights, Hessians) and the
hidden states, never the model. The routing seen in step 1 becomes `strata.routing.*` metadata.

`--imatrix` needs no run: each planned tensor found in the importance matrix is quantized with the
importance-weighted search, piece by piece, as it is written.

Must not: parse arguments or write the GGUF file (`converters.convert` does).
"""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Callable

import gguf
import numpy as np
import torch

from converters.base import PlannedTensor
from converters.calib.gptq import gptq_quantize
from converters.calib.imatrix import Imatrix
from converters.calib.runner import EXPERT_KINDS, Hessians, LayerRunner
from converters.source import ConversionError
from converters.types import encode
from strata import native
from strata.arch import Arch
from strata.gguf import HParams
from strata.native import calib as ncalib
from strata.quant import GGMLType

log = logging.getLogger("strata.convert")

#: Types GPTQ and the weighted search write.
CALIB_TYPES = frozenset({GGMLType.Q8_0, GGMLType.Q4_K, GGMLType.Q6_K})
_EXPERT_KINDS = frozenset(EXPERT_KINDS.values())


def min_tokens(K: int) -> int:
    """Routed tokens an expert matrix with rows of K values needs for GPTQ (see the module docstring)."""
    return max(16, K // 4)


def values_of(p: PlannedTensor, n_threads: int = 1) -> np.ndarray:
    """The float32 values of a planned tensor (pieces already encoded are decoded)."""
    parts = []
    for piece in p.pieces:
        v = piece()
        if v.dtype == np.uint8:
            v = native.dequantize(p.ggml_type, v, (v.size // gguf.GGML_QUANT_SIZES[p.ggml_type][1]
                                                   * gguf.GGML_QUANT_SIZES[p.ggml_type][0],), n_threads=n_threads)
        parts.append(np.asarray(v, dtype=np.float32).reshape(-1))
    return np.concatenate(parts).reshape(p.shape)


def as_bytes(values: np.ndarray, t: GGMLType, n_threads: int) -> np.ndarray:
    """Round-to-nearest encoding of `values` [.., K] as raw bytes (uint8 [rows, row bytes])."""
    rows = int(np.prod(values.shape[:-1]))
    return np.ascontiguousarray(encode(values.reshape(rows, -1), t, n_threads)).view(np.uint8).reshape(rows, -1)


def decoded(data: np.ndarray, t: GGMLType, shape: tuple[int, ...], n_threads: int) -> np.ndarray:
    """Values of encoded bytes (what a reader of the file computes with)."""
    return native.dequantize(t, np.ascontiguousarray(data).reshape(-1), shape, n_threads=n_threads)


class Spill:
    """Append-only temporary file of encoded tensors; pieces read them back by offset."""

    def __init__(self, target: Path):
        self.path = target.with_name(f".{target.name}.calib.{os.getpid()}.tmp")
        self.f = open(self.path, "w+b")

    def put(self, data: np.ndarray) -> Callable[[], np.ndarray]:
        data = np.ascontiguousarray(data)
        offset, shape = self.f.seek(0, os.SEEK_END), data.shape
        self.f.write(memoryview(data).cast("B"))
        path = self.path
        return lambda: np.fromfile(path, dtype=np.uint8, count=int(np.prod(shape)), offset=offset).reshape(shape)

    def flush(self) -> None:
        """Make everything `put` so far readable by the pieces."""
        self.f.flush()

    def close(self) -> None:
        self.f.close()
        self.path.unlink(missing_ok=True)


class LayerQuantizer:
    """Chooses and runs the method for each planned tensor of a layer; counts what it chose."""

    def __init__(self, n_threads: int):
        self.n_threads = n_threads
        self.methods: dict[str, int] = {"gptq": 0, "weighted": 0, "rtn": 0}

    def tensor(self, p: PlannedTensor, values: np.ndarray, stats: Hessians) -> np.ndarray:
        try:
            return self._tensor(p, values, stats)
        except ValueError as exc:
            raise ConversionError(f"calibrating tensor {p.name} ({', '.join(p.sources[:2])}): {exc}") from None

    def _tensor(self, p: PlannedTensor, values: np.ndarray, stats: Hessians) -> np.ndarray:
        t = GGMLType(p.ggml_type)
        if t not in CALIB_TYPES:
            return as_bytes(values, t, self.n_threads)
        if len(p.shape) == 2:
            H, n = stats.get(p.name)
            return self._matrix(values, t, H, n, None)
        layer_imp = self._layer_importance(p, stats) if p.kind in _EXPERT_KINDS else None
        slabs = [self._matrix(values[e], t, *stats.get((p.name, e)), layer_imp) for e in range(p.shape[0])]
        return np.concatenate(slabs)

    def _layer_importance(self, p: PlannedTensor, stats: Hessians) -> np.ndarray | None:
        diags = [torch.diag(H) for e in range(p.shape[0]) if (H := stats.get((p.name, e))[0]) is not None]
        return torch.stack(diags).sum(0).float().numpy() if diags else None

    def _matrix(self, W: np.ndarray, t: GGMLType, H, n: int, fallback: np.ndarray | None) -> np.ndarray:
        if H is not None and n >= min_tokens(W.shape[-1]):
            self.methods["gptq"] += 1
            return gptq_quantize(W, H, t, n_threads=self.n_threads)
        imp = torch.diag(H).float().numpy() if H is not None and n > 0 else fallback
        if imp is not None and imp.max() > 0:
            self.methods["weighted"] += 1
            return ncalib.quantize_weighted(t, W, imp, n_threads=self.n_threads)
        self.methods["rtn"] += 1
        return as_bytes(W, t, self.n_threads)


def _embeddings(planned: list[PlannedTensor], tokens: torch.Tensor, n_threads: int) -> torch.Tensor:
    emb = next(p for p in planned if p.kind == gguf.MODEL_TENSOR.TOKEN_EMBD)
    values = values_of(emb, n_threads)
    if emb.ggml_type not in (GGMLType.F32,):  # the model reads the quantized embeddings
        values = decoded(as_bytes(values, GGMLType(emb.ggml_type), n_threads), GGMLType(emb.ggml_type),
                         emb.shape, n_threads)
    return torch.from_numpy(values[tokens.numpy()])  # [N, D]


def calibrate(planned: list[PlannedTensor], arch: Arch, hp: HParams, tokens: list[int], n_ctx: int,
              spill: Spill, n_threads: int, progress: bool = True) -> tuple[np.ndarray, dict[str, int]]:
    """GPTQ every layer (see the module docstring); replaces the pieces of every layer's planned
    tensors with readers of the spill. Returns (routing counts [expert layers, E], methods used)."""
    # the trunk's: multi-token-prediction layers (past hp.n_layers) are quantized as planned, not run
    expert_layers = sorted({p.layer for p in planned if p.kind in _EXPERT_KINDS and p.layer < hp.n_layers})
    runner = LayerRunner(arch, hp, expert_layers, n_ctx)
    hidden = _embeddings(planned, torch.tensor(tokens), n_threads)
    quantizer = LayerQuantizer(n_threads)
    counts = np.zeros((len(expert_layers), hp.n_experts), dtype=np.int64)
    bar = _bar(hp.n_layers, progress)
    t0 = time.perf_counter()
    for layer in range(hp.n_layers):
        mine = [p for p in planned if p.layer == layer]
        floats = {p.name: values_of(p, n_threads) for p in mine}
        stats = Hessians()
        block, memory = runner.build(layer, floats, stats)
        runner.run(block, hidden, stats)
        if memory is not None:
            counts[expert_layers.index(layer)] = memory.counts
        quantized = {}
        for p in mine:
            data = quantizer.tensor(p, floats[p.name], stats)
            quantized[p.name] = decoded(data, GGMLType(p.ggml_type), p.shape, n_threads)
            n = p.shape[0] if p.kind in _EXPERT_KINDS else 1
            p.pieces = [spill.put(slab) for slab in np.split(data, n)]
        del floats, stats, block, memory
        block, _ = runner.build(layer, quantized, None)
        hidden = runner.run(block, hidden)
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    spill.flush()
    log.info("calibrated %d layers over %d tokens in %.1f s: %s", hp.n_layers, len(tokens),
             time.perf_counter() - t0, quantizer.methods)
    return counts, quantizer.methods


def _bar(total: int, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm
    return tqdm(total=total, unit="layer", desc="calibrating", dynamic_ncols=True)


def apply_imatrix(planned: list[PlannedTensor], imatrix: Imatrix, n_threads: int) -> dict[str, int]:
    """Make each planned tensor with an entry in `imatrix` quantize with its importances as it is
    written. Returns how many tensors were weighted and how many had no entry."""
    used, missing_layer_tensors = {"weighted": 0, "rtn": 0}, []
    for p in planned:
        if GGMLType(p.ggml_type) not in CALIB_TYPES or len(p.shape) < 2:
            continue
        imp = imatrix.importance(p.name, p.shape)
        if imp is None:
            used["rtn"] += 1
            if p.layer is not None:  # llama-imatrix leaves the embeddings and often the output head out
                missing_layer_tensors.append(p.name)
            continue
        used["weighted"] += 1
        expert = p.kind in _EXPERT_KINDS
        p.pieces = [_weighted_piece(piece, p.ggml_type, imp[i if expert else 0], n_threads)
                    for i, piece in enumerate(p.pieces)]
    if used["rtn"] and missing_layer_tensors:
        log.warning("%s: no importances for %d layer tensors (%s); they are rounded to nearest",
                    imatrix.path, len(missing_layer_tensors), ", ".join(missing_layer_tensors[:4]))
    return used


def _weighted_piece(piece: Callable[[], np.ndarray], t: GGMLType, imp: np.ndarray, n_threads: int):
    def read() -> np.ndarray:
        v = piece()
        if v.dtype == np.uint8:  # already encoded at the source: kept
            return v
        return ncalib.quantize_weighted(t, v.reshape(-1, v.shape[-1]), imp, n_threads=n_threads)
    return read


def check_calib_args(calib: str | None, imatrix: str | None, routing_stats: str | None) -> None:
    if calib is not None and imatrix is not None:
        raise ConversionError("--calib and --imatrix: choose one (GPTQ computes its own importances)")
    if calib is not None and routing_stats is not None:
        raise ConversionError("--calib records the routing it sees: --routing-stats cannot be given with it")


__all__ = ["CALIB_TYPES", "LayerQuantizer", "Spill", "apply_imatrix", "calibrate", "check_calib_args", "min_tokens",
           "values_of"]
