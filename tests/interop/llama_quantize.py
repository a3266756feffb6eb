"""llama.cpp's quantizer in process: `llama_model_quantize` in the libllama llama-cpp-python
ships (what `llama-quantize` runs), with an importance matrix, `--tensor-type` overrides,
metadata overrides and `--allow-requantize`. Used by the interop fixtures
(tests/interop/quantize_fixtures.py) and the benchmarks (benchmarks/packed_vs_llama.py); light
to import (no torch): llama_cpp is imported on the first call."""
from __future__ import annotations

import contextlib
import ctypes
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

GGML_LOG_LEVEL_ERROR = 4  # ggml.h's ggml_log_level (NONE, DEBUG, INFO, WARN, ERROR, CONT)


def llama_cpp():
    import llama_cpp
    return llama_cpp


def llama_quantize(src: Path, out: Path, ftype: str, *, imatrix: Mapping[str, np.ndarray] | None = None,
                   metadata: Sequence[tuple[str, str | int]] = (), overrides: Sequence[tuple[str, int]] = (),
                   allow_requantize: bool = False, n_threads: int = 2) -> Path:
    """`llama-quantize [--allow-requantize] [--imatrix] [--tensor-type P=T ...] SRC OUT FTYPE`.
    imatrix: per tensor name, float32 [n_experts * K] importances (llama.cpp's layout);
    metadata: (key, str or int value) written into OUT (the `quantize.imatrix.*` keys);
    overrides: (tensor name regex, ggml type id). RuntimeError with llama.cpp's error lines."""
    ll = llama_cpp()
    code = getattr(ll, f"LLAMA_FTYPE_MOSTLY_{ftype}", None)
    if code is None:
        raise ValueError(f"{out.name}: unknown llama.cpp file type {ftype!r} (no LLAMA_FTYPE_MOSTLY_{ftype})")
    params = ll.llama_model_quantize_default_params()
    params.nthread, params.ftype, params.allow_requantize = n_threads, code, allow_requantize
    alive = []  # what the params point into, kept until the call returns
    if imatrix is not None:
        arr = (ll.llama_model_imatrix_data * (len(imatrix) + 1))()  # zeroed last entry: the terminator
        for slot, (name, data) in zip(arr, imatrix.items()):
            slot.name, slot.data, slot.size = name.encode(), data.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), data.size
        params.imatrix = arr
        alive += [imatrix, arr]
    if metadata:
        params.kv_overrides = _kv_overrides(ll, metadata)
        alive.append(params.kv_overrides)
    if overrides:
        tt = (ll.llama_model_tensor_override * (len(overrides) + 1))()  # zeroed last entry: the terminator
        for slot, (pattern, qtype) in zip(tt, overrides):
            slot.pattern, slot.type = pattern.encode(), int(qtype)
        params.tt_overrides = tt
        alive.append(tt)
    with _llama_log() as errors:
        status = ll.llama_model_quantize(str(src).encode(), str(out).encode(), ctypes.byref(params))
    if status != 0:
        said = [line.strip() for e in errors for line in e.splitlines() if line.strip().strip("=")]
        raise RuntimeError(f"llama_model_quantize {src} -> {out} ({ftype}) failed: {'; '.join(said)}")
    return out


def _kv_overrides(ll, keys: Sequence[tuple[str, str | int]]):
    kvs = (ll.llama_model_kv_override * (len(keys) + 1))()  # zeroed last entry (empty key): the terminator
    for kv, (key, value) in zip(kvs, keys):
        kv.key = key.encode()
        if isinstance(value, str):
            kv.tag, kv.value.val_str = ll.LLAMA_KV_OVERRIDE_TYPE_STR, value.encode()[:127]
        else:
            kv.tag, kv.value.val_i64 = ll.LLAMA_KV_OVERRIDE_TYPE_INT, value
    return kvs


@contextlib.contextmanager
def _llama_log():
    """llama.cpp's log kept from stderr (a line per tensor) while inside; yields its error lines."""
    ll, errors = llama_cpp(), []
    old_cb, old_data = ll.llama_log_callback(), ctypes.c_void_p()
    ll.llama_log_get(ctypes.byref(old_cb), ctypes.byref(old_data))

    @ll.llama_log_callback
    def keep(level, text, _):
        if level == GGML_LOG_LEVEL_ERROR:
            errors.append(text.decode("utf-8", "replace"))

    ll.llama_log_set(keep, None)
    try:
        yield errors
    finally:
        ll.llama_log_set(old_cb, old_data)


__all__ = ["llama_cpp", "llama_quantize"]
