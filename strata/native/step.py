"""A decoder layer's attention half and router as one native call (native/step.c).

    layer = native.DecodeAttn(n_embd=D, n_head=H, n_head_kv=Hkv, head_dim=hd, rope_dim=R, neox=True,
                              norm_eps=eps, attn_scale=hd ** -0.5, attn_norm=w1, ffn_norm=w2,
                              qkv=(Q8_0, qkv_bytes), o=(Q8_0, o_bytes), router=router_w, n_used=8)
    layer.bind_cache(k_cache, v_cache)                 # [N, Hkv, P, hd] float32 blocks, once (again if moved)
    out = native.StepOutputs(layer, max_seq)           # xn, routing and its grouping, made once
    layer.run(pool, block_table, positions, cos, sin, x, out, scratch)   # x += attention; out filled

For each decode step (one new token per sequence) this does what the per-call glue does between
the layer's input and its routed experts, in the same order, so the results are the same bytes.
The descriptor and the outputs are built once; a call casts five pointers and checks shapes.
Holds no policy about when to use it: the models decide.
"""
from __future__ import annotations

from typing import Any

from strata.quant import ggml_type

from ._lib import check, ffi, impl_code, lib
from .glue import _GATING, kv_cache_type, kv_row_bytes



def _f32(t: Any, what: str, n: int | None = None) -> Any:
    """Pointer of a contiguous CPU float32 tensor (of `n` elements when given), or NULL for None."""
    if t is None:
        return ffi.NULL
    if str(t.dtype) != "torch.float32" or t.device.type != "cpu" or not t.is_contiguous() or (n is not None and t.numel() != n):
        raise ValueError(f"decode step: {what} must be a contiguous CPU float32 tensor"
                         f"{'' if n is None else f' of {n} values'}, found {t.dtype} {tuple(t.shape)} on {t.device}")
    return ffi.cast("float *", t.data_ptr())


def _routing(D: int, router: Any, n_used: int, gating: str, norm_weights: bool, weights_scale: float,
             router_bias: Any, selection_bias: Any, n_groups: int, n_groups_used: int, group_top: int) -> dict:
    """The routing fields a layer struct of step.c shares (strata_attn_layer, strata_deltanet_layer):
    router [n_experts, D] (None: a dense layer) and how it picks n_used experts."""
    if gating not in _GATING:
        raise ValueError(f"expert gating function {gating!r} is not supported (expected softmax, sigmoid or softmax_weight)")
    n_experts = 0 if router is None else int(router.shape[0])
    return {"router": _f32(router, "router", None if router is None else n_experts * D), "n_experts": n_experts,
            "n_used": n_used, "gating": _GATING[gating], "norm_weights": 1 if norm_weights else 0,
            "weights_scale": weights_scale, "router_bias": _f32(router_bias, "router bias", n_experts),
            "selection_bias": _f32(selection_bias, "selection bias", n_experts), "n_groups": n_groups,
            "n_groups_used": n_groups_used, "group_top": group_top}


