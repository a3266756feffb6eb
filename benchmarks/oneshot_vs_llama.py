"""Benchmark: a user's one-shot run, end to end: `strata generate` as a fresh process against
llama.cpp (llama-cpp-python) as a fresh process, on the same prompt tokens, the model file in the
page cache.

    python benchmarks/oneshot_vs_llama.py [FILE] [--rounds 5] [--prompt 208] [-n 32] [--threads 2]
        [--strata NAME=ARGS ...] [--tree NAME=DIR ...] [--workdir /tmp/strata-bench] [--json]

Without FILE it makes (once, cached in --workdir) the "medium" synthetic file (qwen3moe-shaped, 24
layers, 64 experts top-8, Q4_0 experts, 1.4 GB; benchmarks/bench_files.py). It reads the whole file
once (the page cache), builds a text prompt of exactly --prompt tokens with the file's tokenizer,
then runs --rounds rounds, each of one child per engine in turn (the order rotates each round, as
the machine's speed drifts over minutes on a shared box):
- Strata: `python -m strata generate FILE -p TEXT -n N --temperature 0 --ignore-eos --threads T`
  plus the variant's ARGS (`--strata paged='--memory paged'`; default one variant, "strata", with
  none), with `PYTHONPATH=DIR` for a variant given a `--tree` (another checkout's strata package,
  e.g. the code before a change: `git archive HEAD strata | tar -x -C DIR` and its built
  `strata/_native.abi3.so`);
- llama.cpp: `Llama(model_path, n_threads=T, n_threads_batch=T)`, the same prompt tokens evaluated,
  then N tokens greedily (the first from the prompt's logits, as Strata's), with its AMX kernels
  denied where they crash (llama_amx.py).
Each child's wall time is taken from its start to its exit by this process; each also reports its
own split (Strata: its stderr line's prefill seconds and decode rate; llama.cpp: load, prefill and
decode seconds). Prints per engine the median wall time and split over rounds, each variant's
median ratio to llama.cpp (of the per-round ratios), the CPU (`lscpu`'s model name) and the load
average before the rounds: both engines spin their thread pools, and other work on a 2-core
machine slows them unevenly (llama.cpp's decode fell to 1.5-5 tok/s at a load of 5, Strata's to a
third), so compare figures from quiet runs. Not a test: it asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: The stderr line `strata generate` ends with: "[32 tokens, 95.1 tok/s, prompt 208 tokens in 1.10 s, ...]".
STRATA_LINE = re.compile(r"\[(\d+) tokens, ([\d.]+) tok/s, prompt (\d+) tokens in ([\d.]+) s")

LLAMA_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
sys.path.insert(0, sys.argv[1])
from benchmarks.llama_amx import deny_amx
deny_amx()
import numpy as np
from llama_cpp import Llama
import_s = time.perf_counter() - t0
path, threads, n, ids = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), json.loads(sys.argv[5])
t = time.perf_counter()
llm = Llama(model_path=path, n_threads=threads, n_threads_batch=threads, n_ctx=len(ids) + n + 8, verbose=False)
load_s, n_vocab = time.perf_counter() - t, llm.n_vocab()
argmax = lambda: int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,))))
t = time.perf_counter()
llm.eval(ids)
out = [argmax()]
prefill_s, t = time.perf_counter() - t, time.perf_counter()
while len(out) < n:
    llm.eval([out[-1]])
    out.append(argmax())
decode_s = time.perf_counter() - t
print(json.dumps({"import_s": import_s, "load_s": load_s, "prefill_tok_s": len(ids) / prefill_s,
                  "decode_tok_s": (n - 1) / decode_s, "tokens": out}))
"""


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")),
                "unknown")


def warm_page_cache(path: Path) -> float:
    """Read the whole file once (buffered): its pages in the page cache. Seconds taken."""
    t0 = time.perf_counter()
    with open(path, "rb") as f:
        while f.read(16 << 20):
            pass
    return time.perf_counter() - t0


