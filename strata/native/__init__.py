"""Strata's C runtime, wrapped: the only package that touches the cffi `ffi`/`lib` handle.

    from strata import native
    native.dequantize_into(t, src, out, n_threads=2)     # dequant.py
    native.quantize(t, x)                                # quantizer.py
    with native.Pager(path) as pager: ...                # pager.py
    guard = native.MapGuard(np.memmap(path, mode="r"))   # guard.py: a file cut short reads zeros, no SIGBUS
    with native.ComputePool(2) as pool:                  # matmul.py: products from packed weights
        native.matmul_into(pool, t, w, n_rows, row_len, x, y, scratch)
    native.qdot_rows(t, w, n_rows, row_len, x)           # qdot.py (quantized matrix kernels, tests)
    native.type_support("IQ2_XXS").verdict()             # support.py: what the runtime does with a type
    native.rmsnorm(x, weight, eps, out); native.rope(q, cos, sin, rope_dim, neox)   # glue.py: decode glue
    native.DecodeAttn(...).run(pool, slots, positions, cos, sin, x, outputs, scratch)  # step.py: fused
    native.LayerStep                                  # step.py: what each kind's step binding shares
    native.DsaIndexer(...).select(...); native.dsa_attend(...)   # dsa.py: sparse attention's decode calls
    native.DecodeLayers(layers, outputs).run(pool, slots, positions, cos, sin, x, ...)  # program.py: all layers

Wrappers check their inputs, call C (the GIL is released) and turn any status into `NativeError`
through one helper (`_lib.check`); they hold no policy about what to compute or read.
"""
from ._lib import IMPLS, cpu_has_avx2, cpu_has_avx512, cpu_has_avx512_vbmi, cpu_fast_gathers, cpu_fast_ymm_gathers, cpu_avx_vnni, cpu_splits_512, default_impl, default_threads
from .deltanet import attn_gate, deltanet_conv, deltanet_gates, deltanet_norm_gate, deltanet_recur
from .dsa import DsaIndexer, dsa_attend, i64_ptr
from .dequant import convert_f32_into, dequantize, dequantize_into, dequantize_rows, has_kernel
from .exchange import Exchange, ExchangeError, exchange_bytes
from .guard import MAX_GUARDED, MapGuard
from .glue import attn_decode, gate_softplus, group_assignments, kv_cache_type, kv_row_bytes, kv_write, matvec, rmsnorm, rope, route
from .matmul import (ComputePool, MoeAct, MoeCall, MoePart, MoeParts, matmul_heads, matmul_heads_scratch_bytes,
                     matmul_into, matmul_scratch_bytes, moe_scratch_bytes, moe_swiglu)
from .pager import DEFAULT_PAGER_THREADS, Pager, PagerInfo, PagerPart, PagerTimeoutError, numa_node_count, numa_node_of
from .step import DecodeAttn, LayerStep, StepOutputs, f32_ptr, layer_head, void_ptr
from .program import DecodeLayers, shared_weights
from .qdot import has_qdot_kernel, qdot_rows, quantize_act
from .quantizer import can_quantize, quantize, quantize_into
from .support import TypeSupport, supported_types, type_support

__all__ = ["DEFAULT_PAGER_THREADS", "ComputePool", "DecodeAttn", "DsaIndexer", "dsa_attend", "i64_ptr", "LayerStep", "attn_gate", "deltanet_conv", "deltanet_gates",
           "deltanet_norm_gate", "deltanet_recur", "DecodeLayers", "Exchange", "ExchangeError", "MoeAct", "MoeCall", "matmul_heads", "matmul_heads_scratch_bytes", "StepOutputs", "f32_ptr", "layer_head", "void_ptr", "IMPLS", "MAX_GUARDED", "MapGuard", "MoePart", "MoeParts", "Pager", "PagerInfo", "PagerPart",
           "PagerTimeoutError", "attn_decode", "can_quantize", "gate_softplus", "convert_f32_into", "cpu_has_avx2", "cpu_has_avx512", "cpu_has_avx512_vbmi", "cpu_fast_gathers", "cpu_fast_ymm_gathers", "cpu_avx_vnni", "cpu_splits_512",
           "default_impl", "default_threads", "dequantize", "dequantize_into", "dequantize_rows", "exchange_bytes", "group_assignments", "has_kernel",
           "has_qdot_kernel", "kv_cache_type", "kv_row_bytes", "kv_write", "matmul_into", "matmul_scratch_bytes", "matvec", "moe_scratch_bytes",
           "moe_swiglu", "numa_node_count", "numa_node_of", "qdot_rows", "quantize", "quantize_act", "quantize_into",
           "rmsnorm", "rope", "route", "shared_weights", "supported_types", "type_support", "TypeSupport"]
