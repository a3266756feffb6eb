"""Benchmark: the pager reads expert slabs at (at least 80% of) the disk's sequential O_DIRECT rate.

    python benchmarks/pager_read.py [--gib 1.5] [--file PATH] [--keep] [--threads 4] [--depth 16] [--json]

Writes a synthetic Qwen3-MoE-shaped GGUF of about `--gib` GiB (hidden 2048, expert width 768,
64 experts per layer, random Q4_K bytes: ~0.84 MiB slabs, the size of Qwen3-30B-A3B's) with
gguf-py's writer, tensor by tensor, drops its pages from the page cache, then runs
`strata bench pager` on it: the sequential O_DIRECT rate of the file beside the pager reading
every slab in random order (and the host tier loading every expert). Not a unit test.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import gguf  # noqa: E402
from gguf.constants import GGMLQuantizationType as Q  # noqa: E402

from strata.bench.pager import bench_pager  # noqa: E402
from strata.commands.bench import format_pager  # noqa: E402


def _q4_k_bytes(shape: tuple[int, ...]) -> int:
    elems, nbytes = gguf.GGML_QUANT_SIZES[Q.Q4_K]
    return int(np.prod(shape)) // elems * nbytes


def _plan(n_layers: int, n_experts: int, hidden: int, ff: int, vocab: int) -> list[tuple[str, tuple, Q, int]]:
    """(name, row-major shape, type, bytes) of every tensor, in file order."""
    plan = [("token_embd.weight", (vocab, hidden), Q.F32, vocab * hidden * 4),
            ("output_norm.weight", (hidden,), Q.F32, hidden * 4),
            ("output.weight", (vocab, hidden), Q.F32, vocab * hidden * 4)]
    q, kv = 16 * 128, 2 * 128
    for i in range(n_layers):
        plan += [(f"blk.{i}.attn_norm.weight", (hidden,), Q.F32, hidden * 4),
                 (f"blk.{i}.attn_q.weight", (q, hidden), Q.Q4_K, _q4_k_bytes((q, hidden))),
                 (f"blk.{i}.attn_k.weight", (kv, hidden), Q.Q4_K, _q4_k_bytes((kv, hidden))),
                 (f"blk.{i}.attn_v.weight", (kv, hidden), Q.Q4_K, _q4_k_bytes((kv, hidden))),
                 (f"blk.{i}.attn_output.weight", (hidden, q), Q.Q4_K, _q4_k_bytes((hidden, q))),
                 (f"blk.{i}.attn_q_norm.weight", (128,), Q.F32, 512),
                 (f"blk.{i}.attn_k_norm.weight", (128,), Q.F32, 512),
                 (f"blk.{i}.ffn_norm.weight", (hidden,), Q.F32, hidden * 4),
                 (f"blk.{i}.ffn_gate_inp.weight", (n_experts, hidden), Q.F32, n_experts * hidden * 4)]
        for part, shape in (("gate", (n_experts, ff, hidden)), ("up", (n_experts, ff, hidden)),
                            ("down", (n_experts, hidden, ff))):
            plan.append((f"blk.{i}.ffn_{part}_exps.weight", shape, Q.Q4_K, _q4_k_bytes(shape)))
    return plan


def write_synthetic_gguf(path: Path, target_bytes: int, *, n_experts: int = 64, hidden: int = 2048,
                         ff: int = 768, vocab: int = 512, seed: int = 0) -> Path:
    """A qwen3moe GGUF of about `target_bytes` with random tensor bytes, written tensor by tensor."""
    per_layer = 3 * _q4_k_bytes((n_experts, ff, hidden))
    n_layers = max(1, round(target_bytes / per_layer))
    w = gguf.GGUFWriter(None, "qwen3moe")
    w.add_context_length(4096)
    w.add_embedding_length(hidden)
    w.add_block_count(n_layers)
    w.add_feed_forward_length(2 * ff)
    w.add_expert_feed_forward_length(ff)
    w.add_head_count(16)
    w.add_head_count_kv(2)
    w.add_key_length(128)
    w.add_value_length(128)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1e6)
    w.add_expert_count(n_experts)
    w.add_expert_used_count(8)
    w.add_vocab_size(vocab)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(vocab)])
    plan = _plan(n_layers, n_experts, hidden, ff, vocab)
    for name, shape, qtype, nbytes in plan:
        w.add_tensor_info(name, shape, np.dtype(np.float32), nbytes, raw_dtype=qtype)
    w.write_header_to_file(path=path)
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    fout = w.fout[0]
    w.write_padding(fout, fout.tell())
    rng = np.random.default_rng(seed)
    for name, shape, qtype, nbytes in plan:
        fout.write(rng.bytes(nbytes))
        w.write_padding(fout, nbytes)
    fout.flush()
    os.fsync(fout.fileno())
    # The page cache cannot be dropped machine-wide here, but a file's own clean pages can be.
    os.posix_fadvise(fout.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    w.close()
    return path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gib", type=float, default=1.5, help="size of the synthetic file (default 1.5 GiB)")
    p.add_argument("--file", type=Path, default=None, help="use (or write, if missing) this file")
    p.add_argument("--keep", action="store_true", help="keep the synthetic file")
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--depth", type=int, default=16)
    p.add_argument("--chunk-kib", type=int, default=0)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    path = args.file or Path(tempfile.gettempdir()) / "strata-pager-bench.gguf"
    wrote = not path.exists()
    if wrote:
        t0 = time.perf_counter()
        write_synthetic_gguf(path, int(args.gib * 2**30))
        print(f"wrote {path} ({path.stat().st_size / 2**30:.2f} GiB) in {time.perf_counter() - t0:.1f} s",
              file=sys.stderr)
    try:
        result = bench_pager(path, n_threads=args.threads, depth=args.depth, chunk_bytes=args.chunk_kib * 1024,
                             repeat=args.repeat)
    finally:
        if wrote and not args.keep:
            path.unlink()
    print(json.dumps(result, indent=2) if args.json else format_pager(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
