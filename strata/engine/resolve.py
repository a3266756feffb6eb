"""Where and in what a model computes: the device, the compute dtype and the compute kind,
resolved from what the caller asked for, or a one-line StrataError saying what is wrong."""
from __future__ import annotations

import torch

from strata.errors import StrataError

DTYPES = {"float32": torch.float32, "f32": torch.float32, "float16": torch.float16, "f16": torch.float16,
          "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


def resolve_device(device: str | torch.device) -> torch.device:
    """'cpu', 'cuda' or 'cuda:N' as a torch.device, or a StrataError saying what is wrong."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise StrataError(f"unknown device {device!r}: expected 'cpu', 'cuda' or 'cuda:N'") from None
    if dev.type not in ("cpu", "cuda"):
        raise StrataError(f"unknown device {device!r}: expected 'cpu', 'cuda' or 'cuda:N'")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise StrataError(f"device {device!r}: no CUDA GPU is available to this torch ({torch.__version__})")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise StrataError(f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s) present")
    return dev


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """The compute dtype: float32 on the CPU and bfloat16 on CUDA unless one is given."""
    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype.lower() in DTYPES:
        return DTYPES[dtype.lower()]
    raise StrataError(f"unknown dtype {dtype!r}: expected one of {sorted(DTYPES)}")


def resolve_compute(compute: str | None, device: torch.device, dtype: str | torch.dtype | None) -> str:
    """'packed' or 'float'. Default: packed on the CPU (the native kernels compute from the file's
    blocks) unless a dtype other than float32 is asked for; float on CUDA."""
    if compute in (None, "auto"):
        wants_float32 = dtype is None or resolve_dtype(dtype, device) == torch.float32
        return "packed" if device.type == "cpu" and wants_float32 else "float"
    if compute not in ("packed", "float"):
        raise StrataError(f"unknown compute {compute!r}: expected 'auto', 'packed' or 'float'")
    if compute == "packed" and device.type != "cpu":
        raise StrataError(f"compute 'packed' runs on the CPU; on {device} use 'float'")
    if compute == "packed" and dtype is not None and resolve_dtype(dtype, device) != torch.float32:
        raise StrataError(f"compute 'packed' computes in float32 (activations rounded to 8-bit blocks); "
                          f"dtype {dtype} needs compute 'float'")
    return compute


__all__ = ["DTYPES", "resolve_compute", "resolve_device", "resolve_dtype"]