def prompt_text(path: Path, n: int) -> tuple[str, list[int]]:
    """A text of exactly `n` tokens in the file's tokenizer, and its ids (no BOS: the synthetic files add none)."""
    from strata.gguf import open_model
    from strata.tokenizer import Tokenizer

    with open_model(path) as mf:
        tok = Tokenizer.from_metadata(mf.metadata, str(path), vocab_size=mf.hparams.vocab_size)
    base = "The quick brown fox jumps over the lazy dog while the router picks eight experts of sixty-four. "
    text = base * (n // 20 + 2)
    while len(tok.encode(text)) > n:
        text = text[:-1]
    ids = tok.encode(text)
    if len(ids) != n:
        raise SystemExit(f"could not build a prompt of {n} tokens (got {len(ids)})")
    return text, ids


def run_strata(path: Path, text: str, a: argparse.Namespace, args: str, tree: str | None) -> dict:
    env = dict(os.environ, PYTHONPATH=tree or str(ROOT))
    argv = [sys.executable, "-m", "strata", "generate", str(path), "-p", text, "-n", str(a.n), "--temperature", "0",
            "--ignore-eos", "--threads", str(a.threads), *shlex.split(args)]
    t0 = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tree or ROOT)
    wall = time.perf_counter() - t0
    m = STRATA_LINE.search(done.stderr)
    if done.returncode != 0 or m is None:
        raise SystemExit(f"strata failed ({done.returncode}): {done.stderr[-2000:]}")
    tokens, rate, prompt, prefill_s = int(m[1]), float(m[2]), int(m[3]), float(m[4])
    return {"wall_s": wall, "prefill_tok_s": prompt / prefill_s, "decode_tok_s": rate, "tokens": tokens}


def run_llama(path: Path, ids: list[int], a: argparse.Namespace) -> dict:
    argv = [sys.executable, "-c", LLAMA_CHILD, str(ROOT), str(path), str(a.threads), str(a.n), json.dumps(ids)]
    t0 = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"llama.cpp failed ({done.returncode}): {done.stderr[-2000:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    return {"wall_s": wall, **{k: v for k, v in out.items() if k != "tokens"}, "tokens": len(out["tokens"])}


def medians(runs: list[dict]) -> dict:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0] if isinstance(runs[0][k], float)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("file", nargs="?", default=None, help="GGUF file (default: the medium synthetic file)")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/strata-bench"))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--prompt", type=int, default=208, help="prompt tokens (default %(default)s)")
    p.add_argument("-n", type=int, default=32, help="tokens generated (default %(default)s)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--strata", action="append", default=[], metavar="NAME=ARGS",
                   help="a Strata variant: its name and extra `strata generate` arguments (repeatable)")
    p.add_argument("--tree", action="append", default=[], metavar="NAME=DIR",
                   help="run variant NAME with PYTHONPATH=DIR (another checkout's strata package)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    a = p.parse_args()
    if a.file is None:
        from benchmarks.bench_files import model_file

        a.file = model_file(a.workdir, "medium")
    path = Path(a.file)
    variants = dict(v.partition("=")[::2] for v in a.strata) or {"strata": ""}
    trees = dict(t.partition("=")[::2] for t in a.tree)
    cached_s = warm_page_cache(path)
    text, ids = prompt_text(path, a.prompt)
    engines = ["llama.cpp", *variants]
    runs: dict[str, list[dict]] = {e: [] for e in engines}
    loads = []  # the 1-minute load average before each round: other work on the machine, which the
    for r in range(a.rounds):  # engines' spinning thread pools suffer from (llama.cpp's most)
        loads.append(os.getloadavg()[0])
        order = engines[r % len(engines):] + engines[:r % len(engines)]
        for e in order:
            runs[e].append(run_llama(path, ids, a) if e == "llama.cpp" else
                           run_strata(path, text, a, variants[e], trees.get(e)))
            print(f"round {r + 1}/{a.rounds} {e}: {runs[e][-1]['wall_s']:.2f} s", file=sys.stderr, flush=True)
    result = {"file": str(path), "file_bytes": path.stat().st_size, "cpu": cpu_model(), "threads": a.threads,
              "prompt_tokens": a.prompt, "n": a.n, "rounds": a.rounds, "page_cache_read_s": cached_s,
              "load_average": loads,
              "variants": {e: {"args": variants.get(e), "tree": trees.get(e)} for e in engines},
              "median": {e: medians(runs[e]) for e in engines}, "runs": runs,
              "ratio_to_llama": {e: statistics.median(s["wall_s"] / l["wall_s"] for s, l in zip(runs[e], runs["llama.cpp"]))
                                 for e in variants}}
    if a.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{path.name} ({result['file_bytes'] / 1e9:.2f} GB, in the page cache); CPU: {result['cpu']}; "
          f"{a.threads} threads; prompt {a.prompt} tokens, {a.n} generated; medians of {a.rounds} rounds; load "
          f"average before the rounds {min(loads):.1f}-{max(loads):.1f}")
    for e in engines:
        m = result["median"][e]
        extra = f" (ratio to llama.cpp {result['ratio_to_llama'][e]:.2f})" if e in variants else ""
        split = ", ".join(f"{k} {v:.2f}" for k, v in m.items() if k != "wall_s")
        label = e if e == "llama.cpp" else f"{e} [{variants[e] or 'defaults'}{', ' + trees[e] if e in trees else ''}]"
        print(f"  {label}: {m['wall_s']:.2f} s end to end{extra}; {split}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
