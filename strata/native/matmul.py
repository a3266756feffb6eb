"""Matrix products from packed GGML weights on a persistent compute pool (native/pool.c, matmul.c).

    with native.ComputePool(2) as pool:
        native.matmul_into(pool, "Q4_0", w, n_rows, row_len, x, y, scratch)   # y[T, N] = x @ W^T
        native.moe_swiglu(pool, x, out, parts, expert_index, offsets, token_ids, weights, scratch)

Callers allocate scratch once (`matmul_scratch_bytes`, `moe_scratch_bytes` at the largest batch)
and reuse it (one scratch per thread that calls concurrently): these wrappers allocate no arrays,
so a decode step stays allocation-free. Per-call work in Python is a few pointer casts and shape
checks; the C call releases the GIL. No policy here about which matrices to compute where.
"""
from __future__ import annotations

import math
import weakref
from typing import Any, NamedTuple

import numpy as np

from strata.quant import block_size, ggml_type, row_bytes

from ._lib import check, check_threads, default_threads, dst_view, ffi, impl_code, lib, src_view, typed_view


class ComputePool:
    """A persistent pool of `n_threads` compute threads (the calling thread included).

    Workers spin briefly after a job and then sleep, so an idle pool costs no CPU. One job runs at
    a time: calls from several Python threads on one pool serialize. Close it (or use `with`)
    to join the workers; a pool dropped unclosed is freed by its finalizer."""

    def __init__(self, n_threads: int | None = None):
        n = check_threads(default_threads() if n_threads is None else n_threads)
        out = ffi.new("strata_pool **")
        check(lib.strata_pool_create(n, out), f"create a compute pool of {n} threads")
        self._ptr = out[0]
        self._finalizer = weakref.finalize(self, lib.strata_pool_free, self._ptr)
        self.n_threads = n

    @property
    def ptr(self) -> Any:
        """The `strata_pool *` for native calls; raises once the pool is closed."""
        if self._ptr is None:
            raise ValueError("compute pool is closed")
        return self._ptr

    def close(self) -> None:
        """Join the workers; further use raises ValueError. Idempotent."""
        self._ptr = None
        self._finalizer()

    def __enter__(self) -> ComputePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ComputePool(n_threads={self.n_threads}{', closed' if self._ptr is None else ''})"


def _pool_ptr(pool: ComputePool | None) -> Any:
    return ffi.NULL if pool is None else pool.ptr


def matmul_scratch_bytes(t: Any, n_tokens: int, row_len: int) -> int:
    """Scratch bytes `matmul_into` needs for `n_tokens` rows of `row_len` (0 for float weights)."""
    t = ggml_type(t)
    out = ffi.new("int64_t *")
    check(lib.strata_matmul_scratch_bytes(int(t), n_tokens, row_len, out),
          f"matmul scratch for {t.name}, {n_tokens} tokens x {row_len}")
    return int(out[0])


def matmul_into(pool: ComputePool | None, t: Any, w: Any, n_rows: int, row_len: int, x: Any, out: Any,
                scratch: Any, impl: str = "auto") -> Any:
    """out[T, N] = x[T, K] @ W[N, K]^T with W (`n_rows` x `row_len`) packed in ggml type `t` in
    `w`; x and out float32 (numpy or CPU torch, contiguous). Activations are rounded to the
    format's 8-bit blocks in `scratch` (`matmul_scratch_bytes`). The result is bit-identical for
    every pool size, pool None included. Returns `out`."""
    t = ggml_type(t)
    x_ptr, x_bytes, x_shape = typed_view(x, "float *", "matmul x")
    y_ptr, y_bytes, y_shape = typed_view(out, "float *", "matmul output", writable=True)
    n_tokens = math.prod(x_shape[:-1])
    if not x_shape or x_shape[-1] != row_len:
        raise ValueError(f"{t.name} matmul: x has shape {x_shape}, expected rows of {row_len}")
    if y_shape[-1:] != (n_rows,) or math.prod(y_shape) != n_tokens * n_rows:
        raise ValueError(f"{t.name} matmul: output has shape {y_shape}, expected ({n_tokens}, {n_rows})")
    w_ptr, w_bytes = src_view(w)
    s_ptr, s_bytes = (ffi.NULL, 0) if scratch is None else dst_view(scratch, "matmul scratch")
    status = lib.strata_matmul(_pool_ptr(pool), int(t), w_ptr, w_bytes, n_rows, row_len, x_ptr, x_bytes, n_tokens,
                               y_ptr, y_bytes, s_ptr, s_bytes, impl_code(impl))
    if status:
        check(status, f"{t.name} matmul of [{n_tokens}, {row_len}] by [{n_rows}, {row_len}] "
                  f"(weights {w_bytes} B, scratch {s_bytes} B)")
    return out


