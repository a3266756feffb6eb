"""Reading a GGUF header with every count and length checked against the bytes left.

GGUF v2/v3 (little-endian) is laid out as

    magic u32 "GGUF" | version u32 | n_tensors u64 | n_kv u64
    n_kv      x (key: str, value_type u32, value)
    n_tensors x (name: str, n_dims u32, ne u64[n_dims] fastest first, ggml_type u32, offset u64)
    zero padding to `general.alignment` (default 32) | tensor data, each tensor aligned
    str = u64 length + UTF-8 bytes; array = item_type u32 + count u64 + items

gguf-py's reader trusts every count it reads: a count of 2**62 makes it loop practically
forever, a string length past the end of the file is silently cut short, and a tensor range
past the end turns into a numpy reshape error. This walk refuses whatever cannot fit in the
file. Each step consumes at least one byte (arrays of fixed-size items are read in one step),
so it is bounded by the file size; it reads the header only, never tensor data.

It decodes the metadata values itself rather than through gguf-py's reader, which builds a
numpy view per array item: 6.4 s for a Qwen3-sized tokenizer (450k items) against 0.19 s
here. Values come out as `ReaderField.contents()` gives them, except that string values that
are not UTF-8 decode with `surrogateescape` (lossless) where gguf-py raises, and arrays of
arrays stay nested where gguf-py flattens them.
"""
from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf.constants import GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGUFValueType, Keys
from gguf.gguf_reader import READER_SUPPORTED_VERSIONS, GGUFReader  # GGUFReader: its dtype table

from strata.errors import StrataFormatError
from strata.quant import block_size, ggml_type
from strata.units import round_up

#: Versions Strata opens: those gguf-py's reader handles (2 and 3; their layouts are the same
#: for little-endian files). Version 1 used 32-bit counts and lengths and is refused.
SUPPORTED_VERSIONS: tuple[int, ...] = tuple(READER_SUPPORTED_VERSIONS)
#: ggml tensors have at most 4 dimensions (GGML_MAX_DIMS in ggml.h).
GGML_MAX_DIMS = 4
#: Arrays of arrays nest at most this deep; deeper nesting is refused, not recursed into.
MAX_ARRAY_DEPTH = 8

_INT64_MAX = 2**63 - 1
_PREAMBLE_BYTES = 24  # magic, version, n_tensors, n_kv
_MIN_KV_BYTES = 8 + 4 + 1  # empty key, value type, smallest value
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8  # empty name, n_dims = 0, ggml type, offset
_MIN_ARRAY_BYTES = 4 + 8  # an empty nested array: item type, count

# Little-endian numpy dtype of each scalar value type, from the reader's own table.
_SCALAR_DTYPES: dict[GGUFValueType, np.dtype] = {
    t: np.dtype(d).newbyteorder("<") for t, d in GGUFReader.gguf_scalar_to_np.items()
}


def format_error(path: Path | str, subject: str, expected: str, found: str) -> StrataFormatError:
    """The one shape of every format error: file, then tensor or key, then expected vs found."""
    return StrataFormatError(f"{path}: {subject}: expected {expected}, found {found}")


def not_gguf(path: Path | str, head: bytes) -> StrataFormatError:
    """A file that does not start with GGUF's magic, named for what it looks like when that is known."""
    if head.startswith(b"version https://git-lfs"):
        what = "a Git LFS pointer, not the model itself (git lfs pull fetches it)"
    elif len(head) >= 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") < 1 << 30:
        what = "a safetensors file (convert its checkpoint folder: python -m strata.convert)"
    else:
        what = f"its first bytes are {head[:4]!r}, a GGUF file's are b'GGUF'"
    return StrataFormatError(f"{path}: not a GGUF file ({what})")


@dataclass(frozen=True)
class RawTensor:
    """A tensor record as written in the header, not yet checked against the file."""

    name: str
    ne: tuple[int, ...]  # ggml order, fastest dimension first
    type_id: int
    rel_offset: int  # from the start of the data section


@dataclass(frozen=True)
class HeaderScan:
    """What the first pass learned: enough to place and bound every tensor."""

    version: int
    metadata: dict[str, Any]  # key -> int | float | bool | str | list, in file order
    value_types: dict[str, GGUFValueType]  # key -> its GGUF value type
    alignment: int
    data_offset: int  # absolute offset of the data section
    file_size: int
    tensors: tuple[RawTensor, ...]


