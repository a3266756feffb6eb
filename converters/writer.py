"""Streaming GGUF output: header, metadata and tensor table first, then tensor data piece by piece.

The file is written as `.NAME.PID.tmp` beside the target and renamed over it only once every byte
is written and flushed, so an interrupted, crashed or out-of-space conversion never leaves a
`.gguf` behind (and a later run removes the temporary files of dead runs).

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
def atomic_output(target: Path) -> Iterator[Path]:
    """Yield a temporary path beside `target`; rename it to `target` if the block succeeds, delete
    it otherwise (exceptions, Ctrl-C, SIGTERM)."""
    remove_stale_temps(target)
    tmp = temp_path(target)
    previous = signal.getsignal(signal.SIGTERM)

    def on_term(signum, frame):  # turn SIGTERM into an exception so the cleanup below runs
        raise KeyboardInterrupt(f"signal {signum}")

    in_main = threading.current_thread() is threading.main_thread()  # signal handlers live there
    if in_main:
        signal.signal(signal.SIGTERM, on_term)
    try:
        yield tmp
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous)


def _prefetched(pieces: list[Callable[[], np.ndarray]], pool: ThreadPoolExecutor) -> Iterator[np.ndarray]:
    """The pieces' values in order, reading piece i+1 while piece i is being encoded."""
    ahead = pool.submit(pieces[0]) if pieces else None
    for i in range(len(pieces)):
        values = ahead.result()
        ahead = pool.submit(pieces[i + 1]) if i + 1 < len(pieces) else None
        yield values


def write_data(w: gguf.GGUFWriter, planned: list[PlannedTensor], n_threads: int,
               on_progress: Callable[[int], None]) -> None:
    """Write every planned tensor's bytes in table order, each padded to the file's alignment.

    Call after write_ti_data_to_file: the data section starts at the next aligned offset."""
    fout = w.fout[0]
    w.write_padding(fout, fout.tell())
    data_start, offset = fout.tell(), 0
    with ThreadPoolExecutor(1, thread_name_prefix="strata-read") as pool:
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
    fout.flush()
    os.fsync(fout.fileno())
