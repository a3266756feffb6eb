"""Benchmark: how long an expert memory takes to warm up, and prefill once it has: random prompts
through each memory in turn, the seconds and expert reads of the first ones, then the prefill
rate of the next ones.

    python benchmarks/prefill_warmup.py FILE [--memories paged,direct] [--warmup 12] [-n 4]
        [--prompt 64] [--threads 2]

The paged memory's slots start empty, so the first use of each expert is a read; direct memory
computes from the mapped file (page faults only). Runs one after the other in this process, the
same prompts for each memory: compare figures of one run only. Not a test: it asserts nothing.
"""
from __future__ import annotations

import argparse
import random
import time

import strata


def prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rnd = random.Random(seed)
    return [[rnd.randrange(5, vocab) for _ in range(length)] for _ in range(n)]


def run(path: str, memory: str, a: argparse.Namespace) -> str:
    with strata.load(path, threads=a.threads, n_ctx=max(256, a.prompt + 8), max_batch=1, memory=memory) as m:
        vocab = m.tokenizer.vocab_size
        warm, timed = prompts(a.warmup, a.prompt, vocab, 1), prompts(a.n, a.prompt, vocab, 2)

        def reads() -> int:
            stats = m.memory_stats()
            return int(stats.total("disk_reads")) if stats is not None else 0

        t0 = time.perf_counter()
        for ids in warm:
            m.generate(ids, max_tokens=1, temperature=0, stop_token_ids=())
        warm_s, warm_reads = time.perf_counter() - t0, reads()
        t0 = time.perf_counter()
        for ids in timed:
            m.generate(ids, max_tokens=1, temperature=0, stop_token_ids=())
        rate = a.n * a.prompt / (time.perf_counter() - t0)
        return (f"{memory}: warm-up {a.warmup} prompts {warm_s:.1f} s, {warm_reads} expert reads; then prefill "
                f"{rate:.1f} tok/s, {reads() - warm_reads} reads")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("file")
    p.add_argument("--memories", default="paged,direct")
    p.add_argument("--warmup", type=int, default=12)
    p.add_argument("-n", type=int, default=4)
    p.add_argument("--prompt", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    for memory in a.memories.split(","):
        print(run(a.file, memory, a), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
