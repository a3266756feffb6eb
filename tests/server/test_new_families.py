"""This season's families through `strata serve` (issue 59): each tiny model's default file (Q8_0
attention, Q4_K experts, as users download them) served, two concurrent streams of the official
`openai` client giving the greedy text the model gives in this process."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

import strata
from tests.fixtures.tiny import zoo

from .conftest import ServerProcess

FAMILIES = ["deepseek32", "glmdsa", "mimo2", "hyv3", "laguna"]
PROMPTS = ["The cache holds", "Experts route each token"]


@pytest.mark.parametrize("key", FAMILIES)
def test_served_greedy_text_equals_the_model_in_process(key, request, tmp_path_factory):
    import openai

    path = zoo().get(key).gguf(None)
    with strata.load(path, threads=1) as model:
        done = [model.generate(p, max_tokens=8, temperature=0.0, stop_token_ids=()) for p in PROMPTS]
        # the server's text leaves special tokens out (a tiny random model emits them mid-text)
        expected = [model.detokenize(d.token_ids, skip_special=True) for d in done]
    server = ServerProcess(path, tmp_path_factory.mktemp(f"serve-{key}") / "server.log", "--max-batch", "2")
    request.addfinalizer(server.stop)
    server.wait_ready()
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    served = client.models.list().data[0].id

    def complete(prompt: str) -> str:
        done = client.completions.create(model=served, prompt=prompt, max_tokens=8, temperature=0,
                                         extra_body={"ignore_eos": True})
        assert done.choices[0].finish_reason == "length" and done.usage.completion_tokens == 8
        return done.choices[0].text

    with ThreadPoolExecutor(2) as pool:  # both in flight at once: one batch of two sequences
        assert list(pool.map(complete, PROMPTS)) == expected
