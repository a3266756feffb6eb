"""Write a model's miss stand-ins to the sidecar beside it (`MODEL.standins.gguf`, see
`strata.gguf.standins`): every routed expert of the GGUF model dequantized and quantized into a
low-bit type, expert by expert, the same bytes the paged memory would build at load.

    write_stand_ins("model.gguf", "q2_k")     # -> model.standins.gguf

The sidecar is written through a temporary name (an interrupted run leaves no file). The model
file is only read: llama.cpp refuses a model holding tensors it does not create, so the copies
never go inside it.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import gguf
import numpy as np

from converters.writer import atomic_output
from strata.gguf import PARTS, open_model
from strata.gguf.split import open_part_files
from strata.gguf.standins import (STAND_INS_ARCH, STAND_INS_SOURCE_BYTES, STAND_INS_TYPE, source_bytes,
                                  stand_in_tensor_name, stand_ins_path)
from strata.memory.standin import check_rows, requantized, stand_in_type
from strata.quant import row_bytes


def write_stand_ins(model_path: str | os.PathLike[str], t: str, *, n_threads: int | None = None,
                    progress: Callable[[int, int], None] | None = None) -> Path:
    """Write the stand-ins of type `t` ('q2_k') of the model at `model_path` beside it; returns the
    sidecar's path. `progress(tensors done, tensors)` after each tensor."""
    t = stand_in_type(t)
    n_threads = n_threads or os.cpu_count() or 1
    with open_model(model_path) as mf:
        target = stand_ins_path(mf.path)
        w = gguf.GGUFWriter(None, STAND_INS_ARCH)
        w.add_string(STAND_INS_TYPE, t.name)
        w.add_uint64(STAND_INS_SOURCE_BYTES, source_bytes(mf))
        tensors = []
        for layer in mf.expert_layers:
            for part in PARTS:
                n_rows, row_len = check_rows(mf, t, layer, part)
                shape = (mf.hparams.n_experts, n_rows, row_len)
                nbytes = mf.hparams.n_experts * n_rows * row_bytes(t, row_len)
                w.add_tensor_info(stand_in_tensor_name(layer, part), shape, np.dtype(np.float32), nbytes, raw_dtype=t)
                tensors.append((layer, part, nbytes))
        with atomic_output(target) as tmp:
            open_part_files(w, [tmp])
            try:
                w.write_header_to_file()
                w.write_kv_data_to_file()
                w.write_ti_data_to_file()
                _write_data(w, mf, t, tensors, n_threads, progress)
            finally:
                w.close()
    return target


def _write_data(w: gguf.GGUFWriter, mf, t, tensors: list[tuple[int, str, int]], n_threads: int,
                progress: Callable[[int, int], None] | None) -> None:
    fout = w.fout[0]
    w.write_padding(fout, fout.tell())
    for i, (layer, part, nbytes) in enumerate(tensors):
        written = 0
        for data in requantized(mf, t, layer, part, n_threads):
            fout.write(memoryview(np.ascontiguousarray(data)).cast("B"))
            written += data.nbytes
        assert written == nbytes, f"{stand_in_tensor_name(layer, part)}: {written} bytes, the table says {nbytes}"
        w.write_padding(fout, written)
        if progress is not None:
            progress(i + 1, len(tensors))
    fout.flush()
    os.fsync(fout.fileno())


__all__ = ["write_stand_ins"]
