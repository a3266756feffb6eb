"""A Hugging Face checkpoint folder, read lazily: config, tensor index, byte-range reads.

Safetensors files are parsed here (an 8-byte header length, a JSON header, then raw data) and
read with `pread` into fresh buffers instead of being memory-mapped, so the converter's memory is
what it asks for, whatever the checkpoint's size, and it runs under an address-space limit.
Pages just read are dropped from the page cache (`POSIX_FADV_DONTNEED`) so a conversion does not
evict the rest of the machine's cache.

fp8 block-scaled checkpoints (DeepSeek-V3's release: `quantization_config.quant_method` "fp8"):
an F8_E4M3 `X.weight` [N, K] with a float `X.weight_scale_inv` [ceil(N/b0), ceil(K/b1)] (b = the
config's `weight_block_size`, 128 x 128) reads as its values times the scale of each element's
block; the scales leave `tensors`, so the converters see float weights.

Multimodal checkpoints (a language model beside a vision tower: config.json's `text_config` and
`vision_config`, weights `model.language_model.*` / `language_model.model.*` beside `model.visual.*`,
`vision_model.*`, `multi_modal_projector.*`) are read as their text model by `narrow_to_text`, as
llama.cpp's converter reads them: the config is the top level overlaid by `text_config`, the
`language_model` component leaves every name, and the towers' tensors are dropped (llama.cpp
writes them to a separate mmproj file).

Must not memory-map a checkpoint or know GGUF names and types: it hands out bytes and values.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from strata.errors import StrataError


class ConversionError(StrataError):
    """The checkpoint cannot be converted; the message names the file/tensor and the problem."""


#: Source dtypes the converter reads, with their element size.
DTYPES: dict[str, int] = {"F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "U8": 1}  # U8: packed blocks, raw reads
_SCALE = ".weight_scale_inv"  # fp8 block scales (multipliers, despite the name) of `X.weight`

_MAX_HEADER = 100 << 20  # a safetensors header larger than this is corrupt, not big

#: A multimodal checkpoint's modules that are not its language model (group 1 names the tower).
_TOWER = re.compile(r"^((?:model\.)?(?:visual|vision_tower|vision_model|multi_modal_projector|audio_tower))\.")
_LANGUAGE = "language_model"  # the name component holding the language model in a multimodal checkpoint


@dataclass(frozen=True)
class SourceTensor:
    """One tensor of one safetensors file: where its bytes are and what they mean."""
    name: str
    path: Path
    dtype: str               # 'F32' | 'F16' | 'BF16' | 'F8_E4M3' | 'U8'
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


def _e4m3_table() -> np.ndarray:
    """float32 value of each F8_E4M3 (fn: no infinities, S.1111.111 is NaN) byte."""
    b = np.arange(256, dtype=np.int64)
    exp, mant = (b >> 3) & 15, (b & 7).astype(np.float64)
    mag = np.where(exp == 0, mant / 8 * 2.0 ** -6, (1 + mant / 8) * 2.0 ** (exp - 7))
    mag[(exp == 15) & (mant == 7)] = np.nan
    return np.where(b >> 7, -mag, mag).astype(np.float32)


_E4M3 = _e4m3_table()


def _to_f32(raw: bytearray, dtype: str) -> np.ndarray:
    """Bytes of `dtype` -> float32 (exact for every source dtype)."""
    if dtype == "F8_E4M3":
        return _E4M3[np.frombuffer(raw, dtype=np.uint8)]
    if dtype == "U8":
        raise ConversionError("internal: U8 tensors (packed blocks) are read as bytes, not as values")
    if dtype == "F32":
        return np.frombuffer(raw, dtype="<f4")
    if dtype == "F16":
        return np.frombuffer(raw, dtype="<f2").astype(np.float32)
    # bfloat16 is the top half of a float32.
    return (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)


def _text_name(name: str) -> str:
    """`name` without its `language_model` component (model.language_model.layers.0... and
    language_model.model.layers.0... -> model.layers.0...)."""
    parts = name.split(".")
    if _LANGUAGE in parts:
        parts.remove(_LANGUAGE)  # the first one only
    return ".".join(parts)


class Checkpoint:
    """A checkpoint folder: `config`, `tensors` (name -> SourceTensor) and float32 reads."""

    def __init__(self, folder: str | os.PathLike[str]):
        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise ConversionError(f"{self.folder}: not a directory")
        self.config = self._load_config()
        self.tensors = self._index_tensors()
        self._fds: dict[Path, int] = {}
        self.scales: dict[str, SourceTensor] = {}  # fp8 weight name -> its block scales
        self.block = self._fp8_scales()

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

    def _fp8_scales(self) -> tuple[int, int]:
        """Pair each F8_E4M3 weight with its `weight_scale_inv` (removed from `tensors`); the block shape."""
        qc = self.config.get("quantization_config") or {}
        block = tuple(int(b) for b in (qc.get("weight_block_size") or (128, 128)))
        for name in [n for n in self.tensors if n.endswith(_SCALE)]:
            scale, weight = self.tensors.pop(name), name[: -len(_SCALE)] + ".weight"
            t = self.tensors.get(weight)
            if t is None or t.dtype != "F8_E4M3":
                raise ConversionError(f"{scale.path}: tensor {name}: scales for {weight}, which is "
                                      f"{'missing' if t is None else t.dtype + ', not F8_E4M3'}")
            want = tuple(-(-d // b) for d, b in zip(t.shape, block))
            if len(t.shape) != 2 or len(block) != 2 or scale.shape != want or scale.dtype == "F8_E4M3":
                raise ConversionError(f"{scale.path}: tensor {name}: shape {list(scale.shape)} {scale.dtype}; expected "
                                      f"float scales {list(want)} of {list(block)} blocks of {weight} {list(t.shape)}")
            self.scales[weight] = scale
        unscaled = [n for n, t in self.tensors.items() if t.dtype == "F8_E4M3" and n not in self.scales]
        if unscaled:
            raise ConversionError(f"{self.folder}: F8_E4M3 tensor {unscaled[0]} has no {_SCALE[1:]} "
                                  f"(only block-scaled fp8 checkpoints are supported)")
        return block

    def _scaled(self, name: str, first: int, values: np.ndarray) -> np.ndarray:
        """fp8 rows [first, first + len(values)) of weight `name` times their blocks' scales."""
        scale = self.scales.get(name)
        if scale is None:
            return values
        b0, b1 = self.block
        s = _to_f32(self.read_bytes(scale, 0, scale.nbytes), scale.dtype).reshape(scale.shape)
        rows = np.arange(first, first + values.shape[0]) // b0
        return values * np.repeat(s[rows], b1, axis=1)[:, : values.shape[1]]

    # ---- multimodal ----

    def narrow_to_text(self) -> dict[str, int]:
        """Read this multimodal checkpoint as its text model from now on (see the module docstring;
        `tensors` are named, in reads and errors, as the text model names them); returns the number
        of tower tensors dropped, by tower prefix (e.g. {'model.visual': 19})."""
        path, text = self.folder / "config.json", self.config.get("text_config")
        if not isinstance(text, dict):
            raise ConversionError(f"{path}: {self.config.get('architectures', ['?'])[0]} needs a text_config object "
                                  f"(the language model's settings), found {'none' if text is None else type(text).__name__}")
        top = {k: v for k, v in self.config.items() if k not in ("text_config", "vision_config")}
        self.config = {**top, **text, "architectures": self.config.get("architectures")}
        skipped: dict[str, int] = {}
        tensors: dict[str, SourceTensor] = {}
        stored: dict[str, str] = {}  # text model's name -> the checkpoint's
        for name, t in self.tensors.items():
            if m := _TOWER.match(name):
                skipped[m.group(1)] = skipped.get(m.group(1), 0) + 1
                continue
            text_name = _text_name(name)
            if text_name in tensors:
                raise ConversionError(f"{t.path}: tensor {name} is the language model's {text_name}, "
                                      f"as is {stored[text_name]}")
            tensors[text_name], stored[text_name] = dataclasses.replace(t, name=text_name), name
        self.tensors = tensors
        self.scales = {_text_name(n): s for n, s in self.scales.items() if not _TOWER.match(n)}
        return skipped

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
        return self._scaled(name, first, _to_f32(raw, t.dtype).reshape((count, *t.shape[1:]) if t.shape else ()))

    def read_slab(self, name: str, index: int, slab_shape: tuple[int, ...]) -> np.ndarray:
        """Slab `index` of tensor `name` seen as consecutive slabs of `slab_shape`, as float32."""
        t = self.tensors[name]
        if name in self.scales:  # a 2-D fp8 weight: slabs of whole rows
            rows = int(np.prod(slab_shape, dtype=np.int64)) // t.shape[1]
            if rows * t.shape[1] != int(np.prod(slab_shape, dtype=np.int64)):
                raise ConversionError(f"{t.path}: tensor {t.name}: slabs of {slab_shape} are not whole fp8 rows")
            return self.read_rows(name, index * rows, rows).reshape(slab_shape)
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