class DecodeAttn:
    """The attention half of one decoder layer (and its router, for an MoE layer), described once.

    Matrices are (ggml type, packed bytes as a uint8 tensor): qkv stacks q, k, v by rows
    [(H + 2 Hkv) hd, D]; o is [D, H hd]. Norm weights, biases and the router [E, D] are float32
    tensors; gpt-oss adds sinks [H], a sliding window, the output bias bo [D] and router_bias [E];
    DeepSeek a selection bias [E] and expert groups, and `mla` for latent attention: a dict of
    kv_lora, q_lora, nope, v_dim, wkv_a, wq_a, k_b and v_b (type, bytes), q_a_norm, kv_a_norm
    (qkv is then wq, or wq_b with a query LoRA; o is [D, H v_dim]). `q_gate` (qwen3next's gated
    attention): qkv's query rows are [q_h | gate_h] per head and the attention's output is
    multiplied by sigmoid(gate) before o. Llama 4: `chunk` > 0 attends within the query's chunk,
    `qk_l2_eps` normalises q and k per head after RoPE (no weight), `temperature` (floor, scale)
    scales a global layer's queries. The tensors are kept alive by this object."""

    def __init__(self, *, n_embd: int, n_head: int, n_head_kv: int, head_dim: int, rope_dim: int, neox: bool,
                 norm_eps: float, attn_scale: float, attn_norm: Any, ffn_norm: Any, qkv: tuple[Any, Any],
                 o: tuple[Any, Any], bqkv: Any = None, q_norm: Any = None, k_norm: Any = None,
                 qk_norm_per_head: bool = True, router: Any = None, n_used: int = 0, gating: str = "softmax",
                 norm_weights: bool = False, weights_scale: float = 1.0, sinks: Any = None, window: int = 0,
                 bo: Any = None, router_bias: Any = None, selection_bias: Any = None, n_groups: int = 0,
                 n_groups_used: int = 0, group_top: int = 0, mla: dict | None = None, q_gate: bool = False,
                 chunk: int = 0, qk_l2_eps: float | None = None, temperature: tuple[int, float] | None = None,
                 v: tuple[Any, Any] | None = None):
        D, hq, hkv = n_embd, n_head * head_dim, n_head_kv * head_dim
        if q_gate and (mla is not None or bqkv is not None):
            raise ValueError("decode step: a query output gate goes with grouped-query attention without qkv bias")
        if v is not None and mla is not None:
            raise ValueError("decode step: a v of its own type goes with grouped-query attention")
        self._keep = (attn_norm, ffn_norm, qkv[1], o[1], bqkv, q_norm, k_norm, router, sinks, bo, router_bias,
                      selection_bias, mla, v)
        if window < 0 or chunk < 0:
            raise ValueError(f"decode step: window and chunk must be >= 0, found {window} and {chunk}")
        if (chunk or qk_l2_eps is not None or temperature is not None) and mla is not None:
            raise ValueError("decode step: chunked attention, the L2 q/k norm and the query temperature go with "
                             "grouped-query attention")
        floor, t_scale = temperature if temperature is not None else (0, 0.0)
        if temperature is not None and floor < 1:
            raise ValueError(f"decode step: the query temperature's floor must be >= 1, found {floor}")
        qn = None if q_norm is None else (head_dim if qk_norm_per_head else hq)
        kn = None if k_norm is None else (head_dim if qk_norm_per_head else hkv)
        self.c = ffi.new("strata_attn_layer *", {
            "n_embd": D, "n_head": n_head, "n_head_kv": n_head_kv, "head_dim": head_dim, "rope_dim": rope_dim,
            "neox": 1 if neox else 0, "qk_norm_per_head": 1 if qk_norm_per_head else 0, "norm_eps": norm_eps,
            "attn_scale": attn_scale, "attn_norm": _f32(attn_norm, "attn_norm", D),
            "ffn_norm": _f32(ffn_norm, "ffn_norm", D), "qkv_type": int(ggml_type(qkv[0])),
            "o_type": int(ggml_type(o[0])), "wqkv": ffi.cast("void *", qkv[1].data_ptr()),
            "wo": ffi.cast("void *", o[1].data_ptr()), "wqkv_bytes": qkv[1].numel(), "wo_bytes": o[1].numel(),
            "bqkv": _f32(bqkv, "qkv bias", hq + 2 * hkv), "q_norm": _f32(q_norm, "q_norm", qn),
            "k_norm": _f32(k_norm, "k_norm", kn), "sinks": _f32(sinks, "sinks", n_head), "window": int(window),
            "bo": _f32(bo, "output bias", D), "q_gate": 1 if q_gate else 0, "chunk": int(chunk),
            "qk_l2": 0 if qk_l2_eps is None else 1, "qk_l2_eps": 0.0 if qk_l2_eps is None else qk_l2_eps,
            "temp_floor": int(floor), "temp_scale": float(t_scale),
            **({} if v is None else {"v_type": int(ggml_type(v[0])), "wv": ffi.cast("void *", v[1].data_ptr()),
                                     "wv_bytes": v[1].numel()}),
            **_routing(D, router, n_used, gating, norm_weights, weights_scale, router_bias, selection_bias, n_groups,
                       n_groups_used, group_top)})
        if mla is not None:  # latent attention: see strata.h strata_attn_layer
            c, L, Q = self.c, mla["kv_lora"], mla["q_lora"]
            c.kv_lora, c.q_lora, c.nope, c.v_dim = L, Q, mla["nope"], mla["v_dim"]
            c.wkv_a_type, c.wkv_a = int(ggml_type(mla["wkv_a"][0])), ffi.cast("void *", mla["wkv_a"][1].data_ptr())
            c.wkv_a_bytes = mla["wkv_a"][1].numel()
            if Q:
                c.wq_a_type, c.wq_a = int(ggml_type(mla["wq_a"][0])), ffi.cast("void *", mla["wq_a"][1].data_ptr())
                c.wq_a_bytes = mla["wq_a"][1].numel()
                c.q_a_norm = _f32(mla["q_a_norm"], "q_a_norm", Q)
            c.kv_a_norm = _f32(mla["kv_a_norm"], "kv_a_norm", L)
            for name in ("k_b", "v_b"):  # packed [H kv_lora, nope] and [H v_dim, kv_lora]
                t, data = mla[name]
                setattr(c, f"{name}_type", int(ggml_type(t)))
                setattr(c, name, ffi.cast("void *", data.data_ptr()))
                setattr(c, f"{name}_bytes", data.numel())
        self.n_embd, self.n_experts, self.n_used = D, int(self.c.n_experts), n_used
        self._cache: tuple[int, int] | None = None

    def bind_cache(self, k_cache: Any, v_cache: Any) -> None:
        """Point at the layer's paged KV cache [N, Hkv, P, row] (N blocks of P positions, contiguous;
        rows of hd values in float32, float16 or bfloat16, or uint8 rows of Q8_0 blocks); cheap
        when unchanged."""
        key = (k_cache.data_ptr(), v_cache.data_ptr())
        if key == self._cache:
            return
        c = self.c
        kv_type = kv_cache_type(k_cache)
        row = kv_row_bytes(kv_type, c.kv_lora + c.rope_dim if c.kv_lora else c.head_dim) // k_cache.element_size()
        shape = (k_cache.shape[0], c.n_head_kv, k_cache.shape[2], row)
        if (tuple(k_cache.shape) != shape or not k_cache.is_contiguous() or k_cache.is_cuda or
                (not c.kv_lora and (tuple(v_cache.shape) != shape or v_cache.dtype != k_cache.dtype
                                    or not v_cache.is_contiguous()))):
            raise ValueError(f"decode step: caches {tuple(k_cache.shape)} and {tuple(v_cache.shape)} "
                             f"({k_cache.dtype}) must be contiguous CPU tensors [N, {c.n_head_kv}, P, {row}]")
        c.k_cache = ffi.cast("void *", k_cache.data_ptr())
        c.v_cache = c.k_cache if c.kv_lora else ffi.cast("void *", v_cache.data_ptr())  # latent: one cache of rows
        c.kv_type = kv_type
        c.n_blocks, c.block_size = shape[0], shape[2]
        self._keep_cache, self._cache = (k_cache, v_cache), key

    def scratch_bytes(self, n_seq: int) -> int:
        out = ffi.new("int64_t *")
        check(lib.strata_decode_attn_scratch_bytes(self.c, n_seq, out), f"decode step scratch for {n_seq} sequences")
        return int(out[0])

    def run(self, pool: Any, block_table: Any, positions: Any, cos: Any, sin: Any, x: Any, out: StepOutputs,
            scratch: Any, impl: str = "auto") -> int:
        """x [B, D] float32 += the layer's attention for B sequences (one new token each, sequence b at
        positions[b], int64 [B], its cache blocks in block_table[b], int64 [B, M] contiguous; rope
        cos/sin [B, R/2]); out.xn[:B] = ffn_norm(x)
        and, for an MoE layer, out's routing and grouping. Returns the number of experts used."""
        if self._cache is None:
            raise ValueError("decode step: bind_cache first")
        B = x.shape[0]
        if (tuple(x.shape) != (B, self.n_embd) or str(x.dtype) != "torch.float32" or not x.is_contiguous()
                or block_table.dim() != 2 or block_table.shape[0] != B or not block_table.is_contiguous()
                or positions.shape != (B,) or str(block_table.dtype) != "torch.int64"
                or str(positions.dtype) != "torch.int64" or B > out.capacity or out.layer_experts != self.n_experts):
            raise ValueError(f"decode step: x {tuple(x.shape)} {x.dtype}, block_table {tuple(block_table.shape)} "
                             f"(int64 [B, M]), positions {tuple(positions.shape)} (int64 [B]); outputs for "
                             f"{out.capacity} sequences of "
                             f"{out.layer_experts} experts, layer has {self.n_experts}")
        cp = sp = ffi.NULL
        if self.c.rope_dim:
            half = self.c.rope_dim // 2
            cp, sp = _f32(cos, "rope cos", B * half), _f32(sin, "rope sin", B * half)
        status = lib.strata_decode_attn(pool.ptr, self.c, B, ffi.cast("int64_t *", block_table.data_ptr()),
                                        block_table.shape[1], ffi.cast("int64_t *", positions.data_ptr()), cp, sp,
                                        ffi.cast("float *", x.data_ptr()), out.xn_ptr, out.ids_ptr, out.w_ptr,
                                        out.groups if self.n_experts else ffi.NULL,
                                        ffi.cast("void *", scratch.data_ptr()), scratch.numel(), impl_code(impl))
        if status:
            check(status, f"decode step of {B} sequences (block table, positions or cache too small?)")
        return int(out.groups.n_used) if self.n_experts else 0


