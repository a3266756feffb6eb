"""benchmarks/expert_parallel.py --small --json: the four runs (one process and two ranks, in
memory cgroups where cgroup v1 is writable, and in RAM) decode, and their figures add up: the
ranks' all-gathers move a float32 row of D per MoE layer and token each way, one process moves none;
the bare all-gathers between two ranks are timed."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from strata.gguf import open_model

from .ranks import ROOT

pytestmark = pytest.mark.slow  # six processes start torch: about a minute on two cores


def test_small_run(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "benchmarks/expert_parallel.py", "--small", "--json", "--workdir",
                           str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    r = json.loads(done.stdout)
    with open_model(r["file"]) as mf:
        row, layers = mf.hparams.n_embd * 4, len(mf.expert_layers)
    per_token = layers * row  # one float32 row of D per MoE layer and token, each way (world 2)
    names = ["one_process_ram", "two_ranks_ram"]
    names += [] if "cgroups" in r else ["one_process_cgroup", "two_ranks_cgroup"]
    assert sorted(r["runs"]) == sorted(names)
    for name in names:
        ranks = r["runs"][name]["ranks"]
        assert len(ranks) == (2 if name.startswith("two") else 1)
        for x in ranks:
            assert x["tokens"] == 4 and x["tok_s"] > 0 and x["ms_per_token"]["compute"] > 0
            expected = per_token if len(ranks) == 2 else 0
            assert x["net_bytes_sent_per_token"] == x["net_bytes_received_per_token"] == expected
            assert (x["ms_per_token"]["collective"] > 0) == (len(ranks) == 2)
        if len(ranks) == 2:
            assert [x["cpus"] for x in ranks] != [ranks[0]["cpus"]] * 2 or len(os.sched_getaffinity(0)) == 1
            assert all(len(x["cpus"]) == 1 for x in ranks)
    if "cgroups" not in r:  # the single process's budget holds half the experts: it reads from the disk
        assert r["runs"]["one_process_cgroup"]["ranks"][0]["disk_bytes_per_token"] > 0
        assert all(x["cgroup_failcnt"] == 0 or x["cgroup_peak_bytes"] <= r["limit_bytes"]
                   for run in ("one_process_cgroup", "two_ranks_cgroup") for x in r["runs"][run]["ranks"])
    assert r["speedup_ram"] > 0
    bare = r["allgather"]["ranks"]
    assert [x["rank"] for x in bare] == [0, 1] and all(x["ms_per_allgather"] > 0 for x in bare)
    assert bare[0]["row_bytes"] == row and r["n_layers"] == layers
