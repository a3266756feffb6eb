"""The web page in a real headless Chromium (driven over the DevTools pipe, tests/server/browser.py)
against a `strata serve` subprocess: the chat page streams a greedy reply equal to the library's,
Stop aborts a long one (the server counts an abort), and the memory page draws a row and a canvas
row per expert layer; before the first request it says no tokens were routed yet, and with
--api-key the chat page asks for the key and words a 401 as a key to enter. Skipped where no
Chromium is installed (Debian: apt-get install chromium)."""
from __future__ import annotations

import json

import httpx
import pytest

from .browser import Browser, find_chromium
from .conftest import start

pytestmark = pytest.mark.skipif(find_chromium() is None, reason="no chromium binary on PATH (apt-get install "
                                                                "chromium, or set STRATA_CHROMIUM)")
PROMPT = "Tell me a story"
# The text of the assistant's reply each time the page changes it (a MutationObserver).
RECORD = """window.lengths = [];
new MutationObserver(() => {
  const n = document.querySelector('.message.assistant:last-child .content');
  if (n) window.lengths.push(n.textContent.length);
}).observe(document.getElementById('messages'), {subtree: true, childList: true, characterData: true});
true"""


def _set(browser: Browser, element_id: str, value) -> None:
    browser.evaluate(f"(() => {{ const e = document.getElementById({json.dumps(element_id)}); "
                     f"e.value = {json.dumps(str(value))}; e.dispatchEvent(new Event('input')); return true; }})()")


def _send(browser: Browser, text: str) -> None:
    _set(browser, "prompt", text)
    browser.evaluate("document.getElementById('send').click(), true")


@pytest.fixture(scope="module")
def server(request, tmp_path_factory, tiny_path):
    return start(request, tmp_path_factory, tiny_path, "--memory", "paged", "--alias", "tiny")


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    with Browser.launch(tmp_path_factory.mktemp("chromium")) as b:
        yield b


def test_chat_streams_the_greedy_reply(server, browser, tiny_model):
    browser.goto(server.url + "/")
    assert browser.wait_for("document.getElementById('model').textContent") == "tiny"  # from /v1/models
    _set(browser, "temperature", 0)
    _set(browser, "max-tokens", 24)
    _set(browser, "system", "You are terse.")
    browser.evaluate(RECORD)
    _send(browser, PROMPT)
    status = browser.wait_for("document.getElementById('status').textContent.startsWith('finished') && "
                              "document.getElementById('status').textContent", timeout=60)
    text = browser.evaluate("document.querySelector('.message.assistant .content').textContent")
    expected = tiny_model.chat([{"role": "system", "content": "You are terse."}, {"role": "user", "content": PROMPT}],
                               max_tokens=24, temperature=0.0)
    assert text == expected.text and text
    assert status == "finished: " + ("length" if expected.finish_reason == "length" else "stop")
    lengths = browser.evaluate("window.lengths")
    assert len(set(lengths)) >= 3 and lengths == sorted(lengths) and lengths[-1] == len(text)  # it grew, streamed
    assert browser.evaluate("document.querySelectorAll('.message.user').length") == 1
    assert browser.evaluate("document.querySelectorAll('details').length") == 0  # no reasoning, no tool calls


def test_stop_aborts_the_stream(server, browser):
    browser.goto(server.url + "/")
    # the reply must still be running when stop is clicked: the page's request asks the server to
    # run to max_tokens (vLLM's ignore_eos), else the tiny model may sample its end first
    browser.evaluate("(() => { const f = window.fetch; window.fetch = (url, opts) => { "
                     "if (String(url).endsWith('/v1/chat/completions')) { const b = JSON.parse(opts.body); "
                     "b.ignore_eos = true; opts = Object.assign({}, opts, {body: JSON.stringify(b)}); } "
                     "return f(url, opts); }; return true; })()")
    _set(browser, "temperature", 1)
    _set(browser, "max-tokens", 4000)
    _send(browser, "Go on forever")
    browser.wait_for("(document.querySelector('.message.assistant .content') || {textContent: ''})"
                     ".textContent.length > 0", timeout=60)
    browser.evaluate("document.getElementById('stop').click(), true")
    assert browser.wait_for("document.getElementById('status').textContent") == "stopped"
    assert browser.evaluate("document.getElementById('send').disabled") is False
    metrics = ""
    for _ in range(100):  # the server hears the disconnect and ends the sequence
        metrics = httpx.get(server.url + "/metrics", timeout=10).text
        if 'strata:request_success_total{finished_reason="abort"} 1.0' in metrics:
            break
        browser.evaluate("new Promise(r => setTimeout(() => r(true), 100))")
    assert 'strata:request_success_total{finished_reason="abort"} 1.0' in metrics


def test_memory_page_draws_every_layer(server, browser):
    report = httpx.get(server.url + "/api/memory", timeout=10).json()
    browser.goto(server.url + "/memory")
    rows = browser.wait_for("document.querySelectorAll('#layers tbody tr').length", timeout=30)
    assert rows == len(report["layers"]) == 2
    cells = browser.evaluate("[...document.querySelectorAll('#layers tbody tr')].map(r => "
                             "[r.dataset.layer, r.children[1].textContent, r.children[2].textContent])")
    assert [c[0] for c in cells] == [str(r["layer"]) for r in report["layers"]]
    assert all(c[1] == "RAM 4 (4 slots), disk 0" for c in cells)  # the tiny model's experts all fit in RAM
    assert all(int(c[2]) >= r["requests"] > 0 for c, r in zip(cells, report["layers"]))  # counts only grow
    # the canvas: a row of cells per layer, coloured as RAM (blue) where each expert sits
    drawn = browser.evaluate("""(() => { const c = document.getElementById('tiers');
      const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; let blue = 0;
      for (let i = 0; i < d.length; i += 4) if (d[i + 2] > d[i] + 40) blue++;
      return [c.height, blue]; })()""")
    assert drawn[0] >= 2 * 4 and drawn[1] > 0
    legend = browser.evaluate("document.getElementById('legend').textContent")
    assert "RAM" in legend and "disk" in legend