def matmul_heads_scratch_bytes(t: Any, n_heads: int, n_tokens: int, row_len: int) -> int:
    """Scratch bytes `matmul_heads` needs for n_heads x n_tokens rows of row_len values."""
    out = ffi.new("int64_t *")
    check(lib.strata_matmul_heads_scratch_bytes(int(ggml_type(t)), n_heads, n_tokens, row_len, out),
          f"per-head product scratch for {n_heads} heads, {n_tokens} tokens")
    return int(out[0])


def _strided(a: Any, what: str) -> tuple[Any, int, int, int]:
    """(pointer, bytes to the end of its storage, token stride, head stride) of a float32 CPU torch
    tensor [T, H, n] whose last dimension is contiguous."""
    if str(a.dtype) != "torch.float32" or a.device.type != "cpu" or a.dim() != 3 or a.stride(2) != 1:
        raise ValueError(f"{what} must be a float32 CPU tensor [T, H, n] with contiguous rows, found {a.dtype} "
                         f"{tuple(a.shape)} strides {a.stride()} on {a.device}")
    storage = a.untyped_storage()
    end = storage.data_ptr() + storage.nbytes() - a.data_ptr()
    return ffi.cast("float *", a.data_ptr()), end, a.stride(0), a.stride(1)


def matmul_heads(pool: ComputePool | None, t: Any, w: Any, n_heads: int, n_rows: int, row_len: int, x: Any, y: Any,
                 scratch: Any, impl: str = "auto") -> Any:
    """y[t, h, :n_rows] = W_h @ x[t, h, :row_len] for every head h, where W_h is rows
    [h n_rows, (h + 1) n_rows) of the packed matrix `w` (ggml type `t`): the per-head products of
    latent attention in one pool job. x and y: float32 CPU tensors [T, H, >= row_len / n_rows]
    with contiguous rows (token and head strides free). Returns y."""
    w_ptr, w_bytes = src_view(w)
    xp, x_bytes, x_tok, x_head = _strided(x, "per-head product x")
    yp, y_bytes, y_tok, y_head = _strided(y, "per-head product y")
    if x.shape[:2] != y.shape[:2] or x.shape[1] != n_heads or x.shape[2] < row_len or y.shape[2] < n_rows:
        raise ValueError(f"per-head product: x {tuple(x.shape)} and y {tuple(y.shape)} for {n_heads} heads of "
                         f"{n_rows} x {row_len}")
    s_ptr, s_bytes = dst_view(scratch, "per-head product scratch")
    status = lib.strata_matmul_heads(_pool_ptr(pool), int(ggml_type(t)), ffi.cast("const void *", w_ptr), w_bytes,
                                     n_heads, n_rows, row_len, xp, x_bytes, x_tok, x_head, x.shape[0], yp, y_bytes,
                                     y_tok, y_head, s_ptr, s_bytes, impl_code(impl))
    if status:
        check(status, f"per-head product of {n_heads} heads of {n_rows} x {row_len} {ggml_type(t).name}, "
                      f"{x.shape[0]} tokens (weights {w_bytes} B, scratch {s_bytes} B)")
    return y


