// The console's tier simulator: asks /console/simulate for a traffic shape against one node
// and draws what was granted and refused each second, with the tier in use, as plain SVG.
"use strict";

(function () {
  const SVG = "http://www.w3.org/2000/svg";
  const WIDTH = 720, HEIGHT = 160, LEFT = 36;

  function $(id) { return document.getElementById(id); }

  function node(tag, attrs, text) {
    const n = tag.startsWith("svg:") ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) n.setAttribute(k, v);
    if (text !== undefined) n.textContent = text;
    return n;
  }

  function line(rows, key, high, colour) {
    const step = (WIDTH - LEFT) / Math.max(1, rows.length - 1);
    const points = rows.map((r, i) => `${(LEFT + i * step).toFixed(1)},${(HEIGHT - (Number(r[key]) || 0) / high * (HEIGHT - 10)).toFixed(1)}`);
    return node("svg:polyline", { points: points.join(" "), fill: "none", stroke: colour, "data-series": key });
  }

  function chart(rows) {
    const tierKey = Object.keys(rows[0] || {}).find((k) => k.includes("tier_index"));
    const high = Math.max(1, ...rows.map((r) => r.asked));
    const out = node("svg:svg", { width: WIDTH, height: HEIGHT + 20, id: "sim-chart" });
    out.append(node("svg:text", { x: 0, y: 12 }, String(high)), node("svg:text", { x: 0, y: HEIGHT }, "0"));
    out.append(line(rows, "asked", high, "#1565c0"), line(rows, "granted", high, "#2e7d32"), line(rows, "refused", high, "#c62828"));
    if (tierKey) {
      const tiers = Math.max(1, ...rows.map((r) => Number(r[tierKey]) || 0));
      const tier = line(rows, tierKey, tiers, "#6a1b9a");
      tier.setAttribute("stroke-dasharray", "4 3");
      out.append(tier);
    }
    out.append(node("svg:text", { x: LEFT, y: HEIGHT + 16 },
      `asked (blue), granted (green), refused (red)${tierKey ? ", tier in use (dashed)" : ""}, over ${rows.length} s`));
    return out;
  }

  function table(rows) {
    const t = node("table", { class: "table", id: "sim-table" });
    const head = node("tr");
    for (const name of ["second", "asked", "granted", "refused", "answer"]) head.append(node("th", {}, name));
    const thead = node("thead");
    thead.append(head);
    t.append(thead);
    const body = node("tbody");
    for (const r of rows) {
      const tr = node("tr", { "data-second": r.second });
      const extra = Object.entries(r).filter(([k]) => !["second", "asked", "granted", "refused"].includes(k))
        .map(([k, v]) => `${k}=${typeof v === "number" && !Number.isInteger(v) ? v.toFixed(2) : v}`).join(" ");
      for (const value of [r.second, r.asked, r.granted, r.refused, extra]) tr.append(node("td", {}, String(value)));
      body.append(tr);
    }
    t.append(body);
    return t;
  }

  async function simulate(event) {
    event.preventDefault();
    const query = new URLSearchParams();
    for (const [name, id] of [["domain", "sim-domain"], ["descriptor", "sim-descriptor"], ["node", "sim-node"],
      ["rate", "sim-rate"], ["seconds", "sim-seconds"], ["on_off", "sim-on-off"], ["burst", "sim-bursts"]]) {
      const value = $(id).value.trim();
      if (value) query.set(name, value);
    }
    const out = $("sim-result");
    try {
      const response = await fetch(`/console/simulate?${query}`, { cache: "no-store" });
      const answer = await response.json();
      if (!response.ok) {
        out.replaceChildren(node("p", { class: "error", "data-sim": "error" }, answer.error || response.statusText));
        return;
      }
      const rows = answer.per_second;
      const granted = rows.reduce((n, r) => n + r.granted, 0), asked = rows.reduce((n, r) => n + r.asked, 0);
      out.replaceChildren(node("p", { "data-sim": "summary" }, `${granted} of ${asked} requests granted`), chart(rows), table(rows));
    } catch (err) {
      out.replaceChildren(node("p", { class: "error", "data-sim": "error" }, String(err.message || err)));
    }
  }

  $("sim-form").addEventListener("submit", simulate);
})();
