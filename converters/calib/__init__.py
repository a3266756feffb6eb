"""Calibrated quantization for the converter: GPTQ from a calibration text (`--calib`) and
importance matrices (`--imatrix`, llama.cpp's formats, read and written).

`gptq`: the column-by-column quantization; `runner`: Strata's own layers run one at a time,
recording each matrix's input Hessian; `pipeline`: the layer loop and the imatrix path;
`imatrix`: the file formats; `collect`: an importance matrix from a GGUF model (`strata imatrix`).
`run_calibration` is what `converters.convert` calls.

Must not: parse command lines or write the GGUF file.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from converters.base import Converter, PlannedTensor
from converters.calib.imatrix import Imatrix, read_imatrix, write_imatrix
from converters.calib.pipeline import Spill, apply_imatrix, calibrate, check_calib_args, min_tokens
from converters.source import ConversionError
from strata.gguf.hparams import read_hparams

#: Calibration defaults: tokens used, and the sequence length they are cut into.
DEFAULT_CALIB_TOKENS = 8192
DEFAULT_CALIB_CTX = 512


@dataclass(frozen=True)
class CalibOptions:
    """`--calib TEXT_FILE [--calib-tokens N] [--calib-ctx C]`."""
    text_file: str
    n_tokens: int = DEFAULT_CALIB_TOKENS
    n_ctx: int = DEFAULT_CALIB_CTX
    progress: bool = True


def calibration_tokens(folder: Path, opts: CalibOptions, n_ctx_max: int) -> tuple[list[int], int]:
    """The first `opts.n_tokens` tokens of the text (the checkpoint's tokenizer) and the sequence length."""
    try:
        text = Path(opts.text_file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConversionError(f"--calib {opts.text_file}: cannot read: {exc}") from None
    if (folder / "tokenizer.json").is_file():
        from tokenizers import Tokenizer
        ids = Tokenizer.from_file(str(folder / "tokenizer.json")).encode(text, add_special_tokens=False).ids
    else:
        from transformers import AutoTokenizer
        ids = AutoTokenizer.from_pretrained(str(folder)).encode(text, add_special_tokens=False)
    n_ctx = max(1, min(opts.n_ctx, n_ctx_max))
    ids = ids[:opts.n_tokens]
    if len(ids) < n_ctx // 2 or not ids:
        raise ConversionError(f"--calib {opts.text_file}: {len(ids)} tokens, too few to calibrate "
                              f"(at least {max(1, n_ctx // 2)})")
    return ids, n_ctx


def run_calibration(conv: Converter, w: gguf.GGUFWriter, planned: list[PlannedTensor], opts: CalibOptions,
                    target: Path, n_threads: int, cleanup: contextlib.ExitStack) -> tuple[np.ndarray, int]:
    """GPTQ the planned tensors (their pieces then read the spill file, removed by `cleanup`).
    Returns (routing counts [expert layers, E], tokens)."""
    from strata import arch as archs

    metadata = {k: v.value for k, v in w.kv_data[0].items()}
    hp = read_hparams(conv.ckpt.folder, metadata, {p.name: p.shape for p in planned})
    arch = archs.get(conv.arch.name)
    if arch is None or not arch.runs:
        raise ConversionError(f"--calib: architecture {conv.arch.name} has no Strata model code to calibrate with")
    tokens, n_ctx = calibration_tokens(conv.ckpt.folder, opts, hp.context_length)
    spill = Spill(target)
    cleanup.callback(spill.close)
    counts, _ = calibrate(planned, arch, hp, tokens, n_ctx, spill, n_threads, opts.progress)
    return counts, len(tokens)


__all__ = ["CalibOptions", "DEFAULT_CALIB_CTX", "DEFAULT_CALIB_TOKENS", "Imatrix", "apply_imatrix", "calibrate",
           "check_calib_args", "min_tokens", "read_imatrix", "run_calibration", "write_imatrix"]
