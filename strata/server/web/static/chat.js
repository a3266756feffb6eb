// The chat page: streams /v1/chat/completions (server-sent events) into the conversation.
// Reasoning (delta.reasoning_content) and tool calls (delta.tool_calls) are shown folded.
// GET /health (open without a key) says whether the server wants an API key: with none entered,
// the key box comes first with a note; a 401 points to the key box, not to HTTP headers.
"use strict";
(() => {
  const $ = (id) => document.getElementById(id);
  const NEEDS_KEY = "This server needs an API key: enter it here";
  const WRONG_KEY = "wrong or missing API key: enter it in the key box";
  const history = [];  // the conversation sent with each request (the system prompt is added then)
  let controller = null;  // the AbortController of the request in flight
  let keyNeeded = false;  // the server said (GET /health's `auth`) that /v1/* wants a key

  function bindRange(id) {
    const input = $(id), out = $(id + "-value");
    const show = () => { out.textContent = input.value; };
    input.addEventListener("input", show);
    show();
  }

  function addMessage(role, text) {
    const node = strata.el("div", "message " + role);
    node.appendChild(strata.el("span", "role", role));
    const body = strata.el("div", "content", text || "");
    node.appendChild(body);
    $("messages").appendChild(node);
    node.scrollIntoView({ block: "end" });
    return node;
  }

  // One assistant reply being streamed: its text, reasoning and tool calls.
  class Reply {
    constructor() {
      this.node = addMessage("assistant", "");
      this.content = this.node.querySelector(".content");
      this.text = "";
      this.reasoning = null;  // the <pre> inside the reasoning <details>, made on first use
      this.calls = [];  // {id, name, arguments, pre, summary} by index
    }
    folded(title, before) {
      const details = strata.el("details");
      const summary = strata.el("summary", null, title);
      const pre = strata.el("pre");
      details.append(summary, pre);
      this.node.insertBefore(details, before);
      return { details, summary, pre };
    }
    addReasoning(text) {
      if (!this.reasoning) {
        const part = this.folded("Reasoning", this.content);
        part.details.className = "reasoning";
        this.reasoning = part.pre;
      }
      this.reasoning.textContent += text;
    }
    addText(text) {
      this.text += text;
      this.content.textContent = this.text;
    }
    addToolCall(delta) {
      const i = delta.index ?? this.calls.length;
      if (!this.calls[i]) {
        const part = this.folded("Tool call", null);
        part.details.className = "tool-call";
        this.calls[i] = { id: delta.id || null, name: "", arguments: "", ...part };
      }
      const call = this.calls[i], fn = delta.function || {};
      if (delta.id) call.id = delta.id;
      if (fn.name) call.name += fn.name;
      if (fn.arguments) call.arguments += fn.arguments;
      call.summary.textContent = "Tool call: " + (call.name || "…");
      call.pre.textContent = call.arguments;
    }
    apply(delta) {
      if (delta.reasoning_content) this.addReasoning(delta.reasoning_content);
      if (delta.content) this.addText(delta.content);
      for (const call of delta.tool_calls || []) this.addToolCall(call);
      this.node.scrollIntoView({ block: "end" });
    }
    error(message) {
      this.node.classList.add("error");
      this.node.appendChild(strata.el("div", "error-text", message));
    }
    message() {
      const out = { role: "assistant", content: this.text };
      const calls = this.calls.filter(Boolean).map((c, i) => ({
        id: c.id || "call_" + i, type: "function", function: { name: c.name, arguments: c.arguments } }));
      if (calls.length) out.tool_calls = calls;
      return out;
    }
  }

  function request() {
    const messages = [];
    const system = $("system").value.trim();
    if (system) messages.push({ role: "system", content: system });
    const body = { messages: messages.concat(history), stream: true,
                   temperature: Number($("temperature").value), top_p: Number($("top-p").value) };
    const maxTokens = parseInt($("max-tokens").value, 10);
    if (maxTokens > 0) body.max_tokens = maxTokens;
    return body;
  }

  // Calls onEvent(parsed JSON) for each `data:` event until [DONE] or the end of the body.
  async function readEvents(response, onEvent) {
    const reader = response.body.getReader(), decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffer.search(/\r?\n\r?\n/)) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end).replace(/^\r?\n\r?\n/, "");
        const data = block.split(/\r?\n/).filter((l) => l.startsWith("data:"))
                          .map((l) => l.slice(5).trimStart()).join("\n");
        if (data === "[DONE]") return;
        if (data) onEvent(JSON.parse(data));
      }
    }
  }

  // The key box brought forward with `message` (null: back in its place, no note).
  function keyBox(message) {
    $("key-box").classList.toggle("wanted", Boolean(message));
    $("key-note").hidden = !message;
    $("key-note").textContent = message || "";
  }

  function askForKey(message) {
    keyBox(message);
    $("api-key").focus();
  }

  function busy(on, status) {
    $("send").disabled = on;
    $("stop").disabled = !on;
    $("status").textContent = status || "";
  }

  async function send(text) {
    history.push({ role: "user", content: text });
    addMessage("user", text);
    const reply = new Reply();
    controller = new AbortController();
    busy(true, "generating…");
    let finish = null;
    try {
      const response = await fetch("/v1/chat/completions", { method: "POST", headers: strata.headers(),
        body: JSON.stringify(request()), signal: controller.signal });
      if (response.status === 401) {
        askForKey(WRONG_KEY);
        throw new Error(WRONG_KEY);
      }
      if (!response.ok) throw new Error(await strata.errorText(response));
      await readEvents(response, (event) => {
        if (event.error) throw new Error(event.error.message || "the server ended the stream with an error");
        for (const choice of event.choices || []) {
          reply.apply(choice.delta || {});
          if (choice.finish_reason) finish = choice.finish_reason;
        }
      });
      busy(false, finish ? "finished: " + finish : "");
    } catch (e) {
      if (e.name === "AbortError") busy(false, "stopped");
      else { reply.error(e.message); busy(false, "error"); }
    } finally {
      controller.abort();  // ends the request if an error left it open (a no-op once it is complete)
      controller = null;
      history.push(reply.message());
    }
  }

  async function showModel() {
    try {
      const response = await fetch("/v1/models", { headers: strata.headers() });
      if (response.ok) $("model").textContent = (await response.json()).data[0].id;
      else if (response.status === 401 && $("api-key").value) keyBox(WRONG_KEY);
    } catch (e) { /* the server is loading: the name stays blank */ }
  }

  // Asks GET /health until the model is loaded, then whether a key is wanted, then the model's name.
  async function checkServer() {
    let health = null;
    try {
      const response = await fetch("/health");
      if (response.ok) health = await response.json();
    } catch (e) { /* not answering yet */ }
    if (!health) {
      setTimeout(checkServer, 1000);
      return;
    }
    keyNeeded = Boolean(health.auth);
    if (keyNeeded && !$("api-key").value) askForKey(NEEDS_KEY);
    showModel();
  }

  $("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    const text = $("prompt").value;
    if (!text.trim() || controller) return;
    $("prompt").value = "";
    send(text);
  });
  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) {
      event.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("stop").addEventListener("click", () => { if (controller) controller.abort(); });
  $("clear").addEventListener("click", () => {
    if (controller) controller.abort();
    history.length = 0;
    $("messages").replaceChildren();
    $("status").textContent = "";
  });
  $("api-key").value = localStorage.getItem("strata-api-key") || "";
  $("api-key").addEventListener("change", () => {
    localStorage.setItem("strata-api-key", $("api-key").value);
    keyBox(keyNeeded && !$("api-key").value ? NEEDS_KEY : null);
    showModel();
  });
  bindRange("temperature");
  bindRange("top-p");
  checkServer();
})();