class MoePart:
    """One family of expert matrices (all gate, all up or all down) of `n_rows` x `row_len` in ggml
    type `t`: expert e's matrix starts at byte e * stride of `base` (a slot pool, or the 3-D expert
    tensor of a mapped file; stride defaults to one matrix's packed size). Holds `base` alive and
    builds the C descriptor once."""

    def __init__(self, base: Any, t: Any, n_rows: int, row_len: int, stride: int | None = None):
        self.type = ggml_type(t)
        elems, _ = block_size(self.type)
        if row_len % elems:
            raise ValueError(f"{self.type.name} expert matrix rows of {row_len} are not whole blocks of {elems}")
        self.n_rows, self.row_len = int(n_rows), int(row_len)
        self.matrix_bytes = n_rows * row_bytes(self.type, row_len)
        self.stride = self.matrix_bytes if stride is None else int(stride)
        if self.stride < 0:
            raise ValueError(f"expert stride must be >= 0, found {self.stride}")
        self._base = base
        ptr, nbytes = src_view(base)
        self.n_experts = (nbytes - self.matrix_bytes) // self.stride + 1 if self.stride and nbytes >= self.matrix_bytes \
            else int(nbytes >= self.matrix_bytes)
        self.c = ffi.new("strata_moe_part *", {"base": ffi.cast("const uint8_t *", ptr), "bytes": nbytes,
                                               "stride": self.stride, "type": int(self.type)})

    def matrix(self, e: int) -> Any:
        """The packed bytes of expert e's matrix (a view of `base`, no copy)."""
        if not 0 <= e < self.n_experts:
            raise IndexError(f"expert {e} is outside this part's {self.n_experts} experts")
        return self._base[e * self.stride:e * self.stride + self.matrix_bytes]

    def __repr__(self) -> str:
        return (f"MoePart({self.type.name}, [{self.n_rows}, {self.row_len}], stride={self.stride}, "
                f"experts={self.n_experts})")


class MoeParts(NamedTuple):
    """The three expert matrix families of a SwiGLU MoE layer: gate, up [F, D] and down [D, F]."""
    gate: MoePart
    up: MoePart
    down: MoePart

    @property
    def n_embd(self) -> int:
        """D: the length of a gate or up row."""
        return self.gate.row_len

    @property
    def n_ff(self) -> int:
        """F: the rows of gate and up, the length of a down row."""
        return self.gate.n_rows

    def check(self) -> None:
        g, u, d = self
        if (u.n_rows, u.row_len) != (g.n_rows, g.row_len) or (d.n_rows, d.row_len) != (g.row_len, g.n_rows):
            raise ValueError(f"MoE parts disagree: gate {g.n_rows}x{g.row_len}, up {u.n_rows}x{u.row_len}, "
                             f"down {d.n_rows}x{d.row_len} (expected down = gate transposed)")


class MoeAct:
    """An expert function other than plain SwiGLU for the fused MoE calls (strata.h
    `strata_moe_act`): gpt-oss's clamped SwiGLU with per-expert biases (`clamped`),

        g = min(gate_e x + b_gate[e], limit), u = clamp(up_e x + b_up[e], -limit, limit)
        y = down_e ((u + 1) * g * sigmoid(alpha * g)) + b_down[e]

    b_gate, b_up float32 [E, F] and b_down [E, D] (None: no bias), held alive here; or Llama 4's
    input-scaled SwiGLU (`MoeAct.input_scaled()`): each assignment's input is x * its router weight
    and its output is added with weight 1. A call also needs each of its experts' ids e (rows of
    the tables): `MoeCall(..., act=, ids=)`, or `moe_swiglu(..., act=, ids=)`."""

    def __init__(self, b_gate: Any, b_up: Any, b_down: Any, alpha: float, limit: float, clamped: bool = True,
                 input_scaled: bool = False):
        if clamped and (not limit > 0 or not math.isfinite(alpha)):
            raise ValueError(f"clamped SwiGLU needs limit > 0 and a finite alpha, found limit {limit}, alpha {alpha}")
        tables = [None if b is None else np.ascontiguousarray(np.asarray(b, dtype=np.float32)) for b in
                  (b_gate, b_up, b_down)]
        shapes = [t.shape for t in tables if t is not None]
        if any(len(sh) != 2 for sh in shapes) or len({sh[0] for sh in shapes}) > 1 or \
                (tables[0] is not None and tables[1] is not None and tables[0].shape != tables[1].shape):
            raise ValueError(f"expert bias tables must be [E, F], [E, F] and [E, D], found {shapes}")
        self.tables, self.alpha, self.limit = tables, float(alpha), float(limit)
        self.clamped, self.input_scaled = bool(clamped), bool(input_scaled)
        self.n_ids = shapes[0][0] if shapes else 2**31 - 1
        self.n_ff = None if tables[0] is None else tables[0].shape[1]
        self.n_embd = None if tables[2] is None else tables[2].shape[1]
        ptrs = [ffi.NULL if t is None else ffi.cast("const float *", t.ctypes.data) for t in tables]
        self.c = ffi.new("strata_moe_act *", {"b_gate": ptrs[0], "b_up": ptrs[1], "b_down": ptrs[2],
                                              "n_ids": self.n_ids, "alpha": self.alpha, "limit": self.limit,
                                              "clamped": int(self.clamped), "input_scaled": int(self.input_scaled)})

    @classmethod
    def scaled_input(cls) -> MoeAct:
        """Llama 4's experts: SwiGLU of x * weight, added with weight 1."""
        return cls(None, None, None, 0.0, 0.0, clamped=False, input_scaled=True)

    def check(self, parts: MoeParts) -> None:
        if self.n_ff not in (None, parts.n_ff) or self.n_embd not in (None, parts.n_embd):
            raise ValueError(f"expert biases of widths {self.n_ff}/{self.n_embd} for experts of "
                             f"{parts.n_ff}/{parts.n_embd}")


