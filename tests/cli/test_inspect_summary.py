"""`strata inspect` leads with a summary a user acts on (what the file is, the verdict, the RAM and
disk it needs, how it would run here) and keeps the raw listing behind --raw."""
from __future__ import annotations

import pytest

LABELS = ["model", "file", "tokenizer", "verdict", "needs", "here"]


@pytest.fixture(scope="module")
def synth_file(tmp_path_factory):
    from strata.cli import main

    path = tmp_path_factory.mktemp("inspect") / "s.gguf"
    assert main(["synth", str(path), "--layers", "2", "--experts", "8", "--top-k", "2", "--hidden", "256", "--ff",
                 "256", "--vocab", "300", "--quiet"]) == 0
    return path


def _lines(cli, *args):
    code, out, err = cli("inspect", *map(str, args))
    assert code == 0, err
    return out.splitlines()


def test_the_summary_comes_first_in_a_few_plain_lines(cli, synth_file):
    lines = _lines(cli, synth_file)
    assert lines[0] == str(synth_file) and [line.split(":")[0] for line in lines[1:7]] == LABELS
    assert len(lines) == 8 and lines[7].startswith("more: ") and "--raw" in lines[7]
    text = "\n".join(lines)
    for raw in ("None", "()", "hparams", "e-0", "slab_bytes"):
        assert raw not in text, raw
    assert lines[1].startswith("model: qwen3moe, 2 layers, 8 routed experts (2 per token)")
    assert "Q4_K" in lines[2] and "one file" in lines[2]
    assert "chat template: none" in lines[3] and "--chat-template-file" in lines[3]
    assert lines[4].startswith("verdict: runs: qwen3moe")
    assert "of RAM holds it all" in lines[5] and "per token" in lines[5]
    # a file that fits: read in place where its pages are cached, else 8 of 8 in the paged memory's slots
    assert ("paged memory" in lines[6] and "8/8 experts per layer in RAM" in lines[6]) or \
        lines[6].startswith("here: cpu, direct memory: the file fits in RAM and is in the page cache"), lines[6]


def test_a_small_budget_says_what_the_disk_will_carry(cli, synth_file):
    here = _lines(cli, synth_file, "--host-mem", "1M")[6]
    assert "4/8 experts per layer in RAM" in here and "50% of expert reads from the disk" in here
    assert "--host-mem" in here


def test_a_cached_file_that_fits_is_read_in_place(cli, synth_file, monkeypatch):
    """The summary names the memory `strata generate` settles on: direct for a cached file that fits."""
    monkeypatch.setattr("strata.engine.build.resident_share", lambda mf: 1.0)
    here = _lines(cli, synth_file)[6]
    assert here.startswith("here: cpu, direct memory: the file fits in RAM and is in the page cache"), here
    monkeypatch.setattr("strata.engine.build.resident_share", lambda mf: 0.0)
    assert "paged memory" in _lines(cli, synth_file)[6]


def test_raw_keeps_every_field_after_the_summary(cli, synth_file):
    lines = _lines(cli, synth_file, "--raw")
    assert [line.split(":")[0] for line in lines[1:7]] == LABELS
    fields = lines.index("fields:")
    assert fields == 7 and "  hparams:" in lines and "    n_layers: 2" in lines
    assert not any(line.startswith("more: ") for line in lines)


def test_a_file_that_does_not_run_says_why_without_the_rest(cli, tmp_path, synth_file):
    from gguf import GGUFValueType

    from tests.fixtures.rewrite import rewrite

    bad = rewrite(synth_file, tmp_path / "bad.gguf", set={"tokenizer.ggml.model": ("no-such-tokenizer", GGUFValueType.STRING)})
    lines = _lines(cli, bad)
    verdict = next(line for line in lines if line.startswith("verdict: "))
    assert verdict.startswith("verdict: does not run")
    assert not any(line.startswith(("needs: ", "here: ")) for line in lines)
