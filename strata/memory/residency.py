"""Whether a model file's experts sit in the page cache: with whether they fit the RAM budget, what
settles the default expert memory of packed compute on the CPU (`strata.runtime.plan.default_memory_row`).

A file in the page cache is best read in place through its map (the `direct` memory), as llama.cpp
does: nothing is copied and nothing is read again. A file that is not is better read by the paged
memory's pager (large reads on several threads), and one that does not fit the RAM budget must be
(O_DIRECT, around the page cache, so the file's pages do not take the RAM its slots need).

The probe reads one page at each of `samples` offsets spread evenly over the experts' bytes with
`preadv(..., RWF_NOWAIT)`, which fails with EAGAIN instead of waiting for the disk when the page is
not cached (Linux 4.14 and later; ext4, xfs, btrfs, tmpfs). A few hundred reads of 4 KiB: well under
a millisecond for a cached file. A miss still starts the kernel's readahead from that page on, so
the offsets are probed from the last to the first: what a miss brings in has been probed already.
Must not: map the file, or read pages beyond the sampled ones (the readahead of misses aside).
"""
from __future__ import annotations

import os

from strata.gguf import PARTS, ModelFile

#: Pages probed per file: enough to see a file that is partly cached (each probe misses with the
#: share of the file not cached), few enough to cost nothing at load.
DEFAULT_SAMPLES = 256
PAGE = 4096


def expert_ranges(model_file: ModelFile) -> list[tuple[int, int]]:
    """[start, end) byte ranges of the model (its offsets, across split parts) holding the routed
    experts: one per expert layer and part (each part's experts are contiguous)."""
    out = []
    last = model_file.hparams.n_experts - 1
    for layer in model_file.expert_layers:
        for part in PARTS:
            first, end = model_file.expert(layer, 0, part), model_file.expert(layer, last, part)
            out.append((first.offset, end.offset + end.nbytes))
    return out


def sample_offsets(ranges: list[tuple[int, int]], samples: int) -> list[int]:
    """`samples` offsets spread evenly over the concatenated `ranges`."""
    total = sum(end - start for start, end in ranges)
    out, passed, i = [], 0, 0
    for start, end in ranges:
        while i < samples and (i + 0.5) * total / samples < passed + end - start:
            out.append(start + int((i + 0.5) * total / samples) - passed)
            i += 1
        passed += end - start
    return out


def resident_share(model_file: ModelFile, samples: int = DEFAULT_SAMPLES) -> float | None:
    """The share of sampled pages of the experts' bytes that are in the page cache (1.0: all of
    them), or None where this system cannot tell (no RWF_NOWAIT, or a file system that refuses it)."""
    flag = getattr(os, "RWF_NOWAIT", None)
    offsets = sample_offsets(expert_ranges(model_file), samples)
    if flag is None or not offsets:
        return None
    buf, found, fds = bytearray(PAGE), 0, {}
    try:
        for offset in reversed(offsets):  # a miss's readahead reaches only offsets probed before it
            part = model_file.part_of(offset)
            fd = fds.get(part.index)
            if fd is None:
                fd = fds[part.index] = os.open(part.path, os.O_RDONLY)
            try:
                found += os.preadv(fd, [buf], (offset - part.base) // PAGE * PAGE, flag) > 0
            except BlockingIOError:  # EAGAIN: the page is not cached
                pass
    except OSError:  # EOPNOTSUPP and the like: a file system that cannot say; the probe never fails a load
        return None
    finally:
        for fd in fds.values():
            os.close(fd)
    return found / len(offsets)


__all__ = ["DEFAULT_SAMPLES", "expert_ranges", "resident_share", "sample_offsets"]
