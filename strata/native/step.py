"""A decoder layer's decode step as one native call: its mixing half (attention, gated DeltaNet,
...), the FFN's norm and the router (native/executor: step.c and each kind's own file).

    layer = native.DecodeAttn(n_embd=D, n_head=H, n_head_kv=Hkv, head_dim=hd, rope_dim=R, neox=True,
                              norm_eps=eps, attn_scale=hd ** -0.5, attn_norm=w1, ffn_norm=w2,
                              qkv=(Q8_0, qkv_bytes), o=(Q8_0, o_bytes), router=router_w, n_used=8)
    layer.bind(k_cache, v_cache)                       # [N, Hkv, P, hd] float32 blocks, once (again if moved)
    out = native.StepOutputs(layer, max_seq)           # xn, routing and its grouping, made once
    layer.run(pool, block_table, positions, cos, sin, x, out, scratch)   # x += attention; out filled
    layer.run_batch(pool, batch, (cos, sin), x, out, scratch)          # the same from a Batch, any kind

`LayerStep` is what every kind's binding shares: the struct of the kind (its `head`: width, norms,
router), the kind's step and scratch functions by name, and the call. A kind's binding is a
subclass beside its executor (`DecodeAttn` here for the attention kinds; gated DeltaNet's in
strata.models.executor.deltanet). For each decode step this does what the per-call glue does
between the layer's input and its routed experts, in the same order, so the results are the same
bytes. The descriptor and the outputs are built once; a call casts a few pointers and checks shapes.
Holds no policy about when to use it: the models decide.
"""
from __future__ import annotations

from typing import Any

from strata.quant import ggml_type

from ._lib import check, ffi, impl_code, lib
from .glue import _GATING, kv_cache_type, kv_row_bytes



def f32_ptr(t: Any, what: str, n: int | None = None) -> Any:
    """Pointer of a contiguous CPU float32 tensor (of `n` elements when given), or NULL for None."""
    if t is None:
        return ffi.NULL
    if str(t.dtype) != "torch.float32" or t.device.type != "cpu" or not t.is_contiguous() or (n is not None and t.numel() != n):
        raise ValueError(f"decode step: {what} must be a contiguous CPU float32 tensor"
                         f"{'' if n is None else f' of {n} values'}, found {t.dtype} {tuple(t.shape)} on {t.device}")
    return ffi.cast("float *", t.data_ptr())


def void_ptr(t: Any) -> Any:
    """The address of a CPU tensor's bytes (packed weights) for a struct's `const void *` field."""
    return ffi.cast("void *", t.data_ptr())


def layer_head(D: int, norm_eps: float, attn_norm: Any, ffn_norm: Any, router: Any = None, n_used: int = 0,
               gating: str = "softmax", norm_weights: bool = False, weights_scale: float = 1.0, router_bias: Any = None,
               selection_bias: Any = None, n_groups: int = 0, n_groups_used: int = 0, group_top: int = 0) -> dict:
    """The head every kind's struct begins with (strata_layer_head): width D, the two norms and the
    router [n_experts, D] (None: a dense layer) with how it picks n_used experts."""
    if gating not in _GATING:
        raise ValueError(f"expert gating function {gating!r} is not supported (expected softmax, sigmoid or softmax_weight)")
    n_experts = 0 if router is None else int(router.shape[0])
    return {"n_embd": D, "norm_eps": norm_eps, "attn_norm": f32_ptr(attn_norm, "attn_norm", D),
            "ffn_norm": f32_ptr(ffn_norm, "ffn_norm", D),
            "router": f32_ptr(router, "router", None if router is None else n_experts * D), "n_experts": n_experts,
            "n_used": n_used, "gating": _GATING[gating], "norm_weights": 1 if norm_weights else 0,
            "weights_scale": weights_scale, "router_bias": f32_ptr(router_bias, "router bias", n_experts),
            "selection_bias": f32_ptr(selection_bias, "selection bias", n_experts), "n_groups": n_groups,
            "n_groups_used": n_groups_used, "group_top": group_top}


def _index(t: Any, what: str, B: int, rows: bool = False) -> Any:
    """Pointer of a contiguous int64 CPU tensor [B] (rows: [B, M]), or a ValueError naming it."""
    if (str(t.dtype) != "torch.int64" or t.device.type != "cpu" or not t.is_contiguous() or t.dim() != 1 + rows
            or t.shape[0] != B):
        raise ValueError(f"decode step: {what} must be contiguous CPU int64 {'[B, M]' if rows else '[B]'} for B = {B}, "
                         f"found {t.dtype} {tuple(t.shape)}")
    return ffi.cast("int64_t *", t.data_ptr())


