// The memory page: polls /api/memory and draws where each expert sits and each layer's counters.
// Before the first request the pools hold only what was placed at start-up (experts are read
// into slots as they are first routed) and there are no rates yet: the page says "no tokens
// routed yet" rather than a 0% hit rate, and beside each pool's slots how many experts are there.
"use strict";
(() => {
  const $ = (id) => document.getElementById(id);
  const COLORS = { device: [47, 95, 179], host: [224, 161, 0], disk: [154, 154, 160] };
  const PERIOD_MS = 1000;
  const name = (tier, data) => (tier === "device" ? data.fast_tier : tier);
  const NONE_YET = "no tokens routed yet";

  function totals(data) {
    const t = data.total;
    // no rates before the first token: the state line above says why
    const rows = !t.tokens ? [["tokens routed", "none yet"], ["placed at start-up", t.startup_loads]] : [
      ["tokens routed", t.tokens], ["expert requests", t.requests],
      [data.fast_tier + " hit rate", strata.pct(t.device_hit_rate)], ["late prefetches", t.device_late],
      ["host hit rate (of misses)", strata.pct(t.host_hit_rate)], ["disk reads", t.disk_reads],
      ["disk bytes / token", strata.bytes(t.disk_bytes_per_token)],
      ["bytes into slots / token", strata.bytes(t.device_bytes_per_token)],
      ["evictions", t.evictions], ["prefetch issued / used", t.prefetch_issued + " / " + t.prefetch_used],
      ["prefetch precision", strata.pct(t.precision)], ["prefetch recall", strata.pct(t.recall)],
      ["compute waited (s)", t.wait_s.toFixed(3)], ["placed at start-up", t.startup_loads],
    ];
    $("totals").replaceChildren(...rows.map(([k, v]) => {
      const div = strata.el("div");
      div.append(strata.el("dt", null, k), strata.el("dd", null, String(v)));
      return div;
    }));
  }

  function legend(data) {
    const parts = [];
    for (const tier of data.tiers || []) {
      parts.push(strata.el("span", "swatch tier-" + tier), strata.el("span", null, name(tier, data)));
    }
    $("legend").replaceChildren(...parts);
  }

  // One row per layer, one cell per expert: the tier's colour, brighter the more it was routed.
  function draw(data) {
    const canvas = $("tiers"), L = data.layers.length, E = data.n_experts;
    const cell = Math.max(2, Math.min(16, Math.floor(1200 / Math.max(E, 1))));
    const rowH = Math.max(4, Math.min(14, Math.floor(600 / Math.max(L, 1))));
    canvas.width = E * cell + 40;
    canvas.height = L * rowH;
    const ctx = canvas.getContext("2d");
    ctx.fillStyle = "#fff";
    ctx.fillRect(0, 0, canvas.width, canvas.height);
    ctx.font = Math.min(rowH, 11) + "px sans-serif";
    ctx.textBaseline = "middle";
    data.layers.forEach((row, i) => {
      ctx.fillStyle = "#6b6b70";
      ctx.fillText(String(row.layer), 2, i * rowH + rowH / 2);
      const peak = Math.max(1, ...row.routing);
      for (let e = 0; e < E; e++) {
        const tier = row.tier ? data.tiers[row.tier[e]] : "disk";
        const [r, g, b] = COLORS[tier] || COLORS.disk;
        const a = 0.25 + 0.75 * (row.routing[e] / peak);
        ctx.fillStyle = `rgba(${r},${g},${b},${a.toFixed(3)})`;
        ctx.fillRect(40 + e * cell, i * rowH, cell - (cell > 3 ? 1 : 0), rowH - 1);
      }
    });
  }

  // Experts whose fastest tier this is now, and that pool's slots per layer: "RAM 0 (4 slots), disk 4".
  function tierText(row, data) {
    if (!row.tier_counts) return "in place (file)";
    const slots = (t) => (data.slots && data.slots[t] !== undefined ? ` (${data.slots[t]} slots)` : "");
    return data.tiers.map((t) => name(t, data) + " " + row.tier_counts[t] + slots(t)).join(", ");
  }

  // The pools' slots and the experts in them now, in words; before the first request, why they are empty.
  function stateText(data) {
    const pools = (data.tiers || []).filter((t) => data.slots && data.slots[t] !== undefined);
    const there = (t) => data.layers.reduce((n, row) => n + (row.tier_counts ? row.tier_counts[t] : 0), 0);
    const where = pools.map((t) => `${name(t, data)}: slots for ${data.slots[t]} of ${data.n_experts} experts per ` +
                                   `layer, ${there(t)} experts there now`).join("; ");
    if (data.total.tokens) return where;
    const empty = pools.every((t) => there(t) === 0);
    return `${NONE_YET}: ` + (empty ? "every expert is on disk until a request first routes to it, then it is read " +
                                      "into a slot"
                                    : "the slots hold the experts placed at start-up; the others are read from disk " +
                                      "as requests route to them") + (where ? `. ${where}.` : ".");
  }

  function table(data) {
    const body = $("layers").querySelector("tbody");
    body.replaceChildren(...data.layers.map((row) => {
      const tr = strata.el("tr");
      tr.dataset.layer = row.layer;
      const cells = [row.layer, tierText(row, data), row.requests, strata.pct(row.device_hit_rate), row.device_late,
                     strata.pct(row.host_hit_rate), row.disk_reads, strata.bytes(row.disk_bytes_per_token),
                     strata.bytes(row.device_bytes_per_token), row.evictions, strata.pct(row.precision),
                     strata.pct(row.recall), row.wait_s.toFixed(3)];
      tr.append(...cells.map((c) => strata.el("td", null, String(c))));
      return tr;
    }));
  }

  function render(data) {
    $("model").textContent = data.model;
    if (!data.total) {
      $("summary").textContent = `${data.memory || "no expert memory"}: the model has no tiered expert memory ` +
                                 "to show (no routed experts, or they are read in place from the file).";
      return;
    }
    $("summary").textContent = `${data.memory} — ${data.layers.length} expert layers × ${data.n_experts} experts, ` +
                               `top-${data.top_k}; updated ${new Date().toLocaleTimeString()}`;
    $("state").textContent = stateText(data);
    totals(data);
    legend(data);
    draw(data);
    table(data);
  }

  async function poll() {
    try {
      const response = await fetch("/api/memory", { headers: strata.headers() });
      if (response.ok) render(await response.json());
      else $("summary").textContent = await strata.errorText(response);
    } catch (e) {
      $("summary").textContent = "the server does not answer: " + e.message;
    }
    setTimeout(poll, PERIOD_MS);
  }

  poll();
})();
