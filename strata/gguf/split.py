"""Models split in several GGUF files, in llama.cpp's gguf-split layout.

    Model-Q4_K_M-00001-of-00003.gguf   split.no=0 split.count=3 split.tensors.count=N + all metadata
    Model-Q4_K_M-00002-of-00003.gguf   split.no=1 split.count=3 split.tensors.count=N
    Model-Q4_K_M-00003-of-00003.gguf   split.no=2 ...

Every part is a whole GGUF file (its own header, tensor table and data section); a tensor lies in
one part; the first part holds the model's metadata (llama.cpp reads no other part's keys but
split.no). `split.no` and `split.count` are u16, `split.tensors.count` an i32; parts are named
PREFIX-%05d-of-%05d.gguf numbering from 1. Any part's path opens the whole set.

Strata addresses a split model as one space of offsets: part i occupies [base_i, base_i + size_i)
with base_0 = 0 and base_{i+1} = round_up(base_i + size_i, PART_ALIGN), so an O_DIRECT-aligned
range of the space is aligned in its file too. Every TensorInfo/ExpertSlab offset is in that space.
Must not read tensor data: headers only.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gguf.constants import GGUFValueType, Keys
from gguf.gguf_writer import GGUFWriter, WriterState

from strata.units import MIB, round_up

from .header import HeaderScan, format_error, scan_header

SPLIT_NO = Keys.Split.LLM_KV_SPLIT_NO
SPLIT_COUNT = Keys.Split.LLM_KV_SPLIT_COUNT
SPLIT_TENSORS = Keys.Split.LLM_KV_SPLIT_TENSORS_COUNT
SPLIT_KEYS = (SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS)
#: The value type llama.cpp writes and reads for each split key.
SPLIT_TYPES = {SPLIT_NO: GGUFValueType.UINT16, SPLIT_COUNT: GGUFValueType.UINT16, SPLIT_TENSORS: GGUFValueType.INT32}
#: Gap between parts in the model's offsets: a multiple of every O_DIRECT alignment in use.
PART_ALIGN = MIB
#: Keys that describe one file's layout, not the model: they may differ between parts.
_PER_FILE_KEYS = frozenset(SPLIT_KEYS) | {Keys.General.ALIGNMENT}

_NAME = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")


def part_name(prefix: str, no: int, count: int) -> str:
    """llama.cpp's name of part `no` (0-based) of `count`: PREFIX-00001-of-00003.gguf for no=0."""
    return f"{prefix}-{no + 1:05d}-of-{count:05d}.gguf"


def part_paths(target: Path, count: int) -> list[Path]:
    """Where a model written to `target` (NAME.gguf) goes in `count` parts: NAME-0000i-of-0000n.gguf,
    as llama.cpp's converter and gguf-py's writer name them; [target] for one part."""
    if count == 1:
        return [target]
    stem = target.name[:-5] if target.name.endswith(".gguf") else target.name
    return [target.with_name(part_name(stem, i, count)) for i in range(count)]


@dataclass(frozen=True)
class SplitKeys:
    """The split.* keys of one file (n_tensors None where the key is absent)."""

    no: int
    count: int
    n_tensors: int | None


def split_keys(path: Path, scan: HeaderScan) -> SplitKeys | None:
    """The file's split.* keys; None when it is a whole model (split.count absent, 0 or 1, as llama.cpp)."""
    md, types = scan.metadata, scan.value_types
    for key in SPLIT_KEYS:
        if key in md and types[key] != SPLIT_TYPES[key]:
            raise format_error(path, f"metadata key {key!r}", f"a {SPLIT_TYPES[key].name} (llama.cpp's gguf-split)",
                               types[key].name)
    count = md.get(SPLIT_COUNT, 0)
    if count <= 1:
        return None
    if SPLIT_NO not in md:
        raise format_error(path, f"metadata key {SPLIT_NO!r}", f"present since {SPLIT_COUNT} is {count}", "no such key")
    if md[SPLIT_NO] >= count:
        raise format_error(path, f"metadata key {SPLIT_NO!r}", f"below {SPLIT_COUNT}={count}", str(md[SPLIT_NO]))
    return SplitKeys(md[SPLIT_NO], count, md.get(SPLIT_TENSORS))


def _siblings(path: Path, keys: SplitKeys) -> list[Path]:
    """Every part's path, from the name of part `keys.no` (llama.cpp's llama_split_prefix)."""
    suffix = part_name("", keys.no, keys.count)
    if not path.name.endswith(suffix) or len(path.name) == len(suffix):
        raise format_error(path, "file name", f"PREFIX{suffix} for part {keys.no + 1} of {keys.count} "
                           f"(split.no={keys.no}, split.count={keys.count}; llama.cpp's part names)",
                           repr(path.name))
    prefix = path.name[:-len(suffix)]
    return [path.with_name(part_name(prefix, i, keys.count)) for i in range(keys.count)]


def scan_parts(path: Path, scan: HeaderScan) -> list[tuple[Path, HeaderScan]]:
    """(path, header) of every file of the model whose file at `path` was scanned as `scan`, in
    part order: [(path, scan)] for a whole model. Raises StrataFormatError naming the part file
    when a part is missing, misnamed, numbered or counted wrong, of another model, or when the
    tensors of the parts do not add up to split.tensors.count, each tensor once."""
    keys = split_keys(path, scan)
    if keys is None:
        return [(path, scan)]
    paths = _siblings(path, keys)
    missing = [i for i, p in enumerate(paths) if not p.exists()]
    if missing:
        i = missing[0]
        raise format_error(paths[i], "file", f"part {i + 1} of {keys.count} of the model opened from {path.name} "
                           f"({len(missing)} of {keys.count} parts missing)", "no such file")
    parts = [(p, scan if p == path else scan_header(p)) for p in paths]
    for i, (p, s) in enumerate(parts):
        _check_part(p, s, i, keys.count)
    _check_same_model(parts)
    _check_tensor_set(parts)
    return parts


