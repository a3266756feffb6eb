"""Hugging Face MoE checkpoints -> llama.cpp-compatible GGUF (`python -m strata.convert`).

Which architectures convert, and how they differ, is data in the registry (`strata.arch`: a
record per architecture, found by config.json's `architectures`); the machinery is shared
(`source`: checkpoint reading; `experts`: HF expert layouts; `base`: planning and checks;
`types`: ggml types; `tokenizer`; `writer`: streaming output). An architecture whose tensors
differ in form, not only in name (`deepseek2`'s split kv_b, `gpt_oss`'s transposed experts),
has a `Converter` subclass in a module named by its record's `converter`. `convert()` is the
whole pipeline.

Must not name an architecture: what differs between them is data in `strata.arch`.
"""
from __future__ import annotations

import contextlib
import importlib
import logging
import os
from pathlib import Path
from typing import Any, Callable

import gguf

from converters.base import Converter, PlannedTensor
from converters.calib import CalibOptions, apply_imatrix, check_calib_args, read_imatrix, run_calibration
from converters.source import Checkpoint, ConversionError
from converters.tokenizer import write_tokenizer
from converters.types import TypePolicy
from converters.writer import atomic_outputs, write_data
from strata import arch as archs
from strata import native
from strata.errors import StrataFormatError
from strata.gguf import match_expert_tensor
from strata.gguf.routing import add_routing_counts, load_routing_npz
from strata.gguf.split import open_part_files, part_paths

log = logging.getLogger("strata.convert")

__all__ = ["CalibOptions", "Checkpoint", "ConversionError", "Converter", "TypePolicy", "converter_for", "convert"]


def converter_for(ckpt: Checkpoint) -> Converter:
    """The converter for the registered architecture that takes the checkpoint's `architectures`
    (a multimodal one's text model: `Checkpoint.narrow_to_text`)."""
    names = ckpt.config.get("architectures") or []
    for name in names:
        arch = archs.for_hf(name)
        if arch is not None:
            if name in arch.hf_multimodal:
                _narrow_to_text(ckpt, name)
            cls = importlib.import_module(f"converters.{arch.converter}").CONVERTER if arch.converter else Converter
            return cls(ckpt, arch)
    known = ", ".join(archs.hf_names())
    raise ConversionError(f"{ckpt.folder / 'config.json'}: unsupported architecture "
                          f"{names[0] if names else '(none given)'}; supported: {known}")


def _narrow_to_text(ckpt: Checkpoint, hf_name: str) -> None:
    skipped = ckpt.narrow_to_text()
    towers = ", ".join(f"{prefix}.* ({n} tensor{'s' * (n > 1)})" for prefix, n in sorted(skipped.items()))
    log.warning("%s: %s: converting the language model only; skipped the vision tower: %s (llama.cpp's converter "
                "writes it to a separate mmproj file; Strata runs text only)", ckpt.folder, hf_name, towers or "none found")


def _write_metadata(w: gguf.GGUFWriter, conv: Converter, ckpt: Checkpoint, policy: TypePolicy,
                    name: str, tokenizer_pre: str | None) -> None:
    w.add_name(name)
    conv.write_metadata(w)
    w.add_file_type(policy.file_type)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    write_tokenizer(w, ckpt.folder, conv.hp.n_vocab, tokenizer_pre)


def _write_routing(w: gguf.GGUFWriter, npz: str | os.PathLike[str], planned: list[PlannedTensor],
                   n_experts: int, trunk_layers: int) -> None:
    """Routing statistics checked against the trunk's expert layers being written (not those of
    multi-token-prediction layers), then as metadata."""
    n_layers = len({m[1] for m in map(match_expert_tensor, (p.name for p in planned))
                    if m is not None and m[1] < trunk_layers})
    try:
        counts, tokens = load_routing_npz(npz, n_layers, n_experts)
    except StrataFormatError as exc:
        raise ConversionError(str(exc)) from None
    add_routing_counts(w, counts, tokens)


def convert(hf_dir: str | os.PathLike[str], out: str | os.PathLike[str], policy: TypePolicy | None = None, *,
            name: str | None = None, n_threads: int | None = None, tokenizer_pre: str | None = None,
            progress: Callable[[int], Any] | None = None,
            routing_stats: str | os.PathLike[str] | None = None,
            calib: CalibOptions | None = None,
            imatrix: str | os.PathLike[str] | None = None,
            split_max_size: int = 0) -> list[PlannedTensor]:
    """Convert checkpoint folder `hf_dir` into GGUF file `out`; returns the tensors written.

    `split_max_size` > 0: write parts of at most that many tensor bytes each (a larger tensor gets
    a part of its own) in llama.cpp's gguf-split layout, OUT-00001-of-0000N.gguf and so on, the
    metadata in the first (as llama.cpp's converter does; one part is written as `out` itself).

    `routing_stats`: an .npz file saved by `--save-routing` (counts [L, E] over the expert layers,
    tokens), embedded as `strata.routing.*` metadata for the tiered memory's initial placement.

    `calib`: GPTQ over a calibration text, layer by layer (`converters.calib`); it records the routing
    it sees as `strata.routing.*`. `imatrix`: an importance matrix file (llama.cpp's GGUF or legacy
    format) for importance-weighted rounding. At most one of the two.

    `progress(total_source_bytes)` may return a progress bar (an object with `update(n_bytes)`
    and `close()`, e.g. tqdm's). Raises ConversionError (and writes nothing) for any problem
    with the input or the output."""
    policy = policy or TypePolicy()
    target = Path(out)
    if not target.parent.is_dir():
        raise ConversionError(f"{target}: output directory {target.parent} does not exist")
    if split_max_size < 0:
        raise ConversionError(f"{target}: split_max_size must be >= 0 bytes (0: one file), found {split_max_size}")
    n_threads = n_threads or native.default_threads()
    check_calib_args(calib, imatrix, routing_stats)
    with Checkpoint(hf_dir) as ckpt, contextlib.ExitStack() as cleanup:
        conv = converter_for(ckpt)
        planned = conv.plan(policy)
        w = gguf.GGUFWriter(None, conv.arch.name, split_max_size=split_max_size)
        _write_metadata(w, conv, ckpt, policy, name or Path(hf_dir).resolve().name, tokenizer_pre)
        if routing_stats is not None:
            _write_routing(w, routing_stats, planned, conv.hp.n_experts, conv.hp.n_layers)
        if imatrix is not None:
            apply_imatrix(planned, read_imatrix(imatrix), n_threads)
        if calib is not None:
            counts, tokens = run_calibration(conv, w, planned, calib, target, n_threads, cleanup)
            add_routing_counts(w, counts, tokens)
        for p in planned:
            w.add_tensor_info(p.name, p.shape, gguf.np.dtype(gguf.np.float32), p.nbytes, raw_dtype=p.ggml_type)
        total = sum(p.src_bytes for p in planned)
        bar = progress(total) if progress else None
        targets = part_paths(target, len(w.tensors))
        with atomic_outputs(targets) as tmps:
            try:
                open_part_files(w, tmps)
                w.write_header_to_file()
                w.write_kv_data_to_file()
                w.write_ti_data_to_file()
                write_data(w, planned, n_threads, bar.update if bar else lambda n: None)
            except OSError as exc:
                raise ConversionError(f"{target}: write failed: {exc.strerror or exc}") from None
            finally:
                w.close()
                if bar:
                    bar.close()
    log.info("wrote %s: %d tensors%s", targets[0], len(planned), f" in {len(targets)} parts" if len(targets) > 1 else "")
    return planned
