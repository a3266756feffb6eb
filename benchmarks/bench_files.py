"""The synthetic GGUF files the benchmarks share, cached in a work folder: a SHAPES file written
on first use (its name carries a hash of the shape), BASE@FTYPE requantized by llama.cpp's own
quantizer with an importance matrix of ones, plus the fixed prompt and the O_DIRECT cold copy the
out-of-RAM runs start from, and the options of a benchmark's measured child process. Used by
packed_vs_llama.py, expert_parallel.py, standin_budgets.py and ladder_cgroup.py."""
from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.packed_vs_llama_report import human_size  # noqa: E402
from benchmarks.synthetic_moe import SHAPES, write, write_converted  # noqa: E402
from tests.interop.llama_quantize import llama_quantize  # noqa: E402


def model_file(workdir: Path, shape: str) -> Path:
    """The cached file of `shape` (written on first use); its name carries a hash of the shape."""
    spec = SHAPES[shape]
    digest = hashlib.sha1(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:8]
    path = workdir / f"{shape}-{digest}.gguf"
    if not path.exists():
        workdir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".partial")
        t0 = time.perf_counter()
        (write_converted if "fixture" in spec else write)(tmp, **spec)
        tmp.rename(path)
        print(f"wrote {path} ({human_size(path.stat().st_size)}) in {time.perf_counter() - t0:.0f} s",
              file=sys.stderr)
    return path


def shape_file(workdir: Path, shape: str) -> Path:
    """The cached file of `shape`: a SHAPES name, or BASE@FTYPE (BASE requantized by llama.cpp)."""
    base, _, ftype = shape.partition("@")
    src = model_file(workdir, base)
    if not ftype:
        return src
    path = src.with_name(f"{src.stem}-{ftype}.gguf")
    if not path.exists():
        tmp = path.with_suffix(".partial")
        t0 = time.perf_counter()
        llama_quantize(src, tmp, ftype, imatrix=ones_imatrix(src), allow_requantize=True)
        tmp.rename(path)
        print(f"wrote {path} ({human_size(path.stat().st_size)}) in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return path


def ones_imatrix(src: Path) -> dict:
    """An importance matrix of ones for every weight matrix of `src`: per tensor name, float32
    [n_experts * K] (llama.cpp's layout: one row of K importances per expert; K = ne[0])."""
    import numpy as np
    from gguf import GGUFReader

    out = {}
    for t in GGUFReader(src).tensors:
        shape = [int(x) for x in t.shape]  # ggml order: K first
        if len(shape) >= 2 and t.name.endswith(".weight"):
            out[t.name] = np.ones(shape[0] * (shape[2] if len(shape) > 2 else 1), dtype=np.float32)
    return out


def file_types(path: Path) -> dict[str, float]:
    """Share of the file's tensor bytes per ggml type name, largest first."""
    from gguf import GGUFReader

    sizes: dict[str, int] = {}
    for t in GGUFReader(path).tensors:
        sizes[t.tensor_type.name] = sizes.get(t.tensor_type.name, 0) + int(t.n_bytes)
    total = sum(sizes.values()) or 1
    return {k: v / total for k, v in sorted(sizes.items(), key=lambda kv: -kv[1])}


def prompt_ids(n: int) -> list[int]:
    """`n` fixed pseudo-random ordinary tokens (the synthetic vocabulary's bytes and one merge)."""
    import numpy as np

    return np.random.default_rng(1234).integers(0, 257, n).tolist()


def cold_copy(src: Path, dst: Path) -> float:
    """Copy `src` to `dst` with O_DIRECT on both sides (no page of `dst` cached); seconds taken."""
    t0 = time.perf_counter()
    subprocess.run(["dd", f"if={src}", f"of={dst}", "bs=8M", "iflag=direct", "oflag=direct", "status=none"],
                   check=True)
    return time.perf_counter() - t0


def add_child_args(p: argparse.ArgumentParser) -> None:
    """The hidden options of a benchmark run again as its own child process (one measured engine in
    its own process and memory cgroup): --child, the --file, its --memory and --host-mem bytes."""
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--file", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--memory", default="paged", help=argparse.SUPPRESS)
    p.add_argument("--host-mem", type=int, default=0, help=argparse.SUPPRESS)


def child_load_args(a: argparse.Namespace, n_ctx: int) -> dict:
    """`strata.load`'s keywords in a child: one sequence, no prefix cache, --memory (paged: with
    --host-mem bytes)."""
    kwargs = dict(threads=a.threads, n_ctx=n_ctx, max_batch=1, prefix_cache=False, memory=a.memory)
    if a.memory == "paged":
        kwargs["host_mem"] = a.host_mem
    return kwargs
