"""A Hugging Face checkpoint folder, read lazily: config, tensor index, byte-range reads.

Safetensors files are parsed here (an 8-byte header length, a JSON header, then raw data) and
read with `pread` into fresh buffers instead of being memory-mapped, so the converter's memory is
what it asks for, whatever the checkpoint's size, and it runs under an address-space limit.
Pages just read are dropped from the page cache (`POSIX_FADV_DONTNEED`) so a conversion does not
evict the rest of the machine's cache.

Must not memory-map a checkpoint or know GGUF names and types: it hands out bytes and values.
"""
from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from strata.errors import StrataError


class ConversionError(StrataError):
    """The checkpoint cannot be converted; the message names the file/tensor and the problem."""


#: Source dtypes the converter reads, with their element size.
DTYPES: dict[str, int] = {"F32": 4, "F16": 2, "BF16": 2}

_MAX_HEADER = 100 << 20  # a safetensors header larger than this is corrupt, not big


@dataclass(frozen=True)
class SourceTensor:
    """One tensor of one safetensors file: where its bytes are and what they mean."""
    name: str
    path: Path
    dtype: str               # 'F32' | 'F16' | 'BF16'
    shape: tuple[int, ...]   # row-major, as torch/numpy see it
    offset: int              # absolute byte offset of the data in the file
    nbytes: int

    @property
    def itemsize(self) -> int:
        return DTYPES[self.dtype]


def _read_header(path: Path) -> dict[str, SourceTensor]:
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                raise ConversionError(f"{path}: not a safetensors file (shorter than 8 bytes)")
            (hlen,) = struct.unpack("<Q", raw)
            if hlen > _MAX_HEADER or 8 + hlen > size:
                raise ConversionError(f"{path}: safetensors header length {hlen} does not fit in a file of {size} bytes")
            header = json.loads(f.read(hlen))
    except OSError as exc:
        raise ConversionError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConversionError(f"{path}: safetensors header is not valid JSON ({exc})") from None
    if not isinstance(header, dict):
        raise ConversionError(f"{path}: safetensors header is not a JSON object")
    base = 8 + hlen
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        tensors[name] = _tensor_record(path, name, info, base, size)
    return tensors


def _tensor_record(path: Path, name: str, info: Any, base: int, size: int) -> SourceTensor:
    try:
        dtype, shape, (start, end) = info["dtype"], tuple(int(d) for d in info["shape"]), info["data_offsets"]
    except (KeyError, TypeError, ValueError):
        raise ConversionError(f"{path}: tensor {name}: malformed header entry {info!r}") from None
    if dtype not in DTYPES:
        raise ConversionError(f"{path}: tensor {name}: unsupported dtype {dtype}; expected one of {', '.join(DTYPES)}")
    n = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if end - start != n * DTYPES[dtype] or start < 0 or base + end > size:
        raise ConversionError(f"{path}: tensor {name}: data range [{start}, {end}) does not match shape {shape} "
                              f"{dtype} or lies past the end of the file ({size} bytes)")
    return SourceTensor(name, path, dtype, shape, base + start, end - start)


def _to_f32(raw: bytearray, dtype: str) -> np.ndarray:
    """Bytes of `dtype` -> float32 (exact for every source dtype)."""
    if dtype == "F32":
        return np.frombuffer(raw, dtype="<f4")
    if dtype == "F16":
        return np.frombuffer(raw, dtype="<f2").astype(np.float32)
    # bfloat16 is the top half of a float32.
    return (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)


class Checkpoint:
    """A checkpoint folder: `config`, `tensors` (name -> SourceTensor) and float32 reads."""

    def __init__(self, folder: str | os.PathLike[str]):
        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise ConversionError(f"{self.folder}: not a directory")
        self.config = self._load_config()
        self.tensors = self._index_tensors()
        self._fds: dict[Path, int] = {}

    def _load_config(self) -> dict[str, Any]:
        path = self.folder / "config.json"
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConversionError(f"{path}: missing (a Hugging Face checkpoint folder has a config.json)") from None
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ConversionError(f"{path}: cannot read: {exc}") from None
        if not isinstance(config, dict):
            raise ConversionError(f"{path}: expected a JSON object")
        return config

    def _shard_files(self) -> list[Path]:
        index = self.folder / "model.safetensors.index.json"
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
                raise ConversionError(f"{index}: cannot read the weight map: {exc}") from None
            files = sorted({self.folder / f for f in weight_map.values()})
            for f in files:
                if not f.is_file():
                    raise ConversionError(f"{index}: names shard {f.name}, which is missing")
            return files
        files = sorted(self.folder.glob("*.safetensors"))
        if not files:
            raise ConversionError(f"{self.folder}: no *.safetensors files (only safetensors checkpoints are supported)")
        return files

    def _index_tensors(self) -> dict[str, SourceTensor]:
        tensors: dict[str, SourceTensor] = {}
        for path in self._shard_files():
            for name, rec in _read_header(path).items():
                if name in tensors:
                    raise ConversionError(f"{path}: tensor {name} also appears in {tensors[name].path.name}")
                tensors[name] = rec
        return tensors

    # ---- reads ----

    def _fd(self, path: Path) -> int:
        fd = self._fds.get(path)
        if fd is None:
            try:
                fd = self._fds[path] = os.open(path, os.O_RDONLY)
            except OSError as exc:
                raise ConversionError(f"{path}: cannot open: {exc.strerror}") from None
        return fd

    def read_bytes(self, t: SourceTensor, start: int, nbytes: int) -> bytearray:
        """`nbytes` raw bytes of `t` from byte `start` of its data."""
        buf = bytearray(nbytes)
        view, fd, pos, done = memoryview(buf), self._fd(t.path), t.offset + start, 0
        try:
            while done < nbytes:
                n = os.preadv(fd, [view[done:]], pos + done)
                if n == 0:
                    raise ConversionError(f"{t.path}: tensor {t.name}: file ends early (truncated?)")
                done += n
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, pos, nbytes, os.POSIX_FADV_DONTNEED)
        except OSError as exc:
            raise ConversionError(f"{t.path}: tensor {t.name}: read failed: {exc.strerror}") from None
        return buf

    def read_rows(self, name: str, first: int = 0, count: int | None = None) -> np.ndarray:
        """Rows [first, first+count) along the slowest dimension of tensor `name`, as float32
        with the remaining dimensions (e.g. one expert of a fused [E, R, C] tensor -> [R, C])."""
        t = self.tensors[name]
        rows = t.shape[0] if t.shape else 1
        count = rows - first if count is None else count
        row_elems = int(np.prod(t.shape[1:], dtype=np.int64)) if len(t.shape) > 1 else 1
        row_bytes = row_elems * t.itemsize
        raw = self.read_bytes(t, first * row_bytes, count * row_bytes)
        return _to_f32(raw, t.dtype).reshape((count, *t.shape[1:]) if t.shape else ())

    def read_slab(self, name: str, index: int, slab_shape: tuple[int, ...]) -> np.ndarray:
        """Slab `index` of tensor `name` seen as consecutive slabs of `slab_shape`, as float32."""
        t = self.tensors[name]
        slab = int(np.prod(slab_shape, dtype=np.int64)) * t.itemsize
        if (index + 1) * slab > t.nbytes:
            raise ConversionError(f"{t.path}: tensor {t.name}: slab {index} of {slab_shape} lies past its end")
        return _to_f32(self.read_bytes(t, index * slab, slab), t.dtype).reshape(slab_shape)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __enter__(self) -> "Checkpoint":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
