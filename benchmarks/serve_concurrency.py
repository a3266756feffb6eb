"""Benchmark: total generated tokens/s of `strata serve` with 1 client against N concurrent clients.

    python benchmarks/serve_concurrency.py MODEL.gguf [--clients 1 8] [--max-tokens 64] [--rounds 2]
                                           [-- any strata serve option, e.g. --threads 2 --device cuda]

Starts one `strata serve` (--max-batch = the largest client count), waits for /health, warms up,
then for each client count runs that many threads, each sending `--rounds` streaming completions
(distinct prompts, greedy, `ignore_eos` so every request generates exactly --max-tokens), and
reports per count: generated tokens / wall time, and the clients' median time to first token and
median gap between tokens. Same model, same server process, one run: compare only inside it.
Standard library only. Not a unit test.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"strata serve exited with status {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise SystemExit(f"strata serve not ready after {timeout} s")


def one_request(url: str, prompt: str, max_tokens: int) -> dict:
    """One streamed completion: tokens generated, time to first text, gaps between text events."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}}
    request = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    t0, times, tokens = time.perf_counter(), [], 0
    with urllib.request.urlopen(request, timeout=3600) as response:
        for raw in response:
            line = raw.decode("utf-8").strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("choices") and event["choices"][0]["text"]:
                times.append(time.perf_counter())
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
    gaps = [b - a for a, b in zip(times, times[1:])]
    return {"tokens": tokens, "ttft": times[0] - t0 if times else None, "gaps": gaps}


def run_clients(url: str, n_clients: int, rounds: int, max_tokens: int) -> dict:
    prompts = [f"Request {i}: " + "tell me about the weather " * (1 + i % 7) for i in range(n_clients * rounds)]

    def client(i: int) -> list[dict]:
        return [one_request(url, prompts[i * rounds + r], max_tokens) for r in range(rounds)]

    t0 = time.perf_counter()
    with ThreadPoolExecutor(n_clients) as pool:
        results = [r for rs in pool.map(client, range(n_clients)) for r in rs]
    wall = time.perf_counter() - t0
    tokens = sum(r["tokens"] for r in results)
    gaps = [g for r in results for g in r["gaps"]]
    return {"clients": n_clients, "requests": len(results), "generated_tokens": tokens, "wall_s": round(wall, 3),
            "tokens_per_s": round(tokens / wall, 2),
            "ttft_median_s": round(statistics.median(r["ttft"] for r in results if r["ttft"] is not None), 4),
            "inter_token_median_s": round(statistics.median(gaps), 5) if gaps else None}


def main() -> int:
    argv = sys.argv[1:]
    serve_extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--clients", type=int, nargs="+", default=[1, 8])
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=2, help="requests per client, one after another")
    p.add_argument("--ready-timeout", type=float, default=600)
    args = p.parse_args(argv)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    log = tempfile.NamedTemporaryFile("w", prefix="strata-serve-", suffix=".log", delete=False)
    proc = subprocess.Popen([sys.executable, "-m", "strata", "serve", args.model, "--port", str(port),
                             "--max-batch", str(max(args.clients)), "--log-level", "warning", *serve_extra],
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_ready(url, proc, args.ready_timeout)
        one_request(url, "warm up", 8)
        rows = [run_clients(url, n, args.rounds, args.max_tokens) for n in args.clients]
    finally:
        proc.terminate()
        proc.wait(60)
        log.close()
    base = rows[0]["tokens_per_s"]
    for row in rows:
        row["speedup_vs_first"] = round(row["tokens_per_s"] / base, 2) if base else None
        print(json.dumps(row))
    print(f"server log: {log.name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