def moe_scratch_bytes(parts: MoeParts, n_tokens: int, n_assign: int) -> int:
    """Scratch bytes `moe_swiglu` needs for up to `n_tokens` tokens and `n_assign` assignments."""
    parts.check()
    out = ffi.new("int64_t *")
    check(lib.strata_moe_scratch_bytes(int(parts.gate.type), int(parts.up.type), int(parts.down.type), n_tokens,
                                       n_assign, parts.n_embd, parts.n_ff, out),
          f"MoE scratch for {n_tokens} tokens, {n_assign} assignments")
    return int(out[0])


def moe_swiglu(pool: ComputePool | None, x: Any, out: Any, parts: MoeParts, expert_index: Any, offsets: Any,
               token_ids: Any, weights: Any, scratch: Any, impl: str = "auto", act: MoeAct | None = None,
               ids: Any = None) -> Any:
    """out[T, D] += sum over assignments a of weights[a] * down_e(silu(gate_e x_t) * up_e x_t), for
    t = token_ids[a] and e = expert_index[j] where offsets[j] <= a < offsets[j + 1].

    x, out: float32 [T, D]; expert_index int32 [J]; offsets int64 [J + 1]; token_ids int32 and
    weights float32 [A]. Terms are added into `out` in ascending assignment order whatever the pool
    size, so calls over consecutive chunks of experts add up to one call. With `act`, each expert j
    computes that function instead, with the biases of id ids[j] (int32 [J]). Returns `out`."""
    parts.check()
    if act is not None:
        act.check(parts)
    x_ptr, x_bytes, x_shape = typed_view(x, "float *", "MoE x")
    o_ptr, o_bytes, o_shape = typed_view(out, "float *", "MoE output", writable=True)
    if len(x_shape) != 2 or x_shape[1] != parts.n_embd or o_shape != x_shape:
        raise ValueError(f"MoE: x {x_shape} and out {o_shape} must both be [T, {parts.n_embd}]")
    e_ptr, n_experts, _ = typed_view(expert_index, "int32_t *", "expert_index")
    f_ptr, n_off, _ = typed_view(offsets, "int64_t *", "offsets")
    t_ptr, n_assign, _ = typed_view(token_ids, "int32_t *", "token_ids")
    w_ptr, n_weights, _ = typed_view(weights, "float *", "weights")
    n_experts, n_off, n_assign, n_weights = n_experts // 4, n_off // 8, n_assign // 4, n_weights // 4
    if n_off != n_experts + 1 or n_weights != n_assign:
        raise ValueError(f"MoE: {n_experts} experts need {n_experts + 1} offsets (found {n_off}); "
                         f"{n_assign} token ids need as many weights (found {n_weights})")
    s_ptr, s_bytes = (ffi.NULL, 0) if scratch is None else dst_view(scratch, "MoE scratch")
    g, u, d = parts
    if act is None:
        status = lib.strata_moe_swiglu(_pool_ptr(pool), x_ptr, x_bytes, x_shape[0], parts.n_embd, parts.n_ff, g.c,
                                       u.c, d.c, n_experts, e_ptr, f_ptr, t_ptr, w_ptr, n_assign, o_ptr, o_bytes,
                                       s_ptr, s_bytes, impl_code(impl))
    else:
        i_ptr, i_bytes, _ = typed_view(ids, "int32_t *", "expert ids")
        if i_bytes // 4 != n_experts:
            raise ValueError(f"MoE: {n_experts} experts need as many ids, found {i_bytes // 4}")
        c = ffi.new("strata_moe_act *", act.c[0])
        c.expert_ids = i_ptr
        status = lib.strata_moe_glu(_pool_ptr(pool), x_ptr, x_bytes, x_shape[0], parts.n_embd, parts.n_ff, g.c, u.c,
                                    d.c, n_experts, e_ptr, f_ptr, t_ptr, w_ptr, n_assign, c, o_ptr, o_bytes,
                                    ffi.NULL, 0, s_ptr, s_bytes, impl_code(impl))
    if status:
        check(status, f"MoE SwiGLU ({g.type.name}/{u.type.name}/{d.type.name}, {x_shape[0]} tokens, "
                  f"{n_experts} experts, {n_assign} assignments; experts held: {g.n_experts}/{u.n_experts}/"
                  f"{d.n_experts}; scratch {s_bytes} B)")
    return out


