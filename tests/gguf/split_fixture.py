"""Split GGUF sets written the way llama.cpp's gguf-split writes them, with gguf-py alone.

`split_gguf(src, prefix, cuts)` writes `src`'s tensors, in file order, into len(cuts) + 1 parts
named PREFIX-0000i-of-0000n.gguf: part i holds tensors [cuts[i-1], cuts[i]) (a cut at 0 leaves
the first part without tensors, as gguf-split --no-tensor-first-split). Part 1 carries every
metadata key of `src`, then split.no (u16), split.count (u16), split.tensors.count (i32), as
gguf-split adds them; the other parts only the split keys (`arch_in_every_part` keeps the
general.architecture gguf-py's writer adds to each). Knobs for malformed sets: `count`,
`n_tensors` and `numbers` override the split keys written, `extra` adds tensors of `src` to the
last part (a duplicated tensor).
Shared by tests/gguf/test_split*.py and the split fuzz cases.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from gguf import GGUFReader, GGUFWriter

from tests.fixtures.rewrite import copy_metadata, write_file

SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS = "split.no", "split.count", "split.tensors.count"


def part_path(prefix: Path, i: int, n: int) -> Path:
    return prefix.with_name(f"{prefix.name}-{i + 1:05d}-of-{n:05d}.gguf")


def split_gguf(src: Path, prefix: Path, cuts: Sequence[int], *, arch_in_every_part: bool = False,
               count: int | None = None, n_tensors: int | None = None, numbers: Sequence[int] | None = None,
               extra: Sequence[str] = ()) -> list[Path]:
    reader = GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    tensors = list(reader.tensors)
    bounds = [0, *cuts, len(tensors)]
    n = len(bounds) - 1
    paths = [part_path(prefix, i, n) for i in range(n)]
    for i, path in enumerate(paths):
        w = GGUFWriter(str(path), arch)
        if i == 0:
            copy_metadata(reader, w)
        elif not arch_in_every_part:
            del w.kv_data[0]["general.architecture"]
        w.add_uint16(SPLIT_NO, numbers[i] if numbers else i)
        w.add_uint16(SPLIT_COUNT, n if count is None else count)
        w.add_int32(SPLIT_TENSORS, len(tensors) if n_tensors is None else n_tensors)
        extras = [t for t in tensors if t.name in extra] if i == n - 1 else []
        write_file(w, tensors[bounds[i]:bounds[i + 1]] + extras)
    return paths


def rewrite_part(path: Path, set: dict[str, tuple] | None = None, drop_last: bool = False) -> Path:
    """Rewrite part `path` in place with metadata `set` ({key: (value, GGUFValueType)}) and, with
    `drop_last`, without its last tensor; every other key and tensor as it was."""
    reader = GGUFReader(path)
    changes = dict(set or {})
    field = reader.fields.get("general.architecture")
    arch = changes.pop("general.architecture")[0] if "general.architecture" in changes else \
        field.contents() if field else None
    tmp = path.with_name(path.name + ".rewrite")
    w = GGUFWriter(str(tmp), arch or "none")
    if arch is None:
        del w.kv_data[0]["general.architecture"]
    copy_metadata(reader, w, skip=changes)
    for key, (value, vtype) in changes.items():
        w.add_key_value(key, value, vtype)
    tensors = list(reader.tensors)
    write_file(w, tensors[:-1] if drop_last else tensors)
    tmp.replace(path)
    return path


def tensor_cuts(src: Path, n_parts: int) -> list[int]:
    """Cuts into `n_parts` parts of about equal tensor bytes (gguf-split --split-max-size's idea)."""
    sizes = [int(t.n_bytes) for t in GGUFReader(src).tensors]
    total, cuts, acc = sum(sizes), [], 0
    for i, size in enumerate(sizes):
        if len(cuts) < n_parts - 1 and acc >= total * (len(cuts) + 1) / n_parts:
            cuts.append(i)
        acc += size
    return cuts


__all__ = ["SPLIT_COUNT", "SPLIT_NO", "SPLIT_TENSORS", "part_path", "rewrite_part", "split_gguf", "tensor_cuts"]
