"""Random-weight MoE GGUF files of any shape and size, in llama.cpp's conventions, written tensor
by tensor (peak memory: one tensor), so files far larger than RAM take minutes.

    write(path, Shape(arch="qwen3moe", n_layers=24, n_experts=64, top_k=8, hidden=1024, ff=512))
    write(path, preset_shape("qwen3-235b-like", 200 << 20))       # a named model scaled to 200 MiB

Weights: attention Q8_0 and experts in `expert_type` (Q4_K by default), quantized from Gaussian
values of std weight_scale / sqrt(row length) (expert tensors draw rows from a pool of quantized
rows: every expert gets its own matrix without quantizing gigabytes); norms are ones.

Routing that looks like a real model's (`Shape.skew` > 0), calibrated on the routing trace of a
real MoE (FLAME-MoE-290M, ../shared/traces: mild popularity skew, strong layer-to-layer
predictability, token-to-token reuse barely above chance). The recipe:
- popularity: router row e has norm proportional to (1 + rank_e)^-skew over a random ranking of the
  experts (normalised to mean 1); a larger row wins the top-k more often, so a few experts are hot;
- layer-to-layer locality: layer l+1's router is layer l's with its rows permuted (a fixed random
  permutation per layer) and each direction mixed with fresh noise, correlation `layer_corr`; as
  the residual stream changes little from one layer to the next (attention and expert weights
  scaled by `weight_scale`, 0.3 for presets), a token's experts in layer l predict those in l+1;
- token-to-token reuse is left to chance and popularity: embeddings and output head are Gaussian.
Must not: read files or depend on the engine; it writes a file that any GGUF reader can load.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from strata.quant import GGMLType, block_size

from .presets import PRESETS, ROUTER_SKEW, Preset

HEAD_DIM = 128  # qwen3moe files: head size independent of the hidden size, as Qwen3's


@dataclass(frozen=True)
class Shape:
    """A synthetic model's dimensions. `ff` is the expert FFN width; `vocab` counts the 257
    byte-level tokens and special tokens up to it."""
    arch: str = "qwen3moe"  # "qwen3moe", or "llama" (Mixtral as llama.cpp's converter writes it)
    n_layers: int = 2
    n_experts: int = 8
    top_k: int = 2
    hidden: int = 256
    ff: int = 256
    n_head: int = 2
    n_head_kv: int = 1
    vocab: int = 512
    expert_type: str = "Q4_K"
    weight_scale: float = 1.0
    skew: float = 0.0  # 0: Gaussian routers (near-uniform, independent layers); else the recipe above
    layer_corr: float = 0.85
    seed: int = 0



EXPERT_BITS = {"Q4_K": 4.5, "Q4_0": 4.5, "Q5_K": 5.5, "Q6_K": 6.5625, "Q8_0": 8.5, "MXFP4": 4.25}


def _bytes(t: GGMLType, shape: tuple[int, ...]) -> int:
    elems, nbytes = block_size(t)
    return int(np.prod(shape)) // elems * nbytes


def plan(s: Shape) -> list[tuple[str, tuple[int, ...], GGMLType]]:
    """(name, row-major shape, type) of every tensor, in file order."""
    et, F32, Q8 = GGMLType[s.expert_type], GGMLType.F32, GGMLType.Q8_0
    head_dim = HEAD_DIM if s.arch == "qwen3moe" else s.hidden // s.n_head
    q, kv, D = s.n_head * head_dim, s.n_head_kv * head_dim, s.hidden
    out = [("token_embd.weight", (s.vocab, D), F32), ("output_norm.weight", (D,), F32),
           ("output.weight", (s.vocab, D), F32)]
    for i in range(s.n_layers):
        b = f"blk.{i}."
        out += [(b + "attn_norm.weight", (D,), F32), (b + "attn_q.weight", (q, D), Q8),
                (b + "attn_k.weight", (kv, D), Q8), (b + "attn_v.weight", (kv, D), Q8),
                (b + "attn_output.weight", (D, q), Q8)]
        if s.arch == "qwen3moe":
            out += [(b + "attn_q_norm.weight", (HEAD_DIM,), F32), (b + "attn_k_norm.weight", (HEAD_DIM,), F32)]
        out += [(b + "ffn_norm.weight", (D,), F32), (b + "ffn_gate_inp.weight", (s.n_experts, D), F32),
                (b + "ffn_gate_exps.weight", (s.n_experts, s.ff, D), et),
                (b + "ffn_up_exps.weight", (s.n_experts, s.ff, D), et),
                (b + "ffn_down_exps.weight", (s.n_experts, D, s.ff), et)]
    return out


def file_bytes(s: Shape) -> int:
    """Bytes of the tensor data of a file of shape `s` (the header adds a few KiB)."""
    return sum(_bytes(t, shape) for _, shape, t in plan(s))


def _heads(hidden: int, p: Preset) -> tuple[int, int]:
    """Heads of 128 features (as both real families), at most the preset's, dividing `hidden`; kv
    heads in the preset's ratio."""
    n_head = max(2, min(p.n_head, hidden // HEAD_DIM))
    while hidden % n_head:
        n_head -= 1
    n_kv = max(1, n_head // max(1, p.n_head // p.n_head_kv))
    while n_head % n_kv:
        n_kv -= 1
    return n_head, n_kv


def preset_shape(name: str, size: int, *, expert_type: str = "Q4_K", seed: int = 0) -> Shape:
    """The preset `name` scaled to about `size` bytes (see PRESETS)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r} (expected one of {', '.join(PRESETS)})")
    p = PRESETS[name]
    bits = EXPERT_BITS.get(expert_type, 4.5)
    full = Shape(p.arch, p.n_layers, p.n_experts, p.top_k, p.hidden, p.ff, p.n_head, p.n_head_kv, p.vocab, expert_type)
    expert_full = p.n_layers * p.n_experts * 3 * p.hidden * p.ff * bits / 8
    share = expert_full / file_bytes(replace(full, vocab=min(p.vocab, 32000)))  # embeddings F32 here: cap them
    share = min(share, 0.97)
    r = min(1.0, size / file_bytes(full))
    layers = max(2, min(p.n_layers, round(p.n_layers * r ** (1 / 3))))
    align = block_size(GGMLType[expert_type])[0]
    hf = max(size * share / (layers * p.n_experts * 3 * bits / 8), align * align)  # hidden * ff
    h0, f0 = math.sqrt(hf * p.hidden / p.ff) / 256, None
    candidates = []
    for hidden in {max(256, math.floor(h0) * 256), max(256, math.ceil(h0) * 256)}:
        f0 = hf / hidden / align
        for ff in {max(align, math.floor(f0) * align), max(align, math.ceil(f0) * align)}:
            per_layer = p.n_experts * 3 * hidden * ff * bits / 8
            layers = max(2, min(p.n_layers, round(size * share / per_layer)))
            candidates.append((abs(layers * per_layer - size * share), hidden, ff, layers))
    _, hidden, ff, layers = min(candidates)
    n_head, n_kv = _heads(hidden, p)
    smallest = file_bytes(Shape(p.arch, 2, p.n_experts, p.top_k, 256, max(align, 256), *_heads(256, p), 512,
                                expert_type))
    if size < 0.9 * smallest:
        raise ValueError(f"preset {name}: {size} bytes is below its smallest file, {smallest} bytes (2 layers of "
                         f"{p.n_experts} experts at hidden 256); ask for at least {-(-smallest // 2**20)} MiB")
    shape = Shape(p.arch, layers, p.n_experts, p.top_k, hidden, ff, n_head, n_kv, 512, expert_type,
                  weight_scale=0.3, skew=ROUTER_SKEW, seed=seed)
    rest = size - file_bytes(shape)  # what the embedding and output head (F32, [V, D] each) may take
    vocab = int(min(p.vocab, max(512, rest // (8 * hidden))))
    return replace(shape, vocab=vocab)


class _Weights:
    """The tensors' bytes, in file order (see the module docstring for the routing recipe)."""

    POOL_ROWS = 8192

    def __init__(self, s: Shape):
        self.s, self.rng, self._pools = s, np.random.default_rng(s.seed), {}
        if s.skew:
            rank = self.rng.permutation(s.n_experts)
            norms = 1.0 / (1.0 + rank) ** s.skew
            self.norms = (norms / norms.mean()).astype(np.float32)  # [E], by expert id
            self.dirs: np.ndarray | None = None  # [E, D] unit router directions of the last layer

    def _router(self, shape: tuple[int, int]) -> np.ndarray:
        """The next layer's router [E, D] (see the module docstring)."""
        E, D = shape
        fresh = self.rng.standard_normal(shape)
        fresh /= np.linalg.norm(fresh, axis=1, keepdims=True)
        if self.dirs is None:
            dirs = fresh
        else:
            c = self.s.layer_corr
            dirs = c * self.dirs[self.rng.permutation(E)] + np.sqrt(1 - c * c) * fresh
            dirs /= np.linalg.norm(dirs, axis=1, keepdims=True)
        self.dirs = dirs
        # logits of a unit-rms hidden state (norm sqrt(D)) have std ~ norm_e
        return (dirs * self.norms[:, None]).astype(np.float32)

    def _pool(self, t: GGMLType, row_len: int) -> np.ndarray:
        from strata import native

        if (t, row_len) not in self._pools:
            rows = self.rng.standard_normal((self.POOL_ROWS, row_len), dtype=np.float32)
            rows *= np.float32(self.s.weight_scale / np.sqrt(row_len))
            if native.can_quantize(t):
                self._pools[t, row_len] = native.quantize(t, rows, n_threads=native.default_threads())
            else:  # e.g. Q4_0: gguf-py's numpy quantizer (a few seconds for the pool)
                import gguf.quants

                self._pools[t, row_len] = gguf.quants.quantize(rows, t)
        return self._pools[t, row_len]  # uint8 [POOL_ROWS, row bytes]

    def values(self, name: str, shape: tuple[int, ...], t: GGMLType) -> np.ndarray:
        s = self.s
        if t != GGMLType.F32:
            pool = self._pool(t, shape[-1])
            return pool[self.rng.integers(0, self.POOL_ROWS, int(np.prod(shape[:-1])))].reshape(-1)
        if name.endswith("norm.weight"):
            return np.ones(shape, dtype=np.float32)
        if s.skew and "ffn_gate_inp" in name:
            return self._router(shape)
        std = 1.0 if name.startswith("token_embd") else 0.3 if name.startswith("output") else 1.0 / np.sqrt(shape[-1])
        return self.rng.standard_normal(shape, dtype=np.float32) * np.float32(std)


def _tokenizer(w, vocab: int) -> None:
    """Byte-level BPE: the 256 byte symbols, one merge, then special tokens up to `vocab`."""
    from strata.tokenizer import bytes_to_unicode

    chars = bytes_to_unicode()
    tokens = [chars[b] for b in range(256)] + [chars[32] + "t"]
    tokens += [f"<|special_{i}|>" for i in range(len(tokens), vocab)]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([1] * 257 + [3] * (vocab - 257))
    w.add_token_merges([f"{chars[32]} t"])
    w.add_eos_token_id(vocab - 1)


def check_shape(s: Shape) -> None:
    if s.arch not in ("qwen3moe", "llama"):
        raise ValueError(f"synthetic model: arch must be 'qwen3moe' or 'llama', found {s.arch!r}")
    if s.arch == "llama" and s.hidden % s.n_head:
        raise ValueError(f"synthetic model: llama needs hidden ({s.hidden}) divisible by heads ({s.n_head})")
    if s.n_head % s.n_head_kv or not 1 <= s.top_k <= s.n_experts or s.vocab < 258 or s.n_layers < 1:
        raise ValueError(f"synthetic model: inconsistent shape {s}")
    align = block_size(GGMLType[s.expert_type])[0]
    if s.hidden % max(align, 32) or s.ff % align:
        raise ValueError(f"synthetic model: hidden {s.hidden} and ff {s.ff} must be multiples of {align} "
                         f"for {s.expert_type} experts")


def _metadata(w, s: Shape) -> None:
    head = [(w.add_context_length, 4096), (w.add_embedding_length, s.hidden), (w.add_block_count, s.n_layers)]
    tail = [(w.add_layer_norm_rms_eps, 1e-6), (w.add_rope_freq_base, 1e6), (w.add_expert_count, s.n_experts),
            (w.add_expert_used_count, s.top_k), (w.add_vocab_size, s.vocab)]
    if s.arch == "qwen3moe":
        keys = head + [(w.add_feed_forward_length, 2 * s.ff), (w.add_expert_feed_forward_length, s.ff),
                       (w.add_head_count, s.n_head), (w.add_head_count_kv, s.n_head_kv),
                       (w.add_key_length, HEAD_DIM), (w.add_value_length, HEAD_DIM)] + tail + [
            (w.add_expert_weights_norm, True)]
    else:  # llama.cpp's llama loader reads the expert width from feed_forward_length
        keys = head + [(w.add_feed_forward_length, s.ff), (w.add_head_count, s.n_head),
                       (w.add_head_count_kv, s.n_head_kv), (w.add_rope_dimension_count, s.hidden // s.n_head)] + tail
    for add, value in keys:
        add(value)
    _tokenizer(w, s.vocab)


def write(path: str | os.PathLike, s: Shape, *, progress=None, drop_cache: bool = True,
          split_max_size: int = 0) -> Path:
    """Write the model to `path` (through temporary names: a failed write leaves no file); returns
    the file that opens it (`path`, or its first part). `split_max_size` > 0: parts of at most that many tensor bytes each, in
    llama.cpp's gguf-split layout and names (PATH-00001-of-0000N.gguf; one part is `path` itself).
    `progress(bytes_written, total)` is called after each tensor. With `drop_cache` the files' pages
    are dropped from the page cache, so their first reader goes to the disk."""
    import gguf

    from strata.gguf.split import open_part_files, part_paths

    check_shape(s)
    w = gguf.GGUFWriter(None, s.arch, split_max_size=split_max_size)
    _metadata(w, s)
    tensors = plan(s)
    for name, shape, t in tensors:
        w.add_tensor_info(name, shape, np.dtype(np.float32), _bytes(t, shape), raw_dtype=t)
    targets = part_paths(Path(path), len(w.tensors))
    tmps = [target.with_name(target.name + ".partial") for target in targets]
    try:
        open_part_files(w, tmps)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        _write_data(w, _Weights(s), tensors, progress, drop_cache)
        w.close()
        for tmp, target in zip(tmps, targets):
            os.replace(tmp, target)
    except BaseException:
        w.close()
        for tmp in tmps:
            tmp.unlink(missing_ok=True)
        raise
    return targets[0]


def _write_data(w, weights: _Weights, tensors: list[tuple[str, tuple[int, ...], GGMLType]], progress,
                drop_cache: bool) -> None:
    """Every tensor's bytes into the part holding it (`w.tensors`: names per part), in file order."""
    total, done, i = sum(_bytes(t, shape) for _, shape, t in tensors), 0, 0
    for fout, names in zip(w.fout, w.tensors):
        w.write_padding(fout, fout.tell())
        for name in names:
            assert name == tensors[i][0], f"{name}: tensors out of order"
            data = weights.values(*tensors[i])
            fout.write(data.tobytes())
            w.write_padding(fout, data.nbytes)
            done, i = done + data.nbytes, i + 1
            if progress is not None:
                progress(done, total)
        fout.flush()
        os.fsync(fout.fileno())
        if drop_cache:
            os.posix_fadvise(fout.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


__all__ = ["HEAD_DIM", "PRESETS", "Preset", "Shape", "file_bytes", "plan", "preset_shape", "write"]
