"""`strata bench MODEL`: llama-bench's figures for a whole model, the time split, tier figures and
the roofline; `strata generate --ignore-eos` for fixed-length runs."""
from __future__ import annotations

import json

import pytest

import strata
from strata.commands.bench import normalize_argv
from strata.gguf import open_model


def _bench(cli, path, *extra):
    code, out, err = cli("bench", path, "-p", "8", "-n", "4", "--reps", "2", "--threads", "1", "--json", *extra)
    assert code == 0, err
    return json.loads(out)


def test_bench_model_reports_speed_split_tiers_and_roofline(cli, qwen3):
    r = _bench(cli, qwen3.gguf(None), "--batch", "1,2", "--memory", "paged")  # a memory with tiers to report
    assert r["prompt"] == 8 and r["gen"] == 4 and r["compute"] == "packed"
    assert len(r["pp_tok_s"]["runs"]) == 2 and r["pp_tok_s"]["mean"] > 0
    assert set(r["tg"]) == {"1", "2"}
    for b, x in r["tg"].items():
        assert x["tokens_per_run"] == 3 * int(b)  # the first token of each sequence is the prefill's
        assert len(x["tok_s"]["runs"]) == 2 and x["tok_s"]["min"] <= x["tok_s"]["mean"] <= x["tok_s"]["max"]
        assert set(x["split_ms"]) == {"attention", "expert_compute", "expert_wait", "dequantization", "other"}
        assert 0 <= x["wait_share"] < 1
        assert 0 <= x["tiers"]["device_hit_rate"] <= 1
        roof = x["roofline"]
        bounds = [v for v in (roof["compute_bound_tok_s"], roof["transfer_bound_tok_s"]) if v]
        assert roof["bound_tok_s"] == min(bounds)
        assert roof["share_of_bound"] == pytest.approx(x["tok_s"]["mean"] / roof["bound_tok_s"])
    assert r["peak_rss_bytes"] > 0


def test_bench_prefill_computes_every_reps_whole_prompt(cli, qwen3):
    # 40 tokens hold two full KV blocks: with the prefix cache on, reps after the first would reuse them
    code, out, err = cli("bench", qwen3.gguf(None), "-p", "40", "-n", "2", "--reps", "3", "--threads", "1", "--json")
    assert code == 0, err
    assert json.loads(out)["pp_cached_tokens"] == 0


def test_bench_model_table_and_direct_memory(cli, qwen3):
    code, out, err = cli("bench", "model", qwen3.gguf("q8_0"), "-p", "8", "-n", "3", "--reps", "1", "--threads",
                         "1", "--memory", "direct")
    assert code == 0, err
    assert "pp8" in out and "tg3" in out and "roofline: compute-bound" in out and "tiers" not in out
    assert "hit rate" not in out  # the direct memory has no tiers


def test_bench_arguments_are_checked(cli, qwen3):
    code, _, err = cli("bench", qwen3.gguf(None), "--batch", "1,x")
    assert code == 1 and err.strip().splitlines() == [err.strip()] and "--batch" in err
    assert normalize_argv(["bench", "m.gguf", "-p", "8"]) == ["bench", "model", "m.gguf", "-p", "8"]
    assert normalize_argv(["bench", "cache", "--trace", "t"]) == ["bench", "cache", "--trace", "t"]
    assert normalize_argv(["bench", "--help"]) == ["bench", "--help"]


def test_generate_ignore_eos_runs_to_the_length(cli, qwen3, monkeypatch):
    seen = []
    real = strata.engine.Model.generate

    def spy(self, *a, **kw):
        seen.append(self.sampling_params(kw.get("sampling")).stop_token_ids)  # the flags': the model's default
        return real(self, *a, **kw)

    monkeypatch.setattr(strata.engine.Model, "generate", spy)
    code, out, _ = cli("generate", qwen3.gguf("f32"), "-p", "the router", "-n", "9", "--json", "--threads", "1",
                       "--ignore-eos")
    assert code == 0 and len(json.loads(out)["token_ids"]) == 9 and seen == [frozenset()]
    code, out, _ = cli("generate", qwen3.gguf("f32"), "-p", "the router", "-n", "9", "--json", "--threads", "1")
    assert code == 0 and seen[-1] is None  # None: the file's end-of-generation tokens


def test_bench_ladder_runs_every_step_on_the_same_model(cli, qwen3):
    from strata.bench.ladder import ROWS

    code, out, err = cli("bench", "ladder", qwen3.gguf(None), "-n", "4", "--batch", "2", "--threads", "1", "--json")
    assert code == 0, err
    r = json.loads(out)
    assert [x["name"] for x in r["rows"]] == list(ROWS)
    assert [x["batch"] for x in r["rows"]] == [1, 2, 2, 2, 2]
    assert r["rows"][0]["ratio"] == 1.0 and all(x["tok_s"] > 0 for x in r["rows"])
    assert [x["tokens"] for x in r["rows"]] == [3, 6, 6, 6, 6]
    assert [x["memory"] for x in r["rows"]][:2] == ["direct", "direct"]  # the runtime plan's names
    memories = [x["memory_detail"] for x in r["rows"]]
    assert memories[0] == memories[1] and memories[0].startswith("DirectExpertMemory(")
    with open_model(qwen3.gguf(None)) as mf:
        k, e = mf.hparams.n_experts_used, mf.hparams.n_experts
    assert f"{k}/{e} per layer on the device, {k}/{e} in the host tier" in memories[2]  # no room between steps
    assert r["rows"][4]["config"]["compute"] == "packed" and r["rows"][3]["config"]["compute"] == "float"
    code, out, _ = cli("bench", "ladder", qwen3.gguf(None), "-n", "3", "--batch", "2", "--threads", "1")
    assert code == 0 and "+ packed compute" in out and "x naive" in out