class DecodeDeltaNet:
    """A gated DeltaNet layer's decode half (and its router, for an MoE layer), described once
    (native/step.c strata_decode_deltanet): n_k_heads Hk, n_v_heads Hv, head dims dk and dv,
    `tiled` (value head j reads key head j % Hk, else j // (Hv / Hk)); w_in (type, bytes) stacks
    q|k|v, z and b|a by rows (`ba_per_key_head`: b|a per key head, qwen3next's wba), w_out is
    [D, Hv dv]; conv [C, K], dt and ssm_a [Hv], ssm_norm [dv] float32. The router's arguments are
    DecodeAttn's. StepOutputs and the MoE call take it as they take a DecodeAttn."""

    def __init__(self, *, n_embd: int, n_k_heads: int, n_v_heads: int, head_k_dim: int, head_v_dim: int,
                 tiled: bool, ba_per_key_head: bool, norm_eps: float, ssm_eps: float, attn_norm: Any, ffn_norm: Any,
                 w_in: tuple[Any, Any], w_out: tuple[Any, Any], conv: Any, dt: Any, ssm_a: Any, ssm_norm: Any,
                 router: Any = None, n_used: int = 0, gating: str = "softmax", norm_weights: bool = False,
                 weights_scale: float = 1.0, router_bias: Any = None, selection_bias: Any = None, n_groups: int = 0,
                 n_groups_used: int = 0, group_top: int = 0):
        D, Hv, C = n_embd, n_v_heads, 2 * n_k_heads * head_k_dim + n_v_heads * head_v_dim
        K = int(conv.shape[-1])
        self._keep = (attn_norm, ffn_norm, w_in[1], w_out[1], conv, dt, ssm_a, ssm_norm, router, router_bias,
                      selection_bias)
        self.c = ffi.new("strata_deltanet_layer *", {
            "n_embd": D, "n_k_heads": n_k_heads, "n_v_heads": Hv, "head_k_dim": head_k_dim, "head_v_dim": head_v_dim,
            "conv_kernel": K, "tiled": 1 if tiled else 0, "ba_per_key_head": 1 if ba_per_key_head else 0,
            "norm_eps": norm_eps, "ssm_eps": ssm_eps, "attn_norm": _f32(attn_norm, "attn_norm", D),
            "ffn_norm": _f32(ffn_norm, "ffn_norm", D), "in_type": int(ggml_type(w_in[0])),
            "out_type": int(ggml_type(w_out[0])), "w_in": ffi.cast("void *", w_in[1].data_ptr()),
            "w_out": ffi.cast("void *", w_out[1].data_ptr()), "w_in_bytes": w_in[1].numel(),
            "w_out_bytes": w_out[1].numel(), "conv": _f32(conv, "conv weight", C * K), "dt": _f32(dt, "dt", Hv),
            "ssm_a": _f32(ssm_a, "ssm_a", Hv), "ssm_norm": _f32(ssm_norm, "ssm_norm", head_v_dim),
            **_routing(D, router, n_used, gating, norm_weights, weights_scale, router_bias, selection_bias, n_groups,
                       n_groups_used, group_top)})
        self.n_embd, self.n_experts, self.n_used, self.channels = D, int(self.c.n_experts), n_used, C
        self._states: tuple[int, int] | None = None

    def bind_states(self, conv_state: Any, ssm_state: Any) -> None:
        """Point at the layer's per-slot states: conv [S, K-1, C] and ssm [S, Hv, dk, dv], contiguous
        float32 on the CPU; cheap when unchanged."""
        key = (conv_state.data_ptr(), ssm_state.data_ptr())
        if key == self._states:
            return
        c, S = self.c, conv_state.shape[0]
        conv = (S, c.conv_kernel - 1, self.channels)
        ssm = (S, c.n_v_heads, c.head_k_dim, c.head_v_dim)
        if (tuple(conv_state.shape) != conv or tuple(ssm_state.shape) != ssm or S < 1):
            raise ValueError(f"decode step: states {tuple(conv_state.shape)} and {tuple(ssm_state.shape)} must be "
                             f"[S, {conv[1]}, {conv[2]}] and [S, {ssm[1]}, {ssm[2]}, {ssm[3]}]")
        c.conv_state = _f32(conv_state, "conv state")
        c.ssm_state = _f32(ssm_state, "ssm state")
        c.n_slots = S
        self._keep_states, self._states = (conv_state, ssm_state), key

    def scratch_bytes(self, n_seq: int) -> int:
        out = ffi.new("int64_t *")
        check(lib.strata_decode_deltanet_scratch_bytes(self.c, n_seq, out), f"DeltaNet decode step scratch for {n_seq} sequences")
        return int(out[0])

    def run(self, pool: Any, slots: Any, positions: Any, x: Any, out: StepOutputs, scratch: Any,
            impl: str = "auto") -> int:
        """x [B, D] float32 += the layer's DeltaNet half for B sequences (one new token each; sequence b
        in state row slots[b], int64 [B], at positions[b], int64 [B]); out.xn[:B] = ffn_norm(x) and,
        for an MoE layer, out's routing and grouping. Returns the number of experts used."""
        if self._states is None:
            raise ValueError("DeltaNet decode step: bind_states first")
        B = x.shape[0]
        if (tuple(x.shape) != (B, self.n_embd) or str(x.dtype) != "torch.float32" or not x.is_contiguous()
                or tuple(slots.shape) != (B,) or tuple(positions.shape) != (B,) or str(slots.dtype) != "torch.int64"
                or str(positions.dtype) != "torch.int64" or not slots.is_contiguous()
                or not positions.is_contiguous() or B > out.capacity or out.layer_experts != self.n_experts):
            raise ValueError(f"DeltaNet decode step: x {tuple(x.shape)} {x.dtype}, slots {tuple(slots.shape)} "
                             f"{slots.dtype} and positions {tuple(positions.shape)} {positions.dtype} (int64 [B]); "
                             f"outputs for {out.capacity} sequences of {out.layer_experts} experts, layer has "
                             f"{self.n_experts}")
        status = lib.strata_decode_deltanet(pool.ptr, self.c, B, ffi.cast("int64_t *", slots.data_ptr()),
                                            ffi.cast("int64_t *", positions.data_ptr()),
                                            ffi.cast("float *", x.data_ptr()), out.xn_ptr, out.ids_ptr, out.w_ptr,
                                            out.groups if self.n_experts else ffi.NULL,
                                            ffi.cast("void *", scratch.data_ptr()), scratch.numel(), impl_code(impl))
        if status:
            check(status, f"DeltaNet decode step of {B} sequences (slots {slots.tolist()} of {self.c.n_slots}, "
                          f"scratch of {scratch.numel()} bytes)")
        return int(out.groups.n_used) if self.n_experts else 0