# OpenAI-shaped chunks with reasoning and a tool call streamed in pieces (as vLLM and llama-server send them).
DELTAS = [{"role": "assistant", "content": ""}, {"reasoning_content": "The user wants "},
          {"reasoning_content": "the weather."}, {"content": "Let me check."},
          {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                           "function": {"name": "get_weather", "arguments": ""}}]},
          {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]},
          {"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}]


def test_reasoning_and_tool_calls_are_folded(server, browser):
    """The page's side of reasoning and tool calls, whatever the model emits: its fetch is handed
    a recorded stream (the request it would have sent is kept and checked)."""
    browser.goto(server.url + "/")
    chunks = [{"choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in DELTAS]
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
    browser.evaluate(f"""window.sent = null; window.fetch = async (url, init) => {{
      window.sent = JSON.parse(init.body);
      const bytes = new TextEncoder().encode({json.dumps(body)});
      const stream = new ReadableStream({{ start(c) {{ for (let i = 0; i < bytes.length; i += 7)
        c.enqueue(bytes.slice(i, i + 7)); c.close(); }} }});  // split mid-event, as a network would
      return new Response(stream, {{status: 200, headers: {{"Content-Type": "text/event-stream"}}}});
    }}; true""")
    _set(browser, "temperature", 0.5)
    _set(browser, "top-p", 0.8)
    _set(browser, "max-tokens", 33)
    _set(browser, "system", "")
    _send(browser, "Weather in Paris?")
    assert browser.wait_for("document.getElementById('status').textContent") == "finished: tool_calls"
    sent = browser.evaluate("window.sent")
    assert sent == {"messages": [{"role": "user", "content": "Weather in Paris?"}], "stream": True,
                    "temperature": 0.5, "top_p": 0.8, "max_tokens": 33}
    folded = browser.evaluate("""[...document.querySelectorAll('.message.assistant details')].map(d =>
      [d.className, d.open, d.querySelector('summary').textContent, d.querySelector('pre').textContent])""")
    assert folded == [["reasoning", False, "Reasoning", "The user wants the weather."],
                      ["tool-call", False, "Tool call: get_weather", '{"city": "Paris"}']]
    assert browser.evaluate("document.querySelector('.message.assistant .content').textContent") == "Let me check."


KEY = "sesame"


@pytest.fixture(scope="module")
def keyed(request, tmp_path_factory, tiny_path):
    """A second server, with --api-key, that no request has reached yet."""
    return start(request, tmp_path_factory, tiny_path, "--memory", "paged", "--api-key", KEY)


def test_memory_page_before_the_first_request(keyed, browser):
    browser.goto(keyed.url + "/memory")
    state = browser.wait_for("document.getElementById('state').textContent", timeout=30)
    assert state.startswith("no tokens routed yet: every expert is on disk until a request first routes to it")
    assert "RAM: slots for 4 of 4 experts per layer, 0 experts there now." in state  # as the summary's 4/4
    assert "4/4 per layer" in browser.evaluate("document.getElementById('summary').textContent")
    totals = browser.evaluate("[...document.querySelectorAll('#totals div')].map(d => d.textContent)")
    assert totals[0] == "tokens routed" + "none yet" and not any("hit rate" in t for t in totals)
    cells = browser.evaluate("[...document.querySelectorAll('#layers tbody tr')].map(r => "
                             "[r.children[1].textContent, r.children[3].textContent])")
    assert cells == [["RAM 0 (4 slots), disk 4", "–"]] * 2  # no hit rate before anything was asked


def test_the_chat_page_asks_for_the_key(keyed, browser):
    browser.goto(keyed.url + "/")
    browser.evaluate("localStorage.clear(), true")
    browser.goto(keyed.url + "/")
    note = browser.wait_for("!document.getElementById('key-note').hidden && "
                            "document.getElementById('key-note').textContent", timeout=30)
    assert note == "This server needs an API key: enter it here"
    assert browser.evaluate("document.getElementById('key-box').classList.contains('wanted')")
    assert browser.evaluate("document.activeElement.id") == "api-key"
    _set(browser, "max-tokens", 4)
    _send(browser, "hello")
    assert browser.wait_for("document.getElementById('status').textContent === 'error' && "
                            "document.querySelector('.message.assistant .error-text').textContent", timeout=30) == \
        "wrong or missing API key: enter it in the key box"
    assert browser.evaluate("document.activeElement.id") == "api-key"
    _set(browser, "api-key", KEY)
    browser.evaluate("document.getElementById('api-key').dispatchEvent(new Event('change')), true")
    assert browser.evaluate("document.getElementById('key-note').hidden") is True
    assert browser.wait_for("document.getElementById('model').textContent", timeout=30)  # /v1/models with the key
    _send(browser, "hello again")
    assert browser.wait_for("document.getElementById('status').textContent.startsWith('finished') && "
                            "document.getElementById('status').textContent", timeout=60)
