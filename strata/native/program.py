"""A decode step through every MoE layer in one native call (native/program.c).

    program = native.DecodeLayers([(layer, parts, slot_of), ...], outputs)  # slot_of int32 [E]
    stopped = program.run(pool, block_table, positions, cos, sin, x, routed, expert_ids, layer_used, scratch)

Each layer is its kind's `LayerStep` (attention, gated DeltaNet, ...: its cache or states
bound; `run` is given the sequences' state slots when a layer reads them), the layer's `MoeParts`, its page table row
`slot_of` (int32 [E], kept alive and read at every call: a placement that changes between calls
is seen, one that changes during a call must not happen), optionally its shared expert
(`MoeParts` holding it at position 0, and its gate [D] or None; `shared_weights` is the weight;
or None) and its experts' function (a `MoeAct`, gpt-oss; None: SwiGLU). The outputs of `StepOutputs` serve as
the working buffers of every layer. Holds no policy about when the program may run: the models
decide (every expert in place and staying there).
"""
from __future__ import annotations

from typing import Any

from ._lib import check, ffi, impl_code, lib
from .step import LayerStep, StepOutputs, f32_ptr


def _tensor(t: Any, dtype: str, shape: tuple[int, ...], what: str) -> None:
    if str(t.dtype) != f"torch.{dtype}" or t.device.type != "cpu" or not t.is_contiguous() or tuple(t.shape) != shape:
        raise ValueError(f"decode program: {what} must be a contiguous CPU {dtype} tensor of shape {shape}, found "
                         f"{t.dtype} {tuple(t.shape)} on {t.device}")


