"""The server ends a completion on any end-of-generation token (here the file's EOM), not only EOS,
and reports finish_reason "stop", streamed or not (the app in this process)."""
from __future__ import annotations

import json
import time

from fastapi.testclient import TestClient

from strata.server import ServerConfig, create_app
from tests.engine.test_eog import PROMPT, greedy_path, with_eog


def test_completion_stops_on_eom_with_finish_reason_stop(tiny_path):
    import strata

    path = {}

    def loader():
        model = strata.load(tiny_path, threads=1, max_batch=2)
        full, k = greedy_path(model)
        path.update(full=full, k=k)
        model.tokenizer = with_eog(dict(model.model_file.metadata), full[k], "eom")
        return model

    app = create_app(loader, ServerConfig("tiny", max_running=2, max_queue=2))
    with TestClient(app) as client:
        deadline = time.monotonic() + 120
        while client.get("/health").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.02)
        body = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0}
        done = client.post("/v1/completions", json=body).json()
        assert done["choices"][0]["finish_reason"] == "stop"
        assert done["usage"]["completion_tokens"] == path["k"]
        lines = client.post("/v1/completions", json={**body, "stream": True}).text.splitlines()
        chunks = [json.loads(line[len("data: "):]) for line in lines if line.startswith("data: {")]
        assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
        ignored = client.post("/v1/completions", json={**body, "ignore_eos": True}).json()
        assert ignored["usage"]["completion_tokens"] == 12 and ignored["choices"][0]["finish_reason"] == "length"
