"""A synthetic Qwen3-MoE GGUF of any size that Strata can decode: random but well-formed weights.

    python benchmarks/synthetic_moe.py OUT.gguf --gib 1.5 [--hidden 1024 --ff 512 --experts 208 --top-k 4]
    python benchmarks/synthetic_moe.py OUT.gguf --shape medium        # a named shape (SHAPES below)
    python benchmarks/synthetic_moe.py OUT.gguf --arch llama --layers 24 --experts 8 --top-k 2 \
        --ff 3584 --heads 8 --heads-kv 2 --expert-type Q4_K         # Mixtral-shaped

Written with gguf-py's writer tensor by tensor (peak memory: one tensor), so files much larger
than RAM are fine. Expert tensors are Q4_K and attention Q8_0, quantized from Gaussian values of
std weight_scale / sqrt(row length); norms are ones, routers and embeddings Gaussian. The model
computes finite logits and routes tokens roughly uniformly over the experts (the hard case for
a cache); `weight_scale` sets how much each layer changes the residual stream, so how well the
router look-ahead predicts (real models change it little from one layer to the next).
The number of layers is chosen to reach the size asked for (or given with --layers). The file's
own pages are dropped from the page cache after writing, so the first read of it goes to the disk.

Options beyond the defaults: `--expert-type` (any format strata.native quantizes: Q4_0, Q4_K,
...), `--arch llama` (Mixtral as llama.cpp's converter writes it: no q/k norms, head size
hidden / heads, expert FFN width in feed_forward_length), `--vocab`, `--heads`, `--heads-kv`,
and `--shape NAME` for the shapes the benchmarks share (SHAPES: FACTS.md's "medium" and
"large", a Mixtral-shaped file, tiny smoke-test files).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import gguf  # noqa: E402
import gguf.quants  # noqa: E402
from gguf.constants import GGMLQuantizationType as Q  # noqa: E402

from strata import native  # noqa: E402
from strata.quant import block_size  # noqa: E402

HEAD_DIM = 128


def _bytes(t: Q, shape: tuple[int, ...]) -> int:
    elems, nbytes = block_size(t)
    return int(np.prod(shape)) // elems * nbytes


#: Named shapes (keyword arguments of `write`, with `n_layers`) shared by the benchmarks.
#: medium/large: FACTS.md's llama.cpp reference files (1.4 and 5.5 GB); mixtral: 8 experts top-2
#: with Mixtral's FFN ratio (3.5 x hidden), Q4_K experts (1.2 GB); small: medium's layers, 4 of
#: them (0.23 GB); tiny*: smoke tests (~5 MB).
SHAPES: dict[str, dict] = {
    "medium": dict(arch="qwen3moe", n_layers=24, n_experts=64, top_k=8, hidden=1024, ff=512, expert_type="Q4_0"),
    "large": dict(arch="qwen3moe", n_layers=48, n_experts=128, top_k=8, hidden=1024, ff=512, expert_type="Q4_0"),
    "mixtral": dict(arch="llama", n_layers=24, n_experts=8, top_k=2, hidden=1024, ff=3584, expert_type="Q4_K",
                    n_head=8, n_head_kv=2),
    "small": dict(arch="qwen3moe", n_layers=4, n_experts=64, top_k=8, hidden=1024, ff=512, expert_type="Q4_0"),
    "tiny": dict(arch="qwen3moe", n_layers=2, n_experts=8, top_k=2, hidden=256, ff=256, expert_type="Q4_0",
                 n_head=2, n_head_kv=1),
    "tiny-mixtral": dict(arch="llama", n_layers=2, n_experts=4, top_k=2, hidden=256, ff=512, expert_type="Q4_K",
                         n_head=2, n_head_kv=1),
}


def plan(n_layers: int, n_experts: int, hidden: int, ff: int, vocab: int, n_head: int, n_head_kv: int,
         expert_type: Q = Q.Q4_K, arch: str = "qwen3moe"):
    """(name, row-major shape, type) of every tensor, in file order."""
    head_dim = HEAD_DIM if arch == "qwen3moe" else hidden // n_head
    q, kv = n_head * head_dim, n_head_kv * head_dim
    out = [("token_embd.weight", (vocab, hidden), Q.F32), ("output_norm.weight", (hidden,), Q.F32),
           ("output.weight", (vocab, hidden), Q.F32)]
    qk_norms = [("attn_q_norm.weight", (HEAD_DIM,), Q.F32), ("attn_k_norm.weight", (HEAD_DIM,), Q.F32)]
    for i in range(n_layers):
        b = f"blk.{i}."
        out += [(b + "attn_norm.weight", (hidden,), Q.F32), (b + "attn_q.weight", (q, hidden), Q.Q8_0),
                (b + "attn_k.weight", (kv, hidden), Q.Q8_0), (b + "attn_v.weight", (kv, hidden), Q.Q8_0),
                (b + "attn_output.weight", (hidden, q), Q.Q8_0)]
        out += [(b + name, shape, t) for name, shape, t in qk_norms] if arch == "qwen3moe" else []
        out += [(b + "ffn_norm.weight", (hidden,), Q.F32), (b + "ffn_gate_inp.weight", (n_experts, hidden), Q.F32),
                (b + "ffn_gate_exps.weight", (n_experts, ff, hidden), expert_type),
                (b + "ffn_up_exps.weight", (n_experts, ff, hidden), expert_type),
                (b + "ffn_down_exps.weight", (n_experts, hidden, ff), expert_type)]
    return out


class _Weights:
    """Quantized Gaussian weights, std weight_scale / sqrt(row length). Expert tensors are rows
    drawn from a pool of quantized rows (quantizing gigabytes of fresh values would take minutes;
    drawn rows still give every expert its own matrix)."""

    POOL_ROWS = 8192

    def __init__(self, rng: np.random.Generator, scale: float):
        self.rng, self.scale, self._pools = rng, scale, {}

    def _pool(self, t: Q, row_len: int) -> np.ndarray:
        if (t, row_len) not in self._pools:
            rows = self.rng.standard_normal((self.POOL_ROWS, row_len), dtype=np.float32)
            rows *= np.float32(self.scale / np.sqrt(row_len))
            if native.can_quantize(t):
                self._pools[t, row_len] = native.quantize(t, rows, n_threads=native.default_threads())
            else:  # e.g. Q4_0: gguf-py's numpy quantizer (a few seconds for the pool)
                self._pools[t, row_len] = gguf.quants.quantize(rows, t)
        return self._pools[t, row_len]  # uint8 [POOL_ROWS, row bytes]

    def values(self, name: str, shape: tuple[int, ...], t: Q) -> np.ndarray:
        if t != Q.F32:
            pool = self._pool(t, shape[-1])
            n_rows = int(np.prod(shape[:-1]))
            return pool[self.rng.integers(0, self.POOL_ROWS, n_rows)].reshape(-1)
        if name.endswith("norm.weight"):
            return np.ones(shape, dtype=np.float32)
        std = 1.0 if name.startswith("token_embd") else 0.3 if name.startswith("output") else 1.0 / np.sqrt(shape[-1])
        return rng_normal(self.rng, shape, std)


def rng_normal(rng: np.random.Generator, shape: tuple[int, ...], std: float) -> np.ndarray:
    return rng.standard_normal(shape, dtype=np.float32) * np.float32(std)


def _tokenizer(w: gguf.GGUFWriter, vocab: int) -> None:
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


def write(path: Path, target_bytes: int = 0, *, hidden: int = 1024, ff: int = 512, n_experts: int = 208,
          top_k: int = 4, vocab: int = 512, n_head: int = 4, n_head_kv: int = 1, seed: int = 0,
          weight_scale: float = 1.0, n_layers: int | None = None, expert_type: str | Q = Q.Q4_K,
          arch: str = "qwen3moe") -> Path:
    """Write the model; returns `path`. Layers: `n_layers`, or as many as reach `target_bytes`
    (at least 2). `weight_scale` scales the quantized (attention and expert) weights, so how much
    each layer changes the residual stream. `arch`: "qwen3moe" or "llama" (Mixtral)."""
    expert_type = Q[expert_type] if isinstance(expert_type, str) else Q(expert_type)
    if arch not in ("qwen3moe", "llama"):
        raise ValueError(f"synthetic_moe: arch must be 'qwen3moe' or 'llama', found {arch!r}")
    if arch == "llama" and hidden % n_head:
        raise ValueError(f"synthetic_moe: llama needs hidden ({hidden}) divisible by heads ({n_head})")
    per_layer = 3 * _bytes(expert_type, (n_experts, ff, hidden))
    n_layers = n_layers or max(2, round(target_bytes / per_layer))
    w = gguf.GGUFWriter(None, arch)
    head = [(w.add_context_length, 4096), (w.add_embedding_length, hidden), (w.add_block_count, n_layers)]
    tail = [(w.add_layer_norm_rms_eps, 1e-6), (w.add_rope_freq_base, 1e6), (w.add_expert_count, n_experts),
            (w.add_expert_used_count, top_k), (w.add_vocab_size, vocab)]
    if arch == "qwen3moe":
        keys = head + [(w.add_feed_forward_length, 2 * ff), (w.add_expert_feed_forward_length, ff),
                       (w.add_head_count, n_head), (w.add_head_count_kv, n_head_kv), (w.add_key_length, HEAD_DIM),
                       (w.add_value_length, HEAD_DIM)] + tail + [(w.add_expert_weights_norm, True)]
    else:  # llama.cpp's llama loader reads the expert width from feed_forward_length
        keys = head + [(w.add_feed_forward_length, ff), (w.add_head_count, n_head), (w.add_head_count_kv, n_head_kv),
                       (w.add_rope_dimension_count, hidden // n_head)] + tail
    for add, value in keys:
        add(value)
    _tokenizer(w, vocab)
    tensors = plan(n_layers, n_experts, hidden, ff, vocab, n_head, n_head_kv, expert_type, arch)
    for name, shape, t in tensors:
        w.add_tensor_info(name, shape, np.dtype(np.float32), _bytes(t, shape), raw_dtype=t)
    w.write_header_to_file(path=path)
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    fout = w.fout[0]
    w.write_padding(fout, fout.tell())
    weights = _Weights(np.random.default_rng(seed), weight_scale)
    for name, shape, t in tensors:
        data = weights.values(name, shape, t)
        fout.write(data.tobytes())
        w.write_padding(fout, data.nbytes)
    fout.flush()
    os.fsync(fout.fileno())
    os.posix_fadvise(fout.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)  # the next reader goes to the disk
    w.close()
    return path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--gib", type=float, default=1.5)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--ff", type=int, default=512)
    p.add_argument("--experts", type=int, default=208)
    p.add_argument("--top-k", type=int, default=4)
    p.add_argument("--weight-scale", type=float, default=1.0)
    p.add_argument("--layers", type=int, default=None, help="number of layers (overrides --gib)")
    p.add_argument("--expert-type", default="Q4_K", help="GGML type of the expert tensors (Q4_K, Q4_0, ...)")
    p.add_argument("--arch", choices=("qwen3moe", "llama"), default="qwen3moe", help="llama: Mixtral-shaped")
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--heads-kv", type=int, default=1)
    p.add_argument("--shape", choices=sorted(SHAPES), default=None, help="a named shape; overrides the above")
    a = p.parse_args()
    if a.shape:
        write(a.out, weight_scale=a.weight_scale, vocab=a.vocab, **SHAPES[a.shape])
    else:
        write(a.out, int(a.gib * 2**30), hidden=a.hidden, ff=a.ff, n_experts=a.experts, top_k=a.top_k,
              weight_scale=a.weight_scale, n_layers=a.layers, expert_type=a.expert_type, arch=a.arch,
              vocab=a.vocab, n_head=a.heads, n_head_kv=a.heads_kv)
    print(f"{a.out}: {a.out.stat().st_size / 2**30:.2f} GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