class LayerStep:
    """A layer kind's decode step, described once: `self.c`, the kind's struct (STRUCT, its head
    first), filled from `head` (`layer_head`'s fields) and the kind's own fields; STEP names its
    strata_step_fn (STEP + "_scratch_bytes" its scratch function). A subclass fills the fields and
    binds what the layer keeps between steps (`bind`); a kind whose struct begins with another's
    (NEST) fills that one through `c` and its own fields through `whole`; `state_slots`: the step reads each
    sequence's state row (a recurrent layer), not its cache blocks. The tensors given are kept
    alive by this object."""

    STRUCT = ""
    STEP = ""
    state_slots = False
    rope_dim = 0
    reads_alt = False  # in a decode program, the step reads the second rope tables (strata_step_args.cos_alt)
    what = "decode step"
    BIND = "bind"  # the subclass's name for `bind`, for errors
    NEST = ""  # the member of STRUCT that is another kind's struct, its first (`whole`: the kind's own)

    def __init__(self, head: dict, fields: dict, keep: tuple):
        self._keep = keep
        if self.NEST:  # the kind's struct begins with another kind's, member NEST: self.c points at that one
            self.whole = ffi.new(f"{self.STRUCT} *", {self.NEST: {"head": head, **fields}})
            self.c = ffi.addressof(self.whole[0], self.NEST)
        else:
            self.c = self.whole = ffi.new(f"{self.STRUCT} *", {"head": head, **fields})
        self.head = ffi.addressof(self.c[0], "head")
        self.step = ffi.addressof(lib, self.STEP)  # for the decode program (strata_decode_layer.step)
        self._call, self._scratch = getattr(lib, self.STEP), getattr(lib, self.STEP + "_scratch_bytes")
        self.n_embd, self.n_experts, self.n_used = int(head["n_embd"]), int(head["n_experts"]), int(head["n_used"])
        self._bound: tuple | None = None
        self._args = ffi.new("strata_step_args *")

    def bind(self, *tensors: Any) -> None:
        """Point at what the layer keeps between steps (its KV cache blocks, its states)."""
        raise NotImplementedError

    def scratch_bytes(self, n_seq: int) -> int:
        out = ffi.new("int64_t *")
        check(self._scratch(self.head, n_seq, out), f"{self.what} scratch for {n_seq} sequences")
        return int(out[0])

    def run_batch(self, pool: Any, batch: Any, cos_sin: tuple[Any, Any], x: Any, out: StepOutputs, scratch: Any,
                  impl: str = "auto") -> int:
        """`run` on a decode batch (strata.models.batch.Batch): its positions, block table and (when
        the batch has cache slots) state rows, and the rope tables `cos_sin`."""
        return self.call(pool, x, out, scratch, batch.positions, block_table=batch.block_table,
                         slots=batch.slot_ids, cos=cos_sin[0], sin=cos_sin[1],
                         impl=impl)

    def call(self, pool: Any, x: Any, out: StepOutputs, scratch: Any, positions: Any, *, block_table: Any = None,
             slots: Any = None, cos: Any = None, sin: Any = None, impl: str = "auto") -> int:
        """x [B, D] float32 += the layer's half for B sequences (one new token each, sequence b at
        positions[b], int64 [B]; its cache blocks in block_table[b], int64 [B, M], or its state row
        slots[b], int64 [B]; rope cos/sin [B, R/2]); out.xn[:B] = ffn_norm(x) and, for an MoE
        layer, out's routing and grouping. Returns the number of experts used."""
        if self._bound is None:
            raise ValueError(f"{self.what}: {self.BIND} first")
        B = x.shape[0]
        if (tuple(x.shape) != (B, self.n_embd) or str(x.dtype) != "torch.float32" or not x.is_contiguous()
                or B > out.capacity or out.layer_experts != self.n_experts):
            raise ValueError(f"{self.what}: x {tuple(x.shape)} {x.dtype} (float32 [B, {self.n_embd}]); outputs for "
                             f"{out.capacity} sequences of {out.layer_experts} experts, layer has {self.n_experts}")
        a = self._args  # one struct per layer, refilled: a decode step calls this once per layer
        a.n_seq, a.positions, a.x = B, _index(positions, "positions", B), ffi.cast("float *", x.data_ptr())
        a.xn, a.expert_ids, a.weights = out.xn_ptr, out.ids_ptr, out.w_ptr
        a.groups = out.groups if self.n_experts else ffi.NULL
        a.scratch, a.scratch_bytes = ffi.cast("void *", scratch.data_ptr()), scratch.numel()
        if self.state_slots:
            if slots is None:
                raise ValueError(f"{self.what}: the layer reads each sequence's state row: slots needed")
            a.slots = _index(slots, "slots", B)
        else:
            if block_table is None:
                raise ValueError(f"{self.what}: block_table needed")
            a.block_table, a.table_stride = _index(block_table, "block_table", B, rows=True), block_table.shape[1]
        if self.rope_dim:  # the layer's own tables, whichever of the program's pair it reads there (rope_alt)
            half = B * (self.rope_dim // 2)
            a.cos_t, a.sin_t = f32_ptr(cos, "rope cos", half), f32_ptr(sin, "rope sin", half)
            a.cos_alt, a.sin_alt = a.cos_t, a.sin_t
        status = self._call(pool.ptr, self.head, a, impl_code(impl))
        if status:
            check(status, f"{self.what} of {B} sequences ({self.trouble(B, slots)})")
        return int(out.groups.n_used) if self.n_experts else 0

    def trouble(self, B: int, slots: Any) -> str:
        """What a failed call most likely got wrong, for its error."""
        return "block table, positions or cache too small?"


class DecodeAttn(LayerStep):
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
    scales a global layer's queries. Laguna: `out_gate` (type, packed bytes, rows) is a projection
    [rows, D] of the normed input whose softplus multiplies the attention's output before o, per
    head (rows = H) or per element (rows = H hd). MiMo-V2: `head_dim_v` value heads narrower than
    head_dim (qkv's value rows Hkv head_dim_v, o [D, H head_dim_v], cached padded to head_dim),
    `v_scale` on the attention's output. `use_alt_rope()` marks a layer that reads the program's
    second rope tables. The tensors are kept alive by this object."""

    STRUCT, STEP, BIND = "strata_attn_layer", "strata_decode_attn", "bind_cache"

    def __init__(self, *, n_embd: int, n_head: int, n_head_kv: int, head_dim: int, rope_dim: int, neox: bool,
                 norm_eps: float, attn_scale: float, attn_norm: Any, ffn_norm: Any, qkv: tuple[Any, Any],
                 o: tuple[Any, Any], bqkv: Any = None, q_norm: Any = None, k_norm: Any = None,
                 qk_norm_per_head: bool = True, router: Any = None, n_used: int = 0, gating: str = "softmax",
                 norm_weights: bool = False, weights_scale: float = 1.0, sinks: Any = None, window: int = 0,
                 bo: Any = None, router_bias: Any = None, selection_bias: Any = None, n_groups: int = 0,
                 n_groups_used: int = 0, group_top: int = 0, mla: dict | None = None, q_gate: bool = False,
                 chunk: int = 0, qk_l2_eps: float | None = None, temperature: tuple[int, float] | None = None,
                 v: tuple[Any, Any] | None = None, out_gate: tuple[Any, Any, int] | None = None,
                 head_dim_v: int = 0, v_scale: float = 1.0):
        D, hq, hkv = n_embd, n_head * head_dim, n_head_kv * head_dim
        if out_gate is not None and (mla is not None or q_gate or out_gate[2] not in (n_head, hq)):
            raise ValueError(f"decode step: an output gate of its own goes with grouped-query attention without a "
                             f"query gate, of {n_head} or {hq} rows, found {out_gate[2]}")
        if head_dim_v and (mla is not None or q_gate or out_gate is not None or not 0 < head_dim_v <= head_dim):
            raise ValueError(f"decode step: a value width of its own ({head_dim_v}) goes with grouped-query attention "
                             f"without output gate, at most head_dim={head_dim}")
        if q_gate and (mla is not None or bqkv is not None):
            raise ValueError("decode step: a query output gate goes with grouped-query attention without qkv bias")
        if v is not None and mla is not None:
            raise ValueError("decode step: a v of its own type goes with grouped-query attention")
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
        head = layer_head(D, norm_eps, attn_norm, ffn_norm, router, n_used, gating, norm_weights, weights_scale,
                          router_bias, selection_bias, n_groups, n_groups_used, group_top)
        super().__init__(head, {
            "n_head": n_head, "n_head_kv": n_head_kv, "head_dim": head_dim, "rope_dim": rope_dim,
            "neox": 1 if neox else 0, "qk_norm_per_head": 1 if qk_norm_per_head else 0,
            "attn_scale": attn_scale, "qkv_type": int(ggml_type(qkv[0])),
            "o_type": int(ggml_type(o[0])), "wqkv": ffi.cast("void *", qkv[1].data_ptr()),
            "wo": ffi.cast("void *", o[1].data_ptr()), "wqkv_bytes": qkv[1].numel(), "wo_bytes": o[1].numel(),
            "bqkv": f32_ptr(bqkv, "qkv bias", hq + hkv + n_head_kv * (head_dim_v or head_dim)), "q_norm": f32_ptr(q_norm, "q_norm", qn),
            "k_norm": f32_ptr(k_norm, "k_norm", kn), "sinks": f32_ptr(sinks, "sinks", n_head), "window": int(window),
            "bo": f32_ptr(bo, "output bias", D), "q_gate": 1 if q_gate else 0, "chunk": int(chunk),
            "qk_l2": 0 if qk_l2_eps is None else 1, "qk_l2_eps": 0.0 if qk_l2_eps is None else qk_l2_eps,
            "temp_floor": int(floor), "temp_scale": float(t_scale), "head_dim_v": int(head_dim_v),
            "v_scale": 0.0 if v_scale == 1.0 else float(v_scale),
            **({} if v is None else {"v_type": int(ggml_type(v[0])), "wv": ffi.cast("void *", v[1].data_ptr()),
                                     "wv_bytes": v[1].numel()}),
            **({} if out_gate is None else {"g_type": int(ggml_type(out_gate[0])), "g_rows": int(out_gate[2]),
                                            "wg": ffi.cast("void *", out_gate[1].data_ptr()),
                                            "wg_bytes": out_gate[1].numel()})},
            (attn_norm, ffn_norm, qkv[1], o[1], bqkv, q_norm, k_norm, router, sinks, bo, router_bias, selection_bias,
             mla, v, out_gate))
        if mla is not None:  # latent attention: see strata.h strata_attn_layer
            c, L, Q = self.c, mla["kv_lora"], mla["q_lora"]
            c.kv_lora, c.q_lora, c.nope, c.v_dim = L, Q, mla["nope"], mla["v_dim"]
            c.wkv_a_type, c.wkv_a = int(ggml_type(mla["wkv_a"][0])), ffi.cast("void *", mla["wkv_a"][1].data_ptr())
            c.wkv_a_bytes = mla["wkv_a"][1].numel()
            if Q:
                c.wq_a_type, c.wq_a = int(ggml_type(mla["wq_a"][0])), ffi.cast("void *", mla["wq_a"][1].data_ptr())
                c.wq_a_bytes = mla["wq_a"][1].numel()
                c.q_a_norm = f32_ptr(mla["q_a_norm"], "q_a_norm", Q)
            c.kv_a_norm = f32_ptr(mla["kv_a_norm"], "kv_a_norm", L)
            for name in ("k_b", "v_b"):  # packed [H kv_lora, nope] and [H v_dim, kv_lora]
                t, data = mla[name]
                setattr(c, f"{name}_type", int(ggml_type(t)))
                setattr(c, name, ffi.cast("void *", data.data_ptr()))
                setattr(c, f"{name}_bytes", data.numel())
        self.rope_dim = rope_dim

    def bind_cache(self, k_cache: Any, v_cache: Any) -> None:
        """Point at the layer's paged KV cache [N, Hkv, P, row] (N blocks of P positions, contiguous;
        rows of hd values in float32, float16 or bfloat16, or uint8 rows of Q8_0 blocks); cheap
        when unchanged."""
        key = (k_cache.data_ptr(), v_cache.data_ptr())
        if key == self._bound:
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
        self._keep_cache, self._bound = (k_cache, v_cache), key

    bind = bind_cache

    def use_alt_rope(self, alt: bool = True) -> None:
        """In a decode program, read the second pair of rope tables (a sliding-window layer with a
        RoPE base of its own); a step run on its own is given its own tables either way."""
        self.c.rope_alt = 1 if alt else 0
        self.reads_alt = alt

    def run(self, pool: Any, block_table: Any, positions: Any, cos: Any, sin: Any, x: Any, out: StepOutputs,
            scratch: Any, impl: str = "auto") -> int:
        """`call` with sequence b's cache blocks in block_table[b] (int64 [B, M] contiguous)."""
        return self.call(pool, x, out, scratch, positions, block_table=block_table, cos=cos, sin=sin, impl=impl)


class StepOutputs:
    """What `DecodeAttn.run` writes for up to `capacity` sequences: xn [B, D] float32, expert_ids
    int64 and weights float32 [B, k], and the grouping (used int32 [E], offsets int64 [E + 1],
    token_ids int32 and weights_sorted float32 [B * k]). Views `[:B]` are taken by the caller."""

    def __init__(self, layer: LayerStep, capacity: int):
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


__all__ = ["DecodeAttn", "LayerStep", "StepOutputs", "f32_ptr", "layer_head", "void_ptr"]
