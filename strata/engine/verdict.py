"""Will a model file run, and how: one sentence for `strata inspect` and for `strata.load`.

    v = verdict(model_file, compute="packed")
    v.runs      # False
    v.sentence  # "does not run: tensor 'blk.0.ffn_down_exps.weight' is Q8_1, which ..."

The checks are the ones loading would make, in the order a user would want to hear them: the
architecture, every tensor's ggml type on the chosen compute path, then the tokenizer. A file
that runs is described by its compute path and the kernel family each of its types uses on this
CPU (`scalar` where a type has no SIMD kernel yet). Must not: allocate weights or memories.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from strata import arch as archs
from strata import native
from strata.errors import StrataError
from strata.gguf import ModelFile
from strata.quant import DEQUANT_TYPES, GGMLType
from strata.tokenizer import Tokenizer

#: Kernel families from widest to narrowest, as `native.default_impl` names them.
_FAMILIES = ("avx512", "avx2", "scalar")


@dataclass(frozen=True)
class Verdict:
    """Whether a file runs on a compute path, and the sentence that says so."""

    runs: bool
    sentence: str
    compute: str
    kernels: dict[str, str] = field(default_factory=dict)  # ggml type name -> kernel family used here

    def to_dict(self) -> dict:
        return {"runs": self.runs, "sentence": self.sentence, "compute": self.compute, "kernels": self.kernels}


def packed_types() -> list[GGMLType]:
    """The ggml types the native quantized kernels multiply straight from their blocks."""
    return [t for t in GGMLType if _has_packed(t)]


def _has_packed(t: GGMLType) -> bool:
    try:
        return native.has_qdot_kernel(t, "scalar")  # every kernel family falls back to the scalar tile
    except ValueError:
        return False


def _family(t: GGMLType, compute: str) -> str:
    """The widest kernel family this CPU runs for `t` (the dequantization kernels on the float path)."""
    has = native.has_qdot_kernel if compute == "packed" else native.has_kernel
    widest = native.default_impl()
    for impl in _FAMILIES[_FAMILIES.index(widest):]:
        if has(t, impl):
            return impl
    return "scalar"


def _needs_packed(mf: ModelFile, name: str, shape: tuple[int, ...]) -> bool:
    """Matrices are multiplied from their blocks under packed compute; vectors (norms, biases),
    routers and the embedding table (rows looked up, unless it doubles as the output head) are
    read as float32."""
    if len(shape) < 2 or "ffn_gate_inp" in name:
        return False
    return not name.startswith("token_embd") or "output.weight" not in mf.tensors


def _type_problem(mf: ModelFile, compute: str) -> str | None:
    """The first tensor whose type the compute path cannot use, as the middle of a sentence."""
    dequant = set(DEQUANT_TYPES)
    packed = set(packed_types()) if compute == "packed" else set()
    for name, t in mf.tensors.items():
        if t.ggml_type not in dequant:
            return (f"tensor {name!r} is {t.ggml_type.name}, which Strata cannot read "
                    f"(types it reads: {', '.join(x.name for x in DEQUANT_TYPES)})")
        if compute == "packed" and _needs_packed(mf, name, t.shape) and t.ggml_type not in packed:
            return (f"tensor {name!r} is {t.ggml_type.name}, which has no packed kernel "
                    f"(packed types: {', '.join(x.name for x in sorted(packed))}); use --compute float")
    return None


def verdict(mf: ModelFile, compute: str, *, tokenizer: bool = True) -> Verdict:
    """Whether `mf` runs with `compute` ('packed' or 'float') on this machine, and how.

    `tokenizer=False` skips building the tokenizer (a caller that builds it next says its error)."""
    arch = archs.get(mf.arch)
    if arch is None or not arch.runs:
        return Verdict(False, f"does not run: architecture {mf.arch!r} is not supported for inference "
                              f"(supported: {', '.join(archs.names(runs=True))})", compute)
    problem = _type_problem(mf, compute)
    if problem is not None:
        return Verdict(False, f"does not run: {problem}", compute)
    if tokenizer:
        try:
            Tokenizer.from_metadata(mf.metadata, str(mf.path), vocab_size=mf.hparams.vocab_size)
        except StrataError as e:
            return Verdict(False, f"does not run: {str(e).removeprefix(f'{mf.path}: ')}", compute)
    types = sorted({t.ggml_type for t in mf.tensors.values()})
    kernels = {t.name: _family(t, compute) for t in types}
    by_family: dict[str, list[str]] = {}
    for name, fam in kernels.items():
        by_family.setdefault(fam, []).append(name)
    how = "; ".join(f"{fam}: {', '.join(names)}" for fam, names in sorted(by_family.items(),
                                                                           key=lambda kv: _FAMILIES.index(kv[0])))
    path = ("packed compute (the native kernels multiply the file's blocks)" if compute == "packed"
            else "float compute (weights dequantized, torch multiplies)")
    return Verdict(True, f"runs: {mf.arch}, {path}; kernels {how}", compute, kernels)


def check_runs(mf: ModelFile, compute: str) -> None:
    """Raise StrataError with the verdict's sentence, naming the file, when `mf` does not run."""
    v = verdict(mf, compute, tokenizer=False)
    if not v.runs:
        raise StrataError(f"{mf.path}: {v.sentence}")


__all__ = ["Verdict", "check_runs", "packed_types", "verdict"]
