"""One sampling rule everywhere: the API's SamplingParams() is strata.defaults.SAMPLING_DEFAULTS,
as the flags of `generate`/`chat` and the fields a `serve` request omits are; `generate` with no
sampling option samples (seeded: repeatable), and temperature 0 is the one way to greedy."""
from __future__ import annotations

import argparse
from dataclasses import fields

import pytest

import strata
from strata.commands.common import add_sampling_args, sampling_params
from strata.defaults import SAMPLING_DEFAULTS
from strata.engine import SamplingParams
from strata.server.protocol import SERVER_DEFAULTS
from tests.fixtures.tiny import zoo


def test_sampling_params_defaults_are_the_commands_defaults():
    p = SamplingParams()
    assert {f: getattr(p, f) for f in SAMPLING_DEFAULTS} == SAMPLING_DEFAULTS
    assert set(SAMPLING_DEFAULTS) <= {f.name for f in fields(SamplingParams)}
    assert not p.greedy and p.seed is None and p.stop == () and p.stop_token_ids is None
    assert SamplingParams.build() == p


def test_flags_and_server_defaults_give_the_api_default():
    parser = argparse.ArgumentParser()
    add_sampling_args(parser)
    assert sampling_params(parser.parse_args([])) == SamplingParams()
    assert {**SERVER_DEFAULTS, "max_tokens": SAMPLING_DEFAULTS["max_tokens"]} == SAMPLING_DEFAULTS


@pytest.fixture(scope="module")
def model():
    with strata.load(zoo().get("qwen3moe").gguf("f32"), threads=1, n_ctx=40) as m:
        yield m


def test_generate_without_sampling_options_samples_and_a_seed_repeats_it(model):
    assert model.sampling_params() == SamplingParams()
    prompt = "the expert router"  # the context (40) ends the runs well before the 256 default tokens
    greedy = model.generate(prompt, temperature=0)
    runs = {s: model.generate(prompt, seed=s) for s in range(4)}
    for s, done in runs.items():
        again = model.generate(prompt, seed=s)
        assert (again.token_ids, again.text) == (done.token_ids, done.text)
    assert any(done.token_ids != greedy.token_ids for done in runs.values())  # not greedy by default
    assert len({tuple(done.token_ids) for done in runs.values()}) > 1  # the seed decides the draws
