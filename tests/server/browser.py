"""A headless Chromium driven through the DevTools protocol over `--remote-debugging-pipe` (JSON
messages ending in NUL on file descriptors 3 and 4), so the browser tests need the browser only:
no WebDriver, no websocket client.

    with Browser.launch(tmp_path) as browser:
        browser.goto("http://127.0.0.1:8080/")
        browser.wait_for("document.querySelector('#send') !== null")
"""
from __future__ import annotations

import fcntl
import json
import os
import queue
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

BINARIES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    """The browser binary: $STRATA_CHROMIUM, else the first of BINARIES on PATH, else Debian's
    chromium installed by the suite where it runs as root (tests/fixtures/fetch.py), as CI does."""
    from tests.fixtures.fetch import install_chromium

    found = os.environ.get("STRATA_CHROMIUM") or next(filter(None, map(shutil.which, BINARIES)), None)
    if found is None and install_chromium():
        found = next(filter(None, map(shutil.which, BINARIES)), None)
    return found


def _high(fds: tuple[int, int]) -> tuple[int, int]:
    """The pipe's descriptors moved above 4, clear of the 3 and 4 the browser is handed."""
    moved = tuple(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 5) for fd in fds)
    for fd in fds:
        os.close(fd)
    return moved


class Browser:
    """One headless browser with one page attached (`session`)."""

    def __init__(self, proc: subprocess.Popen, to_browser: int, from_browser: int):
        self.proc, self._out = proc, os.fdopen(to_browser, "wb", buffering=0)
        self._ids = iter(range(1, 1 << 30))
        self._replies: dict[int, queue.Queue] = {}
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, args=(os.fdopen(from_browser, "rb"),), daemon=True)
        self._reader.start()
        target = self.send("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.send("Page.enable", session=self.session)
        self.send("Runtime.enable", session=self.session)

    @classmethod
    def launch(cls, profile: Path, binary: str | None = None) -> Browser:
        binary = binary or find_chromium()
        to_r, to_w = _high(os.pipe())
        from_r, from_w = _high(os.pipe())
        args = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
                f"--user-data-dir={profile}", "--remote-debugging-pipe", "about:blank"]
        # the protocol's descriptors must be 3 (commands in) and 4 (replies out); bash, as dash's
        # redirections take one-digit descriptors only
        script = f'exec "$0" "$@" 3<&{to_r} 4>&{from_w} {to_r}<&- {from_w}>&-'
        proc = subprocess.Popen(["bash", "-c", script, binary, *args], pass_fds=(to_r, from_w),
                                stdout=subprocess.DEVNULL, stderr=open(os.environ.get("STRATA_CHROMIUM_LOG", os.devnull), "w"))
        os.close(to_r)
        os.close(from_w)
        return cls(proc, to_w, from_r)

    def _read(self, pipe) -> None:
        buffer = b""
        while chunk := pipe.read1(1 << 16):
            buffer += chunk
            while b"\0" in buffer:
                raw, buffer = buffer.split(b"\0", 1)
                message = json.loads(raw)
                if "id" in message:
                    with self._lock:
                        box = self._replies.get(message["id"])
                    if box is not None:
                        box.put(message)

    def send(self, method: str, session: str | None = None, timeout: float = 30.0, **params: Any) -> dict[str, Any]:
        """Run one protocol command; its result, or RuntimeError with the browser's error."""
        msg_id, box = next(self._ids), queue.Queue()
        with self._lock:
            self._replies[msg_id] = box
        message = {"id": msg_id, "method": method, "params": params}
        if session is not None:
            message["sessionId"] = session
        self._out.write(json.dumps(message).encode() + b"\0")
        try:
            reply = box.get(timeout=timeout)
        except queue.Empty:
            raise RuntimeError(f"the browser did not answer {method} within {timeout} s") from None
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply["result"]

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises awaited)."""
        result = self.send("Runtime.evaluate", session=self.session, expression=expression, returnByValue=True,
                           awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def goto(self, url: str) -> None:
        self.send("Page.navigate", session=self.session, url=url)
        self.wait_for("document.readyState === 'complete' && location.href !== 'about:blank'")

    def wait_for(self, expression: str, timeout: float = 30.0, period: float = 0.05) -> Any:
        """Poll `expression` until it is truthy; its value."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"not true within {timeout} s: {expression}")
            time.sleep(period)

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=5)
        except (RuntimeError, OSError):
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._out.close()

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