class MoeCall:
    """`moe_swiglu` over buffers bound once (a decode step's fixed inputs and outputs): x and out
    float32 [capacity, D], offsets int64, token_ids int32 and weights float32 as `moe_swiglu`
    takes them. Per call only the experts (their parts and indices), the first expert's offset and
    the token count change, so a call costs a few pointer operations instead of a dozen checks."""

    def __init__(self, x: Any, out: Any, offsets: Any, token_ids: Any, weights: Any, max_experts: int,
                 act: MoeAct | None = None, ids: Any = None):
        self._keep = (x, out, offsets, token_ids, weights)
        self._x, self._x_bytes, x_shape = typed_view(x, "float *", "MoE x")
        self._out, self._out_bytes, o_shape = typed_view(out, "float *", "MoE output", writable=True)
        if len(x_shape) != 2 or o_shape != x_shape:
            raise ValueError(f"MoE: x {x_shape} and out {o_shape} must both be [T, D]")
        self.n_embd = x_shape[1]
        self._off, off_bytes, _ = typed_view(offsets, "int64_t *", "offsets")
        self._tok, tok_bytes, _ = typed_view(token_ids, "int32_t *", "token_ids")
        self._w, w_bytes, _ = typed_view(weights, "float *", "weights")
        self.n_assign = tok_bytes // 4
        if w_bytes // 4 != self.n_assign:
            raise ValueError(f"MoE: {self.n_assign} token ids need as many weights, found {w_bytes // 4}")
        self.max_experts = min(max_experts, off_bytes // 8 - 1)
        self._index = ffi.new("int32_t[]", max(self.max_experts, 1))
        self._rows: np.ndarray | None = None  # [A, D] float32, for `rows` (made at its first use)
        self.act: MoeAct | None = None
        self._act = None  # with `act`: its descriptor, whose expert ids point into `ids` at each call
        self.bind_act(act, ids)

    def bind_act(self, act: MoeAct | None, ids: Any = None) -> None:
        """Compute `act` from now on (None: plain SwiGLU), expert first + j of a call having id
        ids[first + j] (int32, at least max_experts; the grouping's `used`), read at each call."""
        if act is None:
            self.act = self._act = None
            return
        ptr, ids_bytes, _ = typed_view(ids, "int32_t *", "expert ids")
        if ids_bytes // 4 < self.max_experts:
            raise ValueError(f"MoE: {self.max_experts} experts need as many ids, found {ids_bytes // 4}")
        self._ids, self._ids_keep = ptr, ids
        self.act, self._act = act, ffi.new("strata_moe_act *", act.c[0])

    def __call__(self, pool: ComputePool | None, parts: MoeParts, index: list[int], first: int, n_tokens: int,
                 scratch: Any, impl: str = "auto") -> None:
        """out[:n_tokens] += the experts `index` (positions in `parts`), which own the assignments
        between offsets[first] and offsets[first + len(index)]."""
        self._run(False, pool, parts, index, first, n_tokens, scratch, impl)

    def rows(self, pool: ComputePool | None, parts: MoeParts, index: list[int], first: int, n_tokens: int,
             scratch: Any, impl: str = "auto") -> None:
        """As a call, but each assignment's unweighted down vector goes to its row of the call's
        rows buffer [A, D] and `out` is untouched; an index below 0 skips that expert. `reduce`
        then adds the rows into out: together the bytes of one call."""
        if self._rows is None:
            self._rows = np.empty((self.n_assign, self.n_embd), dtype=np.float32)
            self._rows_ptr = typed_view(self._rows, "float *", "MoE rows", writable=True)[0]
        self._run(True, pool, parts, index, first, n_tokens, scratch, impl)

    def reduce(self, first: int, n: int, n_tokens: int) -> None:
        """out[:n_tokens] += the rows of the assignments of experts first .. first + n - 1, weighted,
        in ascending assignment order (after `rows` computed all of them)."""
        if self._rows is None or first < 0 or first + n > self.max_experts:
            raise ValueError(f"MoE reduce: experts {first}..{first + n} of {self.max_experts}"
                             f"{'' if self._rows is not None else ' before any rows call'}")
        a0, a1 = int(self._off[first]), int(self._off[first + n])
        weights = ffi.NULL if self.act is not None and self.act.input_scaled else self._w  # NULL: weight 1
        check(lib.strata_moe_reduce(self._rows_ptr, self._rows.nbytes, self._tok,
                                    weights, a0, a1 - a0, self.n_assign, n_tokens, self.n_embd, self._out,
                                    self._out_bytes), f"MoE reduce of assignments {a0}..{a1}, {n_tokens} tokens")

    def _run(self, rows: bool, pool: ComputePool | None, parts: MoeParts, index: list[int], first: int,
             n_tokens: int, scratch: Any, impl: str) -> None:
        n = len(index)
        if parts.n_embd != self.n_embd or first < 0 or first + n > self.max_experts or n_tokens * self.n_embd * 4 > self._x_bytes:
            raise ValueError(f"MoE call: {n} experts from {first} of {self.max_experts}, {n_tokens} tokens, "
                             f"parts of width {parts.n_embd} for x of width {self.n_embd}")
        for j, e in enumerate(index):
            self._index[j] = e
        g, u, d = parts
        out, out_bytes = (self._rows_ptr, self._rows.nbytes) if rows else (self._out, self._out_bytes)
        head = (_pool_ptr(pool), self._x, self._x_bytes, n_tokens, self.n_embd, parts.n_ff, g.c, u.c, d.c, n,
                self._index, self._off + first, self._tok, self._w, self.n_assign)
        tail = (ffi.cast("void *", scratch.data_ptr()), scratch.numel(), impl_code(impl))
        if self._act is None and not rows:
            status = lib.strata_moe_swiglu(*head, out, out_bytes, *tail)
        else:  # rows (one call of two) or another expert function: strata_moe_glu (act NULL: plain SwiGLU)
            if self._act is not None:
                self.act.check(parts)
                self._act.expert_ids = self._ids + first
            status = lib.strata_moe_glu(*head, ffi.NULL if self._act is None else self._act,
                                        *((ffi.NULL, 0, out, out_bytes) if rows else (out, out_bytes, ffi.NULL, 0)),
                                        *tail)
        if status:
            check(status, f"MoE SwiGLU ({g.type.name}/{u.type.name}/{d.type.name}, {n_tokens} tokens, {n} experts; "
                          f"experts held: {g.n_experts}/{u.n_experts}/{d.n_experts}; scratch {scratch.numel()} B)")


__all__ = ["ComputePool", "MoeAct", "MoeCall", "MoePart", "MoeParts", "matmul_heads", "matmul_heads_scratch_bytes",
           "matmul_into", "matmul_scratch_bytes", "moe_scratch_bytes",
           "moe_swiglu"]