def _check_part(path: Path, scan: HeaderScan, no: int, count: int) -> None:
    keys = split_keys(path, scan)
    if keys is None:
        found = f"{SPLIT_COUNT}={scan.metadata[SPLIT_COUNT]}" if SPLIT_COUNT in scan.metadata else f"no {SPLIT_COUNT} key"
        raise format_error(path, f"metadata key {SPLIT_COUNT!r}", f"{count} (part {no + 1} of a split model)", found)
    if keys.count != count:
        raise format_error(path, f"metadata key {SPLIT_COUNT!r}", f"{count}, as the model's other parts say",
                           f"{keys.count} (a part of another split model?)")
    if keys.no != no:
        raise format_error(path, f"metadata key {SPLIT_NO!r}", f"{no} (its file name says part {no + 1})",
                           f"{keys.no} (a renamed part?)")


def _check_same_model(parts: Sequence[tuple[Path, HeaderScan]]) -> None:
    """Other parts' model keys are ignored (as llama.cpp does) but must not contradict part 1's."""
    first = parts[0][1].metadata
    n_tensors = first.get(SPLIT_TENSORS)
    if n_tensors is None:
        raise format_error(parts[0][0], f"metadata key {SPLIT_TENSORS!r}", "present in the first part of a split model",
                           "no such key")
    for path, scan in parts[1:]:
        for key, value in scan.metadata.items():
            if key not in _PER_FILE_KEYS and key in first and _differs(first[key], value):
                raise format_error(path, f"metadata key {key!r}", f"{first[key]!r:.60} as in part 1",
                                   f"{value!r:.60} (a part of another model?)")
        theirs = scan.metadata.get(SPLIT_TENSORS, n_tensors)
        if theirs != n_tensors:
            raise format_error(path, f"metadata key {SPLIT_TENSORS!r}", f"{n_tensors}, as part 1 says",
                               f"{theirs} (a part of another split model?)")


def _differs(a: Any, b: Any) -> bool:
    return a != b and repr(a) != repr(b)  # repr: a NaN value equals itself


def _check_tensor_set(parts: Sequence[tuple[Path, HeaderScan]]) -> None:
    where: dict[str, Path] = {}
    for path, scan in parts:
        for t in scan.tensors:
            if t.name in where:
                raise format_error(path, f"tensor {t.name!r}", "each tensor in one part only",
                                   f"it in {where[t.name].name} too")
            where[t.name] = path
    first_path, first = parts[0]
    want = first.metadata[SPLIT_TENSORS]
    if len(where) != want:
        counts = ", ".join(str(len(s.tensors)) for _, s in parts)
        raise format_error(first_path, f"metadata key {SPLIT_TENSORS!r}", f"the tensors of the {len(parts)} parts "
                           f"({len(where)}: {counts})", f"{want} (a part missing tensors, or of another model?)")


_SIZE_UNITS = {"": 1, "K": 1000, "M": 1000**2, "G": 1000**3}


def parse_split_size(text: str, what: str = "--split-max-size") -> int:
    """Bytes of llama.cpp's --split-max-size: N, NK, NM or NG (decimal: 10^3, 10^6, 10^9, as its
    converter and gguf-split count). Raises ValueError saying what is wrong."""
    t = str(text).strip()
    unit = t[-1:].upper() if t[-1:].isalpha() else ""
    number = t[:-1] if unit else t
    if unit not in _SIZE_UNITS or not number.isdigit() or int(number) <= 0:
        raise ValueError(f"{what}: expected a positive whole number of bytes, optionally followed by K, M or G "
                         f"(e.g. 500M, 2G), found {text!r}")
    return int(number) * _SIZE_UNITS[unit]


def open_part_files(w: GGUFWriter, paths: Sequence[Path]) -> None:
    """Open gguf-py writer `w`'s outputs at `paths`, one per part it planned (`w.tensors`), as its
    own open_output_file does from one path: lets a caller write the parts under temporary names.
    Every part gets llama.cpp's split keys from the writer (when there are several)."""
    if w.state is not WriterState.NO_FILE:
        raise ValueError(f"{paths[0]}: the writer's output is already open ({w.state.name})")
    if len(paths) != len(w.tensors):
        raise ValueError(f"{paths[0]}: {len(paths)} paths for the writer's {len(w.tensors)} parts")
    w.fout = []
    try:
        for p in paths:
            w.fout.append(open(p, "wb"))
    except BaseException:
        for f in w.fout:
            f.close()
        raise
    w.path, w.state = Path(paths[0]), WriterState.EMPTY


def part_bases(sizes: Sequence[int]) -> list[int]:
    """Where each part's byte 0 lies in the model's offsets (see the module docstring)."""
    bases, end = [], 0
    for size in sizes:
        base = round_up(end, PART_ALIGN)
        bases.append(base)
        end = base + size
    return bases


__all__ = ["PART_ALIGN", "SPLIT_COUNT", "SPLIT_KEYS", "SPLIT_NO", "SPLIT_TENSORS", "SPLIT_TYPES", "SplitKeys",
           "open_part_files", "parse_split_size", "part_bases", "part_name", "part_paths", "scan_parts", "split_keys"]
