"""The fuzz tests' parent side: run cases in `tests.fuzz.runner` children, isolating crashes.

Cases run in batches in one child (importing torch costs seconds) under an address-space limit;
the child reports each case as it finishes, so when it dies on a signal, or makes no progress
for `case_timeout` seconds (then it is killed), that case is recorded as a crash or a timeout
and a fresh child goes on with the next case.
"""
from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MEMORY_LIMIT = 4 << 30  # address space of a child: as the reproduction
STARTUP_TIMEOUT = 120.0  # importing torch on a busy two-core machine


@dataclass
class Report:
    n_cases: int = 0
    verdicts: Counter = field(default_factory=Counter)  # (command, verdict) -> count
    failures: list[str] = field(default_factory=list)  # one line per traceback, crash, timeout, bad error
    children: int = 0
    seconds: float = 0.0

    def summary(self) -> str:
        by = ", ".join(f"{c} {v}: {n}" for (c, v), n in sorted(self.verdicts.items()))
        return (f"{self.n_cases} cases in {self.seconds:.1f} s ({self.children} child processes): {by}; "
                f"{len(self.failures)} failures")


def _env() -> dict[str, str]:
    path = os.pathsep.join([os.environ.get("PYTHONPATH", ""), str(ROOT)])
    return dict(os.environ, PYTHONPATH=path, PYTHONIOENCODING="utf-8", OMP_NUM_THREADS="1", STRATA_DEBUG="1")


def run_cases(cases: list[dict], workdir: Path, case_timeout: float = 30.0, memory: int = MEMORY_LIMIT) -> Report:
    """Run every case; a Report of verdicts and failures (each naming case, command and detail)."""
    t0 = time.monotonic()
    cases_file = workdir / "cases.jsonl"
    cases_file.write_text("".join(json.dumps(c) + "\n" for c in cases))
    report, start = Report(n_cases=len(cases)), 0
    while start < len(cases):
        start = _child(cases, cases_file, start, workdir, case_timeout, memory, report)
    report.seconds = time.monotonic() - t0
    return report


def _child(cases: list[dict], cases_file: Path, start: int, workdir: Path, case_timeout: float, memory: int,
           report: Report) -> int:
    """Run cases from `start` in one child until it ends; returns the next case to run."""
    report.children += 1
    errfile = workdir / f"child-{report.children}.stderr"
    with open(errfile, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "tests.fuzz.runner", str(cases_file), str(start), str(memory)],
                                stdout=subprocess.PIPE, stderr=err, cwd=ROOT, env=_env())
    current, deadline, buf = start, time.monotonic() + STARTUP_TIMEOUT, b""
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    try:
        while True:
            if not sel.select(timeout=max(0.0, deadline - time.monotonic())):
                proc.kill()
                proc.wait()
                report.failures.append(f"case {current} ({_name(cases, current)}): timeout after {case_timeout} s")
                return current + 1
            chunk = os.read(proc.stdout.fileno(), 1 << 16)
            if not chunk:  # the child ended
                code = proc.wait()
                if current < len(cases):
                    tail = errfile.read_bytes()[-800:].decode("utf-8", "replace")
                    report.failures.append(f"case {current} ({_name(cases, current)}): child died with status "
                                           f"{code}: {tail}")
                    return current + 1
                return current
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                current, deadline = _record(line, cases, current, deadline, case_timeout, report)
    finally:
        sel.close()
        proc.stdout.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _record(line: bytes, cases: list[dict], current: int, deadline: float, case_timeout: float,
            report: Report) -> tuple[int, float]:
    try:
        msg = json.loads(line)
    except ValueError:
        return current, deadline  # something else wrote to stdout
    if "ready" in msg:
        return current, time.monotonic() + case_timeout
    if "done" in msg:
        return msg["done"] + 1, time.monotonic() + case_timeout
    command, verdict = msg["command"], msg["verdict"]
    report.verdicts[(command, verdict)] += 1
    if verdict not in ("ok", "error") or "out of memory" in msg["detail"] or "internal error" in msg["detail"]:
        report.failures.append(f"case {msg['case']} ({_name(cases, msg['case'])}) {command}: {verdict}: "
                               f"{msg['detail']}")
    return current, deadline


def _name(cases: list[dict], i: int) -> str:
    return cases[i].get("name", "?") if i < len(cases) else "?"


__all__ = ["MEMORY_LIMIT", "Report", "run_cases"]
