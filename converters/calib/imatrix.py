"""Importance matrices in llama.cpp's two formats (`llama-imatrix`), read and written.

GGUF (current): general.type = "imatrix", `imatrix.datasets` [str], `imatrix.chunk_count`,
`imatrix.chunk_size` (u32), and per weight tensor NAME two float32 tensors: `NAME.in_sum2`
[nmat, K] (sums over tokens of each input value squared; nmat = experts for a 3-D expert tensor,
else 1) and `NAME.counts` [nmat, 1] (tokens summed). Legacy binary (little-endian): i32 entries;
per entry i32 name length, name, i32 ncall, i32 nval, f32[nval] (the mean of squares times
ncall, expert rows back to back); then i32 chunk count, i32 length and the dataset name.
Tensor names are the GGUF file's (`blk.N.attn_q.weight`, `blk.N.ffn_up_exps.weight`), which is
what the converter plans under, so entries apply to the HF tensors behind each planned tensor.

Must not: run a model (strata.commands.imatrix and converters.calib.collect do).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from converters.source import ConversionError

SUM2, COUNTS = ".in_sum2", ".counts"
KEY_DATASETS, KEY_CHUNK_COUNT, KEY_CHUNK_SIZE = "imatrix.datasets", "imatrix.chunk_count", "imatrix.chunk_size"


@dataclass
class Imatrix:
    """Per tensor name: sums of squared inputs [nmat, K] (legacy: flat, shaped on use) and counts [nmat]."""
    path: Path
    sums: dict[str, np.ndarray] = field(default_factory=dict)
    counts: dict[str, np.ndarray] = field(default_factory=dict)
    datasets: list[str] = field(default_factory=list)
    chunk_count: int = 0
    chunk_size: int = 0

    def importance(self, name: str, shape: tuple[int, ...]) -> np.ndarray | None:
        """Mean squared input per column [nmat, K] for tensor `name` of row-major `shape`
        (nmat = shape[0] for a 3-D tensor, else 1); None when the matrix has no entry."""
        if name not in self.sums:
            return None
        K, nmat = shape[-1], (shape[0] if len(shape) == 3 else 1)
        sums, counts = self.sums[name].astype(np.float64), self.counts[name].astype(np.float64).reshape(-1)
        if sums.size % K:
            raise ConversionError(f"{self.path}: tensor {name}: {sums.size} importances, not whole rows of {K} "
                                  f"(the model's {name} has rows of {K} values)")
        sums = sums.reshape(-1, K)
        if sums.shape[0] not in (1, nmat) or counts.size not in (1, sums.shape[0]):
            raise ConversionError(f"{self.path}: tensor {name}: importances for {sums.shape[0]} matrices with "
                                  f"{counts.size} counts; the model's {name} has {nmat}")
        if not (np.isfinite(sums).all() and np.isfinite(counts).all()) or (sums < 0).any() or (counts < 0).any():
            raise ConversionError(f"{self.path}: tensor {name}: importances and counts must be finite and >= 0")
        counts = np.broadcast_to(counts, (sums.shape[0],))
        seen = counts > 0
        if not seen.any():
            return None
        mean = np.where(seen[:, None], sums / np.where(seen, counts, 1)[:, None], 0.0)
        mean[~seen] = mean[seen].mean(0)  # experts never routed to: the layer's average
        return np.broadcast_to(mean, (nmat, K)).astype(np.float32)


def read_imatrix(path: str | Path) -> Imatrix:
    """An importance matrix in either format (told apart by the GGUF magic)."""
    path = Path(path)
    try:
        head = path.open("rb").read(4)
    except OSError as exc:
        raise ConversionError(f"--imatrix {path}: cannot read: {exc.strerror or exc}") from None
    return _read_gguf(path) if head == b"GGUF" else _read_legacy(path)


def _read_gguf(path: Path) -> Imatrix:
    import gguf
    try:
        r = gguf.GGUFReader(path)
    except (ValueError, OSError) as exc:
        raise ConversionError(f"--imatrix {path}: not a readable GGUF file: {exc}") from None
    kind = r.fields.get("general.type")
    if kind is None or kind.contents() != "imatrix":
        raise ConversionError(f"--imatrix {path}: a GGUF file, but general.type is "
                              f"{kind.contents() if kind else 'missing'!r}, not 'imatrix'")
    out = Imatrix(path)
    if (f := r.fields.get(KEY_DATASETS)) is not None:
        out.datasets = list(f.contents())
    out.chunk_count = int(r.fields[KEY_CHUNK_COUNT].contents()) if KEY_CHUNK_COUNT in r.fields else 0
    out.chunk_size = int(r.fields[KEY_CHUNK_SIZE].contents()) if KEY_CHUNK_SIZE in r.fields else 0
    tensors = {t.name: t for t in r.tensors}
    for name, t in tensors.items():
        if not name.endswith(SUM2):
            continue
        base = name[:-len(SUM2)]
        c = tensors.get(base + COUNTS)
        if c is None:
            raise ConversionError(f"--imatrix {path}: tensor {name} has no {base + COUNTS}")
        if t.tensor_type != gguf.GGMLQuantizationType.F32 or c.tensor_type != gguf.GGMLQuantizationType.F32:
            raise ConversionError(f"--imatrix {path}: tensor {base}: expected F32 sums and counts, found "
                                  f"{t.tensor_type.name} and {c.tensor_type.name}")
        out.sums[base] = np.array(t.data, dtype=np.float32).reshape(-1, int(t.shape[0]))
        out.counts[base] = np.array(c.data, dtype=np.float32).reshape(-1)
    return out


def _read_legacy(path: Path) -> Imatrix:
    data = path.read_bytes()
    out, pos = Imatrix(path), 0

    def take(fmt: str, what: str):
        nonlocal pos
        size = struct.calcsize(fmt)
        if pos + size > len(data):
            raise ConversionError(f"--imatrix {path}: not an imatrix file (GGUF or legacy): ends inside {what} "
                                  f"at byte {pos}")
        vals = struct.unpack_from(fmt, data, pos)
        pos += size
        return vals

    (n_entries,) = take("<i", "the entry count")
    if not 0 < n_entries < 1 << 20:
        raise ConversionError(f"--imatrix {path}: not an imatrix file (GGUF or legacy): {n_entries} entries")
    for i in range(n_entries):
        (length,) = take("<i", f"entry {i}'s name length")
        if not 0 < length < 4096:
            raise ConversionError(f"--imatrix {path}: entry {i}: bad name length {length}")
        name = bytes(take(f"<{length}s", f"entry {i}'s name")[0]).decode("utf-8", "replace")
        ncall, nval = take("<ii", f"tensor {name}'s counts")
        if nval < 0 or ncall < 0:
            raise ConversionError(f"--imatrix {path}: tensor {name}: negative counts ({ncall} calls, {nval} values)")
        out.sums[name] = np.array(take(f"<{nval}f", f"tensor {name}'s {nval} values"), dtype=np.float32)
        out.counts[name] = np.array([max(ncall, 1)], dtype=np.float32)  # values are means x ncall
    if pos + 4 <= len(data):
        (out.chunk_count,) = take("<i", "the chunk count")
        if pos + 4 <= len(data):
            (length,) = take("<i", "the dataset name length")
            if 0 <= length <= len(data) - pos:
                out.datasets = [data[pos:pos + length].decode("utf-8", "replace")]
    return out


def write_imatrix(path: str | Path, sums: dict[str, np.ndarray], counts: dict[str, np.ndarray],
                  datasets: list[str], chunk_count: int, chunk_size: int) -> None:
    """An importance matrix in llama.cpp's GGUF format; `sums[name]` [nmat, K], `counts[name]` [nmat]."""
    import gguf
    w = gguf.GGUFWriter(str(path), "imatrix")
    try:
        w.add_type("imatrix")
        w.add_array(KEY_DATASETS, list(datasets))
        w.add_uint32(KEY_CHUNK_COUNT, int(chunk_count))
        w.add_uint32(KEY_CHUNK_SIZE, int(chunk_size))
        for name in sorted(sums):
            s = np.ascontiguousarray(sums[name], dtype=np.float32).reshape(-1, sums[name].shape[-1])
            w.add_tensor(name + SUM2, s)
            w.add_tensor(name + COUNTS, np.ascontiguousarray(counts[name], dtype=np.float32).reshape(-1, 1))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
    finally:
        w.close()


__all__ = ["Imatrix", "read_imatrix", "write_imatrix"]
