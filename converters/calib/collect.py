"""An importance matrix from a GGUF model and a text (`strata imatrix MODEL.gguf -f TEXT -o FILE`).

The model runs layer by layer over the text's tokens with Strata's own layers (`runner`), in float
from the file's dequantized weights, each matrix summing the squares of its inputs: every token for
attention and shared experts, only the tokens routed to it for each expert (as llama.cpp's
`llama-imatrix` does). The result is written in llama.cpp's GGUF imatrix format (`imatrix`).
Memory: one layer's float weights and the hidden states of the text's tokens.

Must not: quantize or convert.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from converters.calib.imatrix import write_imatrix
from converters.calib.runner import Hessians, LayerRunner
from strata import native
from strata.arch import layer_of
from strata.errors import StrataError
from strata.gguf import open_model
from strata.models.loader import architecture
from strata.tokenizer import Tokenizer


def _layer_tensors(mf, layer: int | None, n_threads: int) -> dict[str, np.ndarray]:
    out = {}
    for name, info in mf.tensors.items():
        if layer_of(name) == layer:
            out[name] = native.dequantize(info.ggml_type, mf.tensor_data(name), info.shape, n_threads=n_threads)
    return out


def _sums(stats: Hessians, names: set, n_experts: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """in_sum2 [nmat, K] and counts [nmat] per tensor name from one layer's statistics."""
    sums, counts = {}, {}
    for key in sorted(names, key=str):
        name, e = key if isinstance(key, tuple) else (key, None)
        d, n = stats.get(key)
        if e is None:
            if d is not None:
                sums[name], counts[name] = d.numpy()[None, :], np.array([n], dtype=np.float64)
            continue
        if name not in sums:
            sums[name], counts[name] = None, np.zeros(n_experts)
        if d is not None:
            if sums[name] is None:
                sums[name] = np.zeros((n_experts, d.shape[0]))
            sums[name][e], counts[name][e] = d.numpy(), n
    return {k: v for k, v in sums.items() if v is not None}, {k: counts[k] for k, v in sums.items() if v is not None}


def collect_imatrix(model_path: str | Path, text: str, out: str | Path, *, n_tokens: int = 8192, n_ctx: int = 512,
                    dataset: str = "", n_threads: int | None = None, progress: bool = True) -> dict:
    """Write the importance matrix of `model_path` over `text`'s first `n_tokens` tokens to `out`;
    returns a summary (tokens, chunks, tensors, seconds)."""
    n_threads = n_threads or native.default_threads()
    t0 = time.perf_counter()
    with open_model(model_path) as mf:
        arch, hp = architecture(mf), mf.hparams
        tokens = Tokenizer.from_metadata(mf.metadata, str(mf.path), vocab_size=hp.vocab_size).encode(text)[:n_tokens]
        n_ctx = min(n_ctx, hp.context_length)
        n_chunks = len(tokens) // n_ctx
        if n_chunks < 1:
            raise StrataError(f"{dataset or 'text'}: {len(tokens)} tokens, fewer than one chunk of {n_ctx}")
        tokens = tokens[:n_chunks * n_ctx]  # whole chunks, as llama-imatrix counts them
        embd = _layer_tensors(mf, None, n_threads)["token_embd.weight"]
        hidden = torch.from_numpy(embd[np.asarray(tokens)])  # [N, D]
        del embd
        runner = LayerRunner(arch, hp, list(mf.expert_layers), n_ctx)
        sums, counts = {}, {}
        bar = None
        if progress:
            from tqdm import tqdm
            bar = tqdm(total=hp.n_layers, unit="layer", desc="imatrix", dynamic_ncols=True)
        for layer in range(hp.n_layers):
            stats = Hessians(diag_only=True)
            block, _ = runner.build(layer, _layer_tensors(mf, layer, n_threads), stats)
            hidden = runner.run(block, hidden, stats)
            s, c = _sums(stats, set(stats.H) | set(stats.alias), hp.n_experts)
            sums.update(s)
            counts.update(c)
            if bar is not None:
                bar.update(1)
        if bar is not None:
            bar.close()
    write_imatrix(out, sums, counts, [dataset] if dataset else [], n_chunks, n_ctx)
    return {"tokens": len(tokens), "chunks": n_chunks, "chunk_size": n_ctx, "tensors": len(sums),
            "seconds": time.perf_counter() - t0}


__all__ = ["collect_imatrix"]
