"""Streaming GGUF output: header, metadata and tensor table first, then tensor data piece by piece.

Each file is written as `.NAME.PID.tmp` beside its target and renamed over it only once every byte
of every file is written and flushed, so an interrupted, crashed or out-of-space conversion never
leaves a `.gguf` behind (and a later run removes the temporary files of dead runs). A split output
(`--split-max-size`) is several such files in llama.cpp's gguf-split layout, renamed together at
the end.

Must not choose names, types or shapes: the planned tensors arrive complete.
"""
from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import gguf
import numpy as np

from converters.base import PlannedTensor
from converters.source import ConversionError
from converters.types import encode
from strata.units import round_up


def temp_path(target: Path) -> Path:
    return target.with_name(f".{target.name}.{os.getpid()}.tmp")


def remove_stale_temps(target: Path) -> None:
    """Delete temporary files of earlier runs for `target` whose process is gone."""
    for p in target.parent.glob(f".{target.name}.*.tmp"):
        try:
            pid = int(p.name.rsplit(".", 2)[-2])
            os.kill(pid, 0)
        except ValueError:
            continue
        except ProcessLookupError:
            p.unlink(missing_ok=True)
        except PermissionError:  # alive, someone else's
            continue


@contextlib.contextmanager
def atomic_outputs(targets: list[Path]) -> Iterator[list[Path]]:
    """Yield a temporary path beside each target; rename them all to their targets if the block
    succeeds, delete them otherwise (exceptions, Ctrl-C, SIGTERM)."""
    for target in targets:
        remove_stale_temps(target)
    tmps = [temp_path(target) for target in targets]
    previous = signal.getsignal(signal.SIGTERM)

    def on_term(signum, frame):  # turn SIGTERM into an exception so the cleanup below runs
        raise KeyboardInterrupt(f"signal {signum}")

    in_main = threading.current_thread() is threading.main_thread()  # signal handlers live there
    if in_main:
        signal.signal(signal.SIGTERM, on_term)
    try:
        yield tmps
        for tmp, target in zip(tmps, targets):
            os.replace(tmp, target)
    except BaseException:
        for tmp in tmps:
            tmp.unlink(missing_ok=True)
        raise
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def atomic_output(target: Path) -> Iterator[Path]:
    """atomic_outputs for one file."""
    with atomic_outputs([target]) as tmps:
        yield tmps[0]


def _prefetched(pieces: list[Callable[[], np.ndarray]], pool: ThreadPoolExecutor) -> Iterator[np.ndarray]:
    """The pieces' values in order, reading piece i+1 while piece i is being encoded."""
    ahead = pool.submit(pieces[0]) if pieces else None
    for i in range(len(pieces)):
        values = ahead.result()
        ahead = pool.submit(pieces[i + 1]) if i + 1 < len(pieces) else None
        yield values


def write_data(w: gguf.GGUFWriter, planned: list[PlannedTensor], n_threads: int,
               on_progress: Callable[[int], None]) -> None:
    """Write every planned tensor's bytes in table order, each padded to the file's alignment, into
    the part of the output that holds it (`w.tensors`: one dict of names per part).

    Call after write_ti_data_to_file: each data section starts at the next aligned offset."""
    by_name = {p.name: p for p in planned}
    with ThreadPoolExecutor(1, thread_name_prefix="strata-read") as pool:
        for fout, names in zip(w.fout, w.tensors):
            _write_part(w, fout, [by_name[name] for name in names], pool, n_threads, on_progress)
    for fout in w.fout:
        fout.flush()
        os.fsync(fout.fileno())


def _write_part(w: gguf.GGUFWriter, fout, planned: list[PlannedTensor], pool: ThreadPoolExecutor, n_threads: int,
                on_progress: Callable[[int], None]) -> None:
    w.write_padding(fout, fout.tell())
    data_start, offset = fout.tell(), 0
    for p in planned:
        assert fout.tell() == data_start + offset, f"{p.name}: data would land at the wrong offset"
        written, per_piece = 0, p.src_bytes / max(1, len(p.pieces))
        for values in _prefetched(p.pieces, pool):
            # uint8 pieces are already blocks of p.ggml_type (MXFP4 sources kept as they are)
            data = values if values.dtype == np.uint8 else encode(values, p.ggml_type, n_threads)
            fout.write(memoryview(np.ascontiguousarray(data)).cast("B"))
            written += data.nbytes
            on_progress(int(per_piece))
        if written != p.nbytes:
            raise ConversionError(f"internal: {p.name} produced {written} bytes, its table entry says {p.nbytes}")
        w.write_padding(fout, written)
        offset += round_up(written, w.data_alignment)
