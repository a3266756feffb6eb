"""`strata chat --server URL`: the same chat loop against a running `strata serve` (or any
OpenAI-compatible server), streaming each reply from `/v1/chat/completions`.

Standard library only (urllib), so the client side needs no HTTP package. Must not hold the
chat loop (chat.py does): it sends one turn and streams its answer.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from typing import Any

from strata.errors import StrataArgumentError, StrataError


def server_url(text: str) -> str:
    """--server's value as a base URL: `host:port` (as llama.cpp and Ollama print it) gets http://,
    a trailing slash goes; any other scheme than http(s) is refused."""
    url = text.strip().rstrip("/")
    if "://" not in url:
        url = f"http://{url}"
    scheme, rest = url.split("://", 1)
    if scheme.lower() not in ("http", "https") or not rest:
        raise StrataArgumentError(f"--server {text}: expected http://HOST:PORT, https://HOST:PORT or HOST:PORT")
    return url


class ServerChat:
    """One server's model: `reply(messages, args)` streams the assistant's answer to stdout."""

    def __init__(self, url: str, api_key: str | None, timeout: float = 600.0):
        self.url, self.timeout = server_url(url), timeout
        if self.url.endswith("/v1"):
            self.url = self.url[:-3]
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        card = self._get("/v1/models")["data"][0]
        self.model, self.n_ctx = card["id"], card.get("max_model_len")
        self.name = f"{self.model} at {self.url}"

    def _open(self, path: str, body: dict[str, Any] | None = None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, headers=self.headers)
        try:
            return urllib.request.urlopen(request, timeout=self.timeout)
        except urllib.error.HTTPError as e:
            try:
                message = json.loads(e.read())["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = e.reason
            raise StrataError(f"{self.url}{path}: HTTP {e.code}: {message}") from None
        except urllib.error.URLError as e:
            raise StrataError(f"{self.url}: cannot connect: {e.reason}") from None

    def _get(self, path: str) -> dict[str, Any]:
        with self._open(path) as response:
            return json.loads(response.read())

    def reply(self, messages: list[dict], args: argparse.Namespace) -> str | None:
        """Stream the reply to stdout; its text, or None when interrupted (closing the connection
        makes the server cancel the request)."""
        body = {"model": self.model, "messages": messages, "stream": True, "stream_options": {"include_usage": True},
                "max_tokens": args.max_tokens, "temperature": args.temperature, "top_k": args.top_k,
                "top_p": args.top_p, "min_p": args.min_p, "repetition_penalty": args.repeat_penalty,
                "seed": args.seed, "stop": args.stop or None}
        parts, usage, t_first = [], None, None
        try:
            with self._open("/v1/chat/completions", body) as response:
                for raw in response:
                    line = raw.decode("utf-8").rstrip("\r\n")
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    event = json.loads(line[6:])
                    if "error" in event:
                        raise StrataError(f"{self.url}: {event['error'].get('message')}")
                    if event.get("choices"):
                        text = event["choices"][0].get("delta", {}).get("content") or ""
                        if text:
                            t_first = t_first or time.perf_counter()
                            parts.append(text)
                            sys.stdout.write(text)
                            sys.stdout.flush()
                    elif event.get("usage"):
                        usage = event["usage"]
        except KeyboardInterrupt:
            print("\n[interrupted]")
            return None
        n = usage["completion_tokens"] if usage else len(parts)
        rate = (n - 1) / (time.perf_counter() - t_first) if t_first and n > 1 else 0.0
        used = usage["total_tokens"] if usage else "?"
        print(f"\n[{n} tokens, {rate:.1f} tok/s, context {used}/{self.n_ctx or '?'}]", flush=True)
        return "".join(parts)


__all__ = ["ServerChat", "server_url"]
