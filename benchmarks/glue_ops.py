"""Per-call time of the native decode glue (strata.native.glue) against the torch / numpy
formulations it replaces, at decode (T = 1) shapes of the issue's "medium" model (not a test).

    python benchmarks/glue_ops.py [--repeat 2000] [--n-ctx 100]

Shapes: D = 1024, H = 16, Hkv = 4, hd = 64, KV cache of C = 512 positions (attending to n_ctx),
E = 64 experts, top-8. torch runs one thread, as beside the native pool. Prints microseconds per
call (best of 3 rounds) and the ratio. Figures vary with machine load: compare only inside one run.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from strata import native
from strata.models.attention import Attention
from strata.models.batch import Batch
from strata.models.layers import RMSNorm
from strata.models.moe import Router

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.matmul_pool import best_us  # noqa: E402  (one timing helper for the benchmarks)
from strata.models.rope import Rope




def numpy_grouping(ids: torch.Tensor, weights: torch.Tensor):
    """RoutedExperts._packed_tokens' grouping (its numpy part)."""
    a = ids.numpy()
    K = a.shape[1]
    order = np.argsort(a, axis=None, kind="stable")
    used, starts = np.unique(a.reshape(-1)[order], return_index=True)
    return used, np.append(starts, order.size).astype(np.int64), (order // K).astype(np.int32), \
        weights.float().numpy().reshape(-1)[order]


def cases(n_ctx: int):
    D, H, Hkv, hd, C, E, K, T = 1024, 16, 4, 64, 512, 64, 8, 1
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(T, D, generator=g), torch.randn(D, generator=g)
    out = torch.empty(T, D)
    norm = RMSNorm(w, 1e-6)
    qkv = torch.randn(T, (H + 2 * Hkv) * hd, generator=g)
    q, k = qkv[:, :H * hd].view(T, H, hd), qkv[:, H * hd:(H + Hkv) * hd].view(T, Hkv, hd)
    v = qkv[:, (H + Hkv) * hd:].view(T, Hkv, hd)
    hw, q_out = torch.randn(hd, generator=g), torch.empty(T, H, hd)
    head_norm = RMSNorm(hw, 1e-6)
    rope = Rope.__new__(Rope)
    rope.neox, rope.rope_dim = True, hd
    ang = torch.tensor([float(n_ctx - 1)])[:, None] / (10000 ** (torch.arange(0, hd, 2).float() / hd))[None]
    cos, sin = ang.cos(), ang.sin()
    P = 16  # the paged KV cache's blocks
    N = 2 * C // P
    k_cache, v_cache = torch.randn(N, Hkv, P, hd, generator=g), torch.randn(N, Hkv, P, hd, generator=g)
    batch = Batch.make([list(range(C // P, 2 * C // P))], [n_ctx - 1], [1], P)
    n_ctx_t, attn_out = batch.positions + 1, torch.empty(T, H * hd)
    router_w, h = torch.randn(E, D, generator=g), torch.randn(T, D, generator=g)
    router = Router(router_w, K, "softmax", True, 1.0)
    logits = F.linear(h, router_w).float()
    ids, rw = torch.empty(T, K, dtype=torch.int64), torch.empty(T, K)
    native.route(logits, K, "softmax", True, 1.0, ids, rw)
    logits_out = torch.empty(T, E)
    used, offsets = torch.empty(E, dtype=torch.int32), torch.empty(E + 1, dtype=torch.int64)
    tok, ws = torch.empty(T * K, dtype=torch.int32), torch.empty(T * K)

    def torch_router_after_logits():
        p = logits.softmax(dim=-1)
        wt, i = p.topk(K, dim=-1)
        return wt / wt.sum(dim=-1, keepdim=True), i

    def torch_kv_write():
        batch.write(k_cache, k)
        batch.write(v_cache, v)

    return [
        ("rmsnorm [1, 1024]", lambda: norm(x), lambda: native.rmsnorm(x, w, 1e-6, out)),
        ("rmsnorm per head [1, 16, 64]", lambda: head_norm(q), lambda: native.rmsnorm(q, hw, 1e-6, q_out)),
        ("rope q [1, 16, 64] + k [1, 4, 64]", lambda: (rope.apply(q, cos, sin), rope.apply(k, cos, sin)),
         lambda: (native.rope(q, cos, sin, hd, True), native.rope(k, cos, sin, hd, True))),
        ("kv write", torch_kv_write,
         lambda: native.kv_write(k, v, k_cache, v_cache, batch.token_blocks, batch.token_offsets)),
        (f"attention decode (n_ctx {n_ctx}, avx2)", lambda: Attention.attend_decode(None, q, batch, k_cache, v_cache),
         lambda: native.attn_decode(q, k_cache, v_cache, batch.block_table, n_ctx_t, 1 / math.sqrt(hd), attn_out)),
        (f"attention decode (n_ctx {n_ctx}, scalar)", lambda: Attention.attend_decode(None, q, batch, k_cache, v_cache),
         lambda: native.attn_decode(q, k_cache, v_cache, batch.block_table, n_ctx_t, 1 / math.sqrt(hd), attn_out,
                                    impl="scalar")),
        ("router after logits (E 64, top-8)", torch_router_after_logits,
         lambda: native.route(logits, K, "softmax", True, 1.0, ids, rw)),
        ("router with its F.linear", lambda: router(h),
         lambda: native.route(F.linear(h, router_w), K, "softmax", True, 1.0, ids, rw)),
        ("router with native matvec (F32 [64, 1024])", lambda: router(h),
         lambda: native.route(native.matvec(h, router_w, logits_out), K, "softmax", True, 1.0, ids, rw)),
        ("group assignments (8)", lambda: numpy_grouping(ids, rw),
         lambda: native.group_assignments(ids, rw, E, used, offsets, tok, ws)),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=2000)
    ap.add_argument("--n-ctx", type=int, default=100)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"{'op':44s} {'torch/numpy us':>15s} {'native us':>10s} {'ratio':>7s}")
    total_t = total_n = 0.0
    for name, ref, nat in cases(args.n_ctx):
        t_ref, t_nat = best_us(ref, args.repeat), best_us(nat, args.repeat)
        if not any(word in name for word in ("scalar", "F.linear", "after logits")):
            total_t, total_n = total_t + t_ref, total_n + t_nat
        print(f"{name:44s} {t_ref:15.2f} {t_nat:10.2f} {t_ref / t_nat:7.1f}")
    print(f"{'sum (avx2 attention, router with matvec)':44s} {total_t:15.2f} {total_n:10.2f} {total_t / total_n:7.1f}")


if __name__ == "__main__":
    main()