def _table(cos: Any, sin: Any, B: int, rope_dim: int, what: str) -> tuple[Any, Any]:
    """Pointers of a rope table's cos and sin (contiguous float32 [B, rope_dim / 2]); NULL when no
    layer reads it (rope_dim 0)."""
    if not rope_dim:
        return ffi.NULL, ffi.NULL
    half = B * (rope_dim // 2)
    for t, part in ((cos, "cos"), (sin, "sin")):
        if t is None or str(t.dtype) != "torch.float32" or not t.is_contiguous() or t.numel() != half:
            raise ValueError(f"decode program: {what} {part} must be contiguous float32 of {half} values")
    return ffi.cast("float *", cos.data_ptr()), ffi.cast("float *", sin.data_ptr())


class DecodeLayers:
    """The layers of a model as one decode program (dense layers too: their FFN as a shared expert
    without gate, no router); `out` (a StepOutputs of any MoE layer: they must agree in width,
    experts and experts per token) holds the working buffers."""

    def __init__(self, layers: list[tuple], out: StepOutputs):
        if not layers:
            raise ValueError("decode program: no layers")
        moe = [entry[0] for entry in layers if entry[0].n_experts]  # dense layers have no router
        if not moe:
            raise ValueError("decode program: no MoE layer")
        first = moe[0]
        self.n_layers, self.n_embd, self.n_experts, self.n_used = len(layers), first.n_embd, first.n_experts, first.n_used
        self.c = ffi.new("strata_decode_layer[]", len(layers))
        shared_any = False
        for i, (attn, parts, slot_of, *rest) in enumerate(layers):
            attn: LayerStep
            dense = not attn.n_experts
            if attn.n_embd != self.n_embd or (not dense and (attn.n_experts, attn.n_used) != (self.n_experts, self.n_used)):
                raise ValueError(f"decode program: layer {i} has width {attn.n_embd}, {attn.n_experts} experts, "
                                 f"{attn.n_used} per token; the first MoE layer {self.n_embd}, {self.n_experts}, "
                                 f"{self.n_used}")
            self.c[i].step, self.c[i].layer = attn.step, attn.head
            shared = rest[0] if rest else None  # (MoeParts of the shared expert, gate_inp [D] or None)
            if dense:  # its FFN is the shared expert: every token, weight 1
                if shared is None or shared[1] is not None:
                    raise ValueError(f"decode program: dense layer {i} needs its FFN as a shared expert without gate")
            else:
                parts.check()
                if parts.n_embd != self.n_embd:
                    raise ValueError(f"decode program: layer {i}'s experts are {parts.n_embd} wide, the layer "
                                     f"{self.n_embd}")
                _tensor(slot_of, "int32", (self.n_experts,), f"layer {i}'s page table row")
                g, u, d = parts
                self.c[i].gate, self.c[i].up, self.c[i].down = g.c[0], u.c[0], d.c[0]
                self.c[i].slot_of = ffi.cast("const int32_t *", slot_of.data_ptr())
                self.c[i].n_ff = parts.n_ff
            act = rest[1] if len(rest) > 1 else None  # the experts' function (MoeAct) or None: SwiGLU
            if act is not None and not dense:
                act.check(parts)
                if act.n_ids < self.n_experts:
                    raise ValueError(f"decode program: layer {i}'s expert biases cover {act.n_ids} of "
                                     f"{self.n_experts} experts")
                self.c[i].act = act.c
            if shared is not None:
                s_parts, gate_inp = shared
                s_parts.check()
                if s_parts.n_embd != self.n_embd:
                    raise ValueError(f"decode program: layer {i}'s shared expert is {s_parts.n_embd} wide")
                sg, su, sd = s_parts
                self.c[i].s_gate, self.c[i].s_up, self.c[i].s_down = sg.c[0], su.c[0], sd.c[0]
                self.c[i].s_ff = s_parts.n_ff
                if gate_inp is not None:
                    _tensor(gate_inp, "float32", (self.n_embd,), f"layer {i}'s shared expert gate")
                    self.c[i].s_gate_inp = ffi.cast("const float *", gate_inp.data_ptr())
                shared_any = True
        self._keep = layers
        self.recurrent = any(entry[0].state_slots for entry in layers)  # a layer reads state rows
        # each table is sized by the layers that read it (Laguna's sliding layers rotate fewer features)
        self.rope_dim = max((entry[0].rope_dim for entry in layers if not entry[0].reads_alt), default=0)
        self.alt_rope_dim = max((entry[0].rope_dim for entry in layers if entry[0].reads_alt), default=0)
        self.alt_rope = any(entry[0].reads_alt for entry in layers)  # a layer reads `alt`
        if out.layer_experts != self.n_experts:
            raise ValueError(f"decode program: outputs for {out.layer_experts} experts, layers have {self.n_experts}")
        self.out = out
        self._index = ffi.new("int32_t[]", self.n_experts)
        self._stopped = ffi.new("int64_t *")
        self._args = ffi.new("strata_step_args *")
        import torch

        n = out.capacity if shared_any else 0
        self._s_tokens, self._s_weights = torch.empty(n, dtype=torch.int32), torch.empty(n, dtype=torch.float32)
        self._s_ptrs = ((ffi.cast("int32_t *", self._s_tokens.data_ptr()), ffi.cast("float *", self._s_weights.data_ptr()))
                        if shared_any else (ffi.NULL, ffi.NULL))

    def run(self, pool: Any, block_table: Any, positions: Any, cos: Any, sin: Any, x: Any, routed: Any, expert_ids: Any,
            layer_used: Any, scratch: Any, first: int = 0, layer_ns: Any = None, slots: Any = None,
            impl: str = "auto", alt: tuple[Any, Any] | None = None) -> int:
        """x [B, D] float32 through layers first.., in place (sequence b's cache blocks in
        block_table[b], int64 [B, M], as `LayerStep.call` takes them); returns where it stopped: L when every
        layer ran, else the layer whose routing needs an expert not in place (slot_of -1), with its
        attention half done and its routing in the outputs (`out`, expert_ids[l]): the caller adds
        that layer's experts into x and resumes at the next layer.

        expert_ids int64 [L, capacity, k] receives each layer's routing (rows [:B]); layer_used int64
        [L] each run layer's count of distinct experts; routed float32 [>= B, D] is working space;
        layer_ns int64 [L, 2] (or None) accumulates nanoseconds in attention and experts per layer;
        slots int64 [B]: each sequence's row of recurrent state (needed when a layer reads one); alt:
        the second (cos, sin) rope tables, for layers whose steps are marked to read them (rope_alt),
        of the rope_dim of those layers."""
        B, out = x.shape[0], self.out
        if B > out.capacity:
            raise ValueError(f"decode program: {B} sequences, outputs for {out.capacity}")
        _tensor(x, "float32", (B, self.n_embd), "x")
        if block_table.dim() != 2:
            raise ValueError(f"decode program: block_table must be int64 [B, M], found {tuple(block_table.shape)}")
        _tensor(block_table, "int64", (B, block_table.shape[1]), "block_table")
        _tensor(positions, "int64", (B,), "positions")
        _tensor(expert_ids, "int64", (self.n_layers, out.capacity, self.n_used), "expert_ids")
        if routed.shape[0] < B:
            raise ValueError(f"decode program: routed holds {routed.shape[0]} rows, {B} needed")
        _tensor(routed, "float32", (routed.shape[0], self.n_embd), "routed")
        _tensor(layer_used, "int64", (self.n_layers,), "layer_used")
        if not 0 <= first <= self.n_layers:
            raise ValueError(f"decode program: first layer {first} outside 0..{self.n_layers}")
        if layer_ns is not None:
            _tensor(layer_ns, "int64", (self.n_layers, 2), "layer_ns")
        if slots is not None:
            _tensor(slots, "int64", (B,), "slots")
        elif self.recurrent:
            raise ValueError("decode program: a layer reads each sequence's state row (a recurrent layer): state slots needed")
        if self.alt_rope and alt is None:
            raise ValueError("decode program: a layer reads the second rope tables (alt) and none were given")
        cp, sp = _table(cos, sin, B, self.rope_dim, "rope")
        ca, sa = _table(*(alt or (None, None)), B, self.alt_rope_dim, "alt rope")
        args = self._args  # one struct, refilled each step
        args.n_seq, args.positions = B, ffi.cast("int64_t *", positions.data_ptr())
        args.block_table, args.table_stride = ffi.cast("int64_t *", block_table.data_ptr()), block_table.shape[1]
        args.slots = ffi.NULL if slots is None else ffi.cast("int64_t *", slots.data_ptr())
        args.cos_t, args.sin_t, args.cos_alt, args.sin_alt = cp, sp, ca, sa
        args.x, args.xn, args.expert_ids = f32_ptr(x, "x"), out.xn_ptr, ffi.cast("int64_t *", expert_ids.data_ptr())
        args.weights, args.groups = out.w_ptr, out.groups
        args.scratch, args.scratch_bytes = ffi.cast("void *", scratch.data_ptr()), scratch.numel()
        status = lib.strata_decode_layers(
            pool.ptr, self.c, self.n_layers, args, out.capacity * self.n_used, self._index, self.n_experts,
            ffi.cast("float *", routed.data_ptr()), first, self._stopped, ffi.cast("int64_t *", layer_used.data_ptr()),
            ffi.NULL if layer_ns is None else ffi.cast("int64_t *", layer_ns.data_ptr()), *self._s_ptrs,
            impl_code(impl))
        if status:
            check(status, f"decode program of {self.n_layers} layers from layer {first}, {B} sequences (block "
                          "table, positions, a page table entry or a cache out of range?)")
        return int(self._stopped[0])


def shared_weights(x: Any, gate_inp: Any, out: Any, impl: str = "auto") -> Any:
    """out[t] = sigmoid(x[t] . gate_inp) for x float32 [T, D] (out float32 [T]), or 1 when gate_inp is
    None: a shared expert's weight per token, as the decode program computes it. Returns out."""
    T, D = x.shape
    _tensor(x, "float32", (T, D), "shared expert input")
    _tensor(out, "float32", (T,), "shared expert weights")
    if gate_inp is not None:
        _tensor(gate_inp, "float32", (D,), "shared expert gate")
    check(lib.strata_shared_weights(ffi.cast("const float *", x.data_ptr()), T, D,
                                    ffi.NULL if gate_inp is None else ffi.cast("const float *", gate_inp.data_ptr()),
                                    ffi.cast("float *", out.data_ptr()), impl_code(impl)),
          f"shared expert weights of {T} tokens")
    return out


__all__ = ["DecodeLayers", "shared_weights"]
