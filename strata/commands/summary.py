"""The line `convert`, `synth` and `imatrix` end with: what file was written, how big, which
tensor types (with counts) and how long it took.

    wrote out.gguf: 1.43 GiB, 435 tensors (F32 193, Q4_K 144, Q8_0 98) in 12.4 s

Must not: write or check files; it reads back the headers of what the command wrote.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

from strata.units import format_bytes


def first_part(path: str | Path) -> Path:
    """`path`, or the first part of the split files written in its place (OUT-00001-of-0000N.gguf)."""
    path = Path(path)
    if path.exists():
        return path
    parts = sorted(path.parent.glob(f"{path.stem}-00001-of-*{path.suffix}"))
    return parts[0] if parts else path


def _model_facts(path: Path) -> tuple[int, int, Counter]:
    """(bytes of every part, number of parts, tensors per ggml type) of a GGUF model file."""
    from strata.gguf import open_model

    with open_model(path) as model:
        s = model.summary()
    return s["file_bytes"], len(s["parts"]), Counter({t: v["tensors"] for t, v in s["types"].items()})


def _plain_facts(path: Path) -> tuple[int, int, Counter]:
    """The same of any GGUF file (an imatrix has no architecture), read by gguf-py."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    return path.stat().st_size, 1, Counter(t.tensor_type.name for t in reader.tensors)


def written_line(path: str | Path, seconds: float, model: bool = True) -> str:
    """The summary line of the GGUF file (or split model) written at `path` in `seconds`."""
    first = first_part(path)
    size, n_parts, types = (_model_facts if model else _plain_facts)(first)
    parts = f" in {n_parts} parts" if n_parts > 1 else ""
    counts = ", ".join(f"{t} {n}" for t, n in sorted(types.items()))
    return (f"wrote {first}: {format_bytes(size)}{parts}, {sum(types.values())} tensors ({counts}) "
            f"in {seconds:.1f} s")


__all__ = ["first_part", "written_line"]
