"""Timing of the pooled matmul and the fused MoE layer on random packed weights (not a test).

    python benchmarks/matmul_pool.py [--threads 1 2] [--type Q4_0] [--repeat 200]
    python benchmarks/matmul_pool.py --gguf FILE [--threads 1 2] [--gap-us 200]

Prints, per thread count: the cost of a near-empty pooled call (dispatch overhead), a decode-sized
matmul (1 token x [1024, 1024]), and one MoE layer shaped like the issue's "medium" file (hidden
1024, expert FFN 512, top-8 of 64 experts) at decode (1 token) and prefill (64 tokens), with the
weight bytes each call reads and the rate that makes. Figures vary with machine load: compare
only inside one run.

With --gguf, the MoE layer is the file's first expert layer read from the mapped file (top-k
from its metadata), at 1 and 64 tokens; each timed call is preceded by --gap-us of busy Python
work, as in the model's decode loop, so the pool's workers are as awake (or asleep) as there.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from strata import native
from strata.quant import block_size, ggml_type, random_blocks


def best_us(fn, repeat):
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(repeat):
            fn()
        best = min(best, (time.perf_counter() - t0) / repeat)
    return best * 1e6


def matmul_case(pool, t, n_rows, row_len, n_tokens, repeat, rng):
    w = random_blocks(t, n_rows * row_len // block_size(t)[0], rng)
    x = rng.standard_normal((n_tokens, row_len), dtype=np.float32)
    y = np.empty((n_tokens, n_rows), np.float32)
    s = np.empty(native.matmul_scratch_bytes(t, n_tokens, row_len), np.uint8)
    us = best_us(lambda: native.matmul_into(pool, t, w, n_rows, row_len, x, y, s), repeat)
    return us, w.nbytes


def moe_case(pool, t, n_tokens, repeat, rng, n_embd=1024, n_ff=512, n_experts=64, top_k=8):
    parts = []
    for rows, cols in [(n_ff, n_embd), (n_ff, n_embd), (n_embd, n_ff)]:
        slab = random_blocks(t, n_experts * rows * cols // block_size(t)[0], rng)
        parts.append(native.MoePart(slab, t, rows, cols))
    parts = native.MoeParts(*parts)
    chosen = np.stack([rng.choice(n_experts, top_k, replace=False) for _ in range(n_tokens)])
    experts = np.unique(chosen).astype(np.int32)
    tokens = [np.nonzero(chosen == e)[0] for e in experts]
    offsets = np.concatenate([[0], np.cumsum([len(tk) for tk in tokens])]).astype(np.int64)
    token_ids = np.concatenate(tokens).astype(np.int32)
    weights = rng.random(len(token_ids), dtype=np.float32)
    x = rng.standard_normal((n_tokens, n_embd), dtype=np.float32)
    out = np.zeros_like(x)
    scratch = np.empty(native.moe_scratch_bytes(parts, n_tokens, len(token_ids)), np.uint8)
    us = best_us(lambda: native.moe_swiglu(pool, x, out, parts, experts, offsets, token_ids, weights, scratch), repeat)
    return us, len(experts) * sum(p.matrix_bytes for p in parts)


def spin_us(us):
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


def gguf_moe(pool, path, n_tokens, gap_us, repeat, rng):
    """Best and median time of one MoE layer call; call i uses expert layer i % n_layers with its own
    random routing, so (as in decoding) the experts' bytes come from memory, not from the cache."""
    from strata.gguf import open_model
    from strata.memory.direct import file_parts

    mf = open_model(path)
    layers = [file_parts(mf, layer) for layer in mf.expert_layers]
    parts = layers[0]
    n_experts, top_k = mf.hparams.n_experts, mf.hparams.n_experts_used
    routes = []
    for _ in range(2 * len(layers)):
        chosen = np.stack([rng.choice(n_experts, top_k, replace=False) for _ in range(n_tokens)])
        experts = np.unique(chosen).astype(np.int32)
        tokens = [np.nonzero(chosen == e)[0] for e in experts]
        offsets = np.concatenate([[0], np.cumsum([len(tk) for tk in tokens])]).astype(np.int64)
        token_ids = np.concatenate(tokens).astype(np.int32)
        routes.append((experts, offsets, token_ids, rng.random(len(token_ids), dtype=np.float32)))
    x = rng.standard_normal((n_tokens, parts.n_embd), dtype=np.float32)
    out = np.zeros_like(x)
    scratch = np.empty(native.moe_scratch_bytes(parts, n_tokens, n_tokens * top_k), np.uint8)
    nbytes = []

    def call(i):
        spin_us(gap_us)
        route = routes[i % len(routes)]
        lp = layers[i % len(layers)]
        t0 = time.perf_counter()
        native.moe_swiglu(pool, x, out, lp, *route, scratch)
        nbytes.append(len(route[0]) * sum(p.matrix_bytes for p in lp))
        return time.perf_counter() - t0

    for i in range(len(layers)):                      # map every layer's pages once
        call(i)
    nbytes.clear()
    times = [call(i) for i in range(repeat)]
    rate = sum(nbytes) / sum(times)
    times.sort()
    return times[0] * 1e6, times[len(times) // 2] * 1e6, rate


def gguf_main(args, rng):
    print(f"impl {native.default_impl()}, {args.gguf}, gap {args.gap_us} us")
    for n in args.threads:
        with native.ComputePool(n) as pool:
            for n_tokens in (1, 64):
                best, med, rate = gguf_moe(pool, args.gguf, n_tokens, args.gap_us,
                                           args.repeat if n_tokens == 1 else max(3, args.repeat // 20), rng)
                print(f"threads {n} T {n_tokens:2d}: best {best:8.1f} us, median {med:8.1f} us "
                      f"({rate / 1e9:5.1f} GB/s of expert bytes on average)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--type", default="Q4_0")
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--gguf", help="time the first expert layer of this file instead of random weights")
    ap.add_argument("--gap-us", type=float, default=200.0, help="busy Python time before each --gguf call")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    if args.gguf:
        return gguf_main(args, rng)
    t = ggml_type(args.type)
    print(f"impl {native.default_impl()}, weights {t.name}")
    for n in args.threads:
        with native.ComputePool(n) as pool:
            empty, _ = matmul_case(pool, t, 32, 256, 1, args.repeat * 5, rng)
            dec, wb = matmul_case(pool, t, 1024, 1024, 1, args.repeat, rng)
            moe1, mb1 = moe_case(pool, t, 1, args.repeat, rng)
            moe64, mb64 = moe_case(pool, t, 64, max(1, args.repeat // 20), rng)
            print(f"threads {n}: small call {empty:7.1f} us | matmul 1x[1024,1024] {dec:7.1f} us "
                  f"({wb / dec / 1e3:5.1f} GB/s) | MoE T=1 {moe1:7.1f} us ({mb1 / moe1 / 1e3:5.1f} GB/s) | "
                  f"MoE T=64 {moe64:8.1f} us ({mb64 / moe64 / 1e3:5.1f} GB/s of experts)")


if __name__ == "__main__":
    main()
