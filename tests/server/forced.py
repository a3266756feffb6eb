"""The tiny model served in this process with Qwen3's real chat template (`chat_template=`, as
--chat-template-file gives it), for tests through the official `openai` client; `forced` makes
every reply REPLY (reasoning and a tool call) by patching the sampler, the engine, the
tokenizer's stream decoder and the server unchanged. Import the fixtures into a test module."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from strata.engine.sampling import Sampler
from tests.fixtures.tiny import llama_cpp_source

from .conftest import free_port

REPLY = ('<think>\nThe user wants the weather.\n</think>\n\n<tool_call>\n'
         '{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>')


def serve_in_thread(tiny_path, template: str, n_ctx: int):
    """Serve the tiny model with `template` in this process until the generator is closed; yields
    (an `openai.OpenAI` on it, the model the server loaded)."""
    import uvicorn

    import strata
    from strata.server import ServerConfig, create_app

    models = []

    def loader():
        models.append(strata.load(tiny_path, threads=1, n_ctx=n_ctx, max_batch=2, chat_template=template))
        return models[0]

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(loader, ServerConfig("tiny")), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                break
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    yield openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=120), models[0]
    server.should_exit = True
    thread.join(30)


@pytest.fixture(scope="module")
def client(tiny_path):
    """(an `openai.OpenAI` on the served model, the model the server loaded)."""
    src = llama_cpp_source()
    if src is None:
        pytest.skip("llama.cpp's source (STRATA_LLAMA_CPP_SRC) is not here")
    template = (Path(src) / "models/templates/Qwen-Qwen3-0.6B.jinja").read_text(encoding="utf-8")
    yield from serve_in_thread(tiny_path, template, 1024)


@pytest.fixture
def forced(client, monkeypatch):
    """Every sequence's sampler emits REPLY's tokens, then the end-of-generation token."""
    model = client[1]
    ids = model.tokenize(REPLY, add_special=False) + [min(model.stop_token_ids)]
    assert model.detokenize(ids[:-1]) == REPLY

    def draw(self, logits):  # the engine samples through sample_batch, one draw per sequence
        self.n_forced = getattr(self, "n_forced", -1) + 1
        return ids[min(self.n_forced, len(ids) - 1)]

    monkeypatch.setattr(Sampler, "draw", draw)
    return client[0]
