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

from strata import native
from strata.errors import StrataError, StrataFormatError
from strata.gguf import ModelFile
from strata.models.loader import architecture, check_types
from strata.quant import GGMLType
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


def _family(t: GGMLType, compute: str) -> str:
    """The kernel family that runs `t` here: its packed kernel's, or on the float path the widest
    dequantization kernel this CPU runs."""
    if compute == "packed":
        return native.type_support(t).runs or "scalar"
    widest = native.default_impl()
    return next((f for f in ("avx512", "avx2") if _FAMILIES.index(f) >= _FAMILIES.index(widest)
                 and native.has_kernel(t, f)), "scalar")


def _problem(mf: ModelFile, compute: str, cuda: bool) -> str | None:
    """The loader's own checks (`architecture`, then `check_types`) as the middle of a sentence, or
    None when both pass."""
    try:
        architecture(mf)
        check_types(mf, compute == "packed", cuda=cuda)
    except StrataError as e:
        return str(e).removeprefix(f"{mf.path}: ")
    return None


def verdict(mf: ModelFile, compute: str, *, cuda: bool = False, tokenizer: bool = True) -> Verdict:
    """Whether `mf` runs with `compute` ('packed' or 'float') on this machine, and how.

    cuda: the experts are dequantized on a GPU (the tiered memory on CUDA). `tokenizer=False`
    skips building the tokenizer (a caller that builds it next says its error)."""
    problem = _problem(mf, compute, cuda)
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


def check_runs(mf: ModelFile, compute: str, *, cuda: bool = False) -> None:
    """Raise StrataFormatError with the verdict's sentence, naming the file, when `mf` does not run."""
    problem = _problem(mf, compute, cuda)  # the verdict's sentence, without describing the kernels
    if problem is not None:
        raise StrataFormatError(f"{mf.path}: does not run: {problem}")


__all__ = ["Verdict", "check_runs", "verdict"]