class _Cursor:
    """Reads little-endian fields from a buffer, refusing to step past its end."""

    def __init__(self, buf, path: Path):
        self.buf, self.path, self.pos, self.end = buf, path, 0, len(buf)

    def remaining(self) -> int:
        return self.end - self.pos

    def take(self, n: int, what: str) -> int:
        if n > self.remaining():
            raise format_error(self.path, what, f"{n} bytes at offset {self.pos}",
                               f"{self.remaining()} bytes left in the file (truncated or corrupt header)")
        start = self.pos
        self.pos += n
        return start

    def u32(self, what: str) -> int:
        return struct.unpack_from("<I", self.buf, self.take(4, what))[0]

    def u64(self, what: str) -> int:
        return struct.unpack_from("<Q", self.buf, self.take(8, what))[0]

    def count(self, what: str, min_item_bytes: int) -> int:
        """A u64 count of items of at least `min_item_bytes` each, bounded by the bytes left."""
        n = self.u64(what)
        if n * min_item_bytes > self.remaining():
            raise format_error(self.path, what, f"at most {self.remaining() // min_item_bytes} (items of "
                               f">= {min_item_bytes} bytes in the {self.remaining()} bytes left)",
                               f"{n} (truncated or corrupt header)")
        return n

    def raw_string(self, what: str) -> bytes:
        n = self.count(f"{what}: string length", 1)
        return self.buf[self.take(n, what):self.pos]

    def name(self, what: str) -> str:
        """A key or tensor name: strict UTF-8."""
        raw = self.raw_string(what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise format_error(self.path, what, "UTF-8 text", f"{raw[:40]!r} ({e.reason})") from None

    def text(self, what: str) -> str:
        """A string value: UTF-8, with undecodable bytes kept as lone surrogates."""
        return self.raw_string(what).decode("utf-8", "surrogateescape")

    def scalars(self, vtype: GGUFValueType, n: int, what: str) -> list:
        dtype = _SCALAR_DTYPES[vtype]
        return np.frombuffer(self.buf, dtype, n, self.take(n * dtype.itemsize, what)).tolist()


def scan_header(path: Path) -> HeaderScan:
    """Walk the header of the GGUF file at `path`; raise StrataFormatError on the first violation.

    A missing or unreadable file raises the OSError `open` gives: that is not a format problem.
    """
    if path.is_dir():
        raise StrataFormatError(f"{path}: a folder, not a GGUF file (a Hugging Face checkpoint is converted first: "
                                f"python -m strata.convert {path} -o MODEL.gguf)")
    size = path.stat().st_size
    if size < _PREAMBLE_BYTES:
        raise format_error(path, "header", f"at least {_PREAMBLE_BYTES} bytes", f"a {size}-byte file")
    with open(path, "rb") as f:
        try:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as e:
            raise StrataFormatError(f"{path}: cannot memory-map the file: {e}") from e
        with buf:
            return _scan(_Cursor(buf, path))


def _scan(cur: _Cursor) -> HeaderScan:
    path = cur.path
    magic = struct.unpack_from("<I", cur.buf, cur.take(4, "magic"))[0]
    if magic != GGUF_MAGIC:
        raise not_gguf(path, bytes(cur.buf[:64]))
    version = cur.u32("version")
    if version & 0xFFFF == 0 and version != 0:
        raise format_error(path, "version", "a little-endian file", f"{version:#x} (a big-endian GGUF file)")
    if version not in SUPPORTED_VERSIONS:
        raise format_error(path, "version", f"one of {SUPPORTED_VERSIONS}", str(version))
    n_tensors = cur.count("n_tensors", _MIN_TENSOR_INFO_BYTES)
    n_kv = cur.count("n_kv", _MIN_KV_BYTES)
    metadata, value_types = _scan_kvs(cur, n_kv)
    tensors = _scan_tensor_infos(cur, n_tensors)
    alignment = _alignment(path, metadata, value_types)
    data_offset = round_up(cur.pos, alignment)
    padding = cur.buf[cur.pos:min(data_offset, cur.end)]
    if padding.strip(b"\0"):  # writers pad with zeros: anything else means the header was misread
        at = cur.pos + next(i for i, b in enumerate(padding) if b)
        raise format_error(path, "padding after the tensor table", f"zero bytes up to the data at {data_offset}",
                           f"a non-zero byte at offset {at}")
    return HeaderScan(version, metadata, value_types, alignment, data_offset, cur.end, tensors)


def _scan_kvs(cur: _Cursor, n_kv: int) -> tuple[dict[str, Any], dict[str, GGUFValueType]]:
    metadata: dict[str, Any] = {}
    value_types: dict[str, GGUFValueType] = {}
    for i in range(n_kv):
        key = cur.name(f"key of metadata entry {i}")
        if key in metadata:
            raise format_error(cur.path, f"metadata key {key!r}", "each key once", "a duplicate")
        what = f"metadata key {key!r}"
        value_types[key] = _value_type(cur, cur.u32(f"{what}: value type"), what)
        metadata[key] = _read_value(cur, value_types[key], what, depth=0)
    return metadata, value_types


def _value_type(cur: _Cursor, raw: int, what: str) -> GGUFValueType:
    try:
        return GGUFValueType(raw)
    except ValueError:
        known = ", ".join(f"{t.value} ({t.name})" for t in GGUFValueType)
        raise format_error(cur.path, f"{what}: value type", f"one of {known}", str(raw)) from None


def _read_value(cur: _Cursor, vtype: GGUFValueType, what: str, depth: int) -> Any:
    if vtype in _SCALAR_DTYPES:
        return cur.scalars(vtype, 1, what)[0]
    if vtype == GGUFValueType.STRING:
        return cur.text(what)
    return _read_array(cur, what, depth)


def _read_array(cur: _Cursor, what: str, depth: int) -> list:
    if depth >= MAX_ARRAY_DEPTH:
        raise format_error(cur.path, what, f"arrays nested at most {MAX_ARRAY_DEPTH} deep", "deeper nesting")
    itype = _value_type(cur, cur.u32(f"{what}: array item type"), f"{what}: array item")
    if itype in _SCALAR_DTYPES:
        n = cur.count(f"{what}: array length", _SCALAR_DTYPES[itype].itemsize)
        return cur.scalars(itype, n, f"{what}: array items")
    if itype == GGUFValueType.STRING:
        return [cur.text(f"{what}[{i}]") for i in range(cur.count(f"{what}: array length", 8))]
    n = cur.count(f"{what}: array length", _MIN_ARRAY_BYTES)
    return [_read_value(cur, itype, f"{what}[{i}]", depth + 1) for i in range(n)]


def _scan_tensor_infos(cur: _Cursor, n_tensors: int) -> tuple[RawTensor, ...]:
    tensors: list[RawTensor] = []
    seen: set[str] = set()
    for i in range(n_tensors):
        name = cur.name(f"name of tensor {i}")
        if name in seen:
            raise format_error(cur.path, f"tensor {name!r}", "each tensor name once", "a duplicate")
        seen.add(name)
        n_dims = cur.u32(f"tensor {name!r}: n_dims")
        if n_dims > GGML_MAX_DIMS:
            raise format_error(cur.path, f"tensor {name!r}: n_dims", f"at most {GGML_MAX_DIMS}", str(n_dims))
        ne = tuple(cur.u64(f"tensor {name!r}: ne[{d}]") for d in range(n_dims))
        _check_element_count(cur.path, name, ne)
        type_id = cur.u32(f"tensor {name!r}: ggml type")
        rel_offset = cur.u64(f"tensor {name!r}: offset")
        tensors.append(RawTensor(name, ne, type_id, rel_offset))
    return tuple(tensors)


def _check_element_count(path: Path, name: str, ne: tuple[int, ...]) -> None:
    n = 1
    for d in ne:
        n *= d
    if n > _INT64_MAX:
        raise format_error(path, f"tensor {name!r}: shape", "an element count that fits int64", f"ne={list(ne)}")


def _alignment(path: Path, metadata: dict[str, Any], value_types: dict[str, GGUFValueType]) -> int:
    key = Keys.General.ALIGNMENT
    if key not in metadata:
        return GGUF_DEFAULT_ALIGNMENT
    vtype, value = value_types[key], metadata[key]
    if vtype != GGUFValueType.UINT32:  # gguf-py and llama.cpp accept only this type
        raise format_error(path, f"metadata key {key!r}", "a UINT32", vtype.name)
    if value == 0 or value & (value - 1):
        raise format_error(path, f"metadata key {key!r}", "a non-zero power of two", str(value))
    return value


def tensor_nbytes(path: Path, t: RawTensor) -> int:
    """Bytes of a tensor from its ggml type and shape; refuses unknown types and partial blocks."""
    try:
        gtype = ggml_type(t.type_id)
        elems_per_block, bytes_per_block = block_size(gtype)
    except (ValueError, KeyError):
        raise format_error(path, f"tensor {t.name!r}: ggml type", "a ggml type id gguf-py knows",
                           f"{t.type_id}") from None
    row = t.ne[0] if t.ne else 1
    if row % elems_per_block:
        raise format_error(path, f"tensor {t.name!r}: row length ne[0]",
                           f"a multiple of the {gtype.name} block of {elems_per_block} elements", str(row))
    n_elems = 1
    for d in t.ne:
        n_elems *= d
    return n_elems // elems_per_block * bytes_per_block


def check_tensor_ranges(path: Path, scan: HeaderScan) -> list[int]:
    """Check every tensor's alignment and byte range; return their sizes in header order."""
    sizes = [tensor_nbytes(path, t) for t in scan.tensors]
    for t, nbytes in zip(scan.tensors, sizes):
        if t.rel_offset % scan.alignment:
            raise format_error(path, f"tensor {t.name!r}: offset",
                               f"a multiple of the alignment {scan.alignment}", str(t.rel_offset))
        start = scan.data_offset + t.rel_offset
        if start + nbytes > scan.file_size:
            raise format_error(path, f"tensor {t.name!r}: data",
                               f"bytes [{start}, {start + nbytes}) inside the file",
                               f"a file of {scan.file_size} bytes (truncated file or bad offset)")
    _check_no_overlap(path, scan.tensors, sizes)
    return sizes


def _check_no_overlap(path: Path, tensors: tuple[RawTensor, ...], sizes: list[int]) -> None:
    spans = sorted((t.rel_offset, t.rel_offset + n, t.name) for t, n in zip(tensors, sizes))
    for (_, prev_end, prev), (start, _, name) in zip(spans, spans[1:]):
        if start < prev_end:
            raise format_error(path, f"tensor {name!r}: offset",
                               f"data after the end of tensor {prev!r} (relative byte {prev_end})",
                               f"relative byte {start}")