class StepOutputs:
    """What `DecodeAttn.run` writes for up to `capacity` sequences: xn [B, D] float32, expert_ids
    int64 and weights float32 [B, k], and the grouping (used int32 [E], offsets int64 [E + 1],
    token_ids int32 and weights_sorted float32 [B * k]). Views `[:B]` are taken by the caller."""

    def __init__(self, layer: DecodeAttn | DecodeDeltaNet, capacity: int):
        import torch

        D, E, k = layer.n_embd, layer.n_experts, max(layer.n_used, 1)
        self.capacity, self.layer_experts = capacity, E
        self.xn = torch.empty((capacity, D), dtype=torch.float32)
        self.expert_ids = torch.empty((capacity, k), dtype=torch.int64)
        self.weights = torch.empty((capacity, k), dtype=torch.float32)
        self.used = torch.empty(max(E, 1), dtype=torch.int32)
        self.offsets = torch.empty(max(E, 1) + 1, dtype=torch.int64)
        self.token_ids = torch.empty(capacity * k, dtype=torch.int32)
        self.weights_sorted = torch.empty(capacity * k, dtype=torch.float32)
        self.xn_ptr = ffi.cast("float *", self.xn.data_ptr())
        self.ids_ptr = ffi.cast("int64_t *", self.expert_ids.data_ptr())
        self.w_ptr = ffi.cast("float *", self.weights.data_ptr())
        self.groups = ffi.new("strata_route_groups *", {
            "used": ffi.cast("int32_t *", self.used.data_ptr()),
            "offsets": ffi.cast("int64_t *", self.offsets.data_ptr()),
            "token_ids": ffi.cast("int32_t *", self.token_ids.data_ptr()),
            "weights_sorted": ffi.cast("float *", self.weights_sorted.data_ptr())})
        self._owned = None

    def group_only(self, owned) -> None:
        """Group only the assignments to experts with owned[e] != 0 (uint8 [E], kept alive here; an
        expert-parallel rank's experts), or all again (None)."""
        if owned is not None and (owned.dtype.itemsize != 1 or tuple(owned.shape) != (self.layer_experts,)
                                  or not owned.is_contiguous()):
            raise ValueError(f"group_only: owned {owned.dtype} {tuple(owned.shape)}: expected uint8 [{self.layer_experts}]")
        self._owned = owned
        self.groups.owned = ffi.NULL if owned is None else ffi.cast("uint8_t *", owned.data_ptr())


__all__ = ["DecodeAttn", "DecodeDeltaNet", "StepOutputs"]
