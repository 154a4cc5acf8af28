// The ferryman console: polls the debug port's JSON endpoints and draws them with plain DOM
// and SVG. No libraries, nothing fetched from elsewhere: it works offline.
"use strict";

(function () {
  const params = new URLSearchParams(window.location.search);
  // ?refresh=SECONDS changes the poll period (the server samples every few seconds anyway).
  const REFRESH_MS = Math.max(250, 1000 * (parseFloat(params.get("refresh")) || 3));
  const COLORS = ["#1565c0", "#ef6c00", "#2e7d32", "#c62828", "#6a1b9a", "#00838f",
    "#ad1457", "#558b2f", "#4e342e", "#37474f"];
  const SVG = "http://www.w3.org/2000/svg";

  const state = { samples: [], last: 0, span: 900, configVersion: -1, configError: undefined,
    config: null, panels: [] };

  // ---------------------------------------------------------------- helpers

  function $(id) { return document.getElementById(id); }

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === "class") node.className = v; else node.setAttribute(k, v === true ? "" : v);
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : String(child));
    }
    return node;
  }

  function svg(tag, attrs, text) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function fmt(value) {
    if (!isFinite(value)) return "–";
    const a = Math.abs(value);
    if (a >= 1e6) return (value / 1e6).toFixed(1) + "M";
    if (a >= 1e3) return (value / 1e3).toFixed(1) + "k";
    if (a >= 100 || Number.isInteger(value)) return value.toFixed(0);
    if (a >= 1) return value.toFixed(1);
    if (a === 0) return "0";
    return value.toFixed(2);
  }

  function when(epoch) {
    return epoch ? new Date(epoch * 1000).toLocaleString() : "never";
  }

  async function getJSON(url) {
    const response = await fetch(url, { cache: "no-store" });
    const body = await response.json();
    if (!response.ok) throw new Error(body.error || response.status + " " + response.statusText);
    return body;
  }

  // ---------------------------------------------------------------- charts

  // series: [{name, points: [[t, v], ...]}]; draws lines over the last `span` seconds.
  function lineChart(container, series, opts) {
    opts = opts || {};
    const W = 600, H = 170, L = 42, R = 8, T = 8, B = 20;
    const now = Date.now() / 1000, span = state.span, t0 = now - span;
    let max = 0;
    for (const s of series) for (const [, v] of s.points) if (v > max) max = v;
    const top = max > 0 ? niceCeil(max) : 1;
    const x = (t) => L + ((t - t0) / span) * (W - L - R);
    const y = (v) => T + (1 - v / top) * (H - T - B);
    const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img",
      "aria-label": opts.title || "chart" });
    for (const frac of [0, 0.5, 1]) {
      const yy = y(top * frac);
      root.append(svg("line", { class: "axis", x1: L, x2: W - R, y1: yy, y2: yy }));
      root.append(svg("text", { class: "label", x: L - 4, y: yy + 3, "text-anchor": "end" },
        fmt(top * frac)));
    }
    for (const [label, t] of [["-15m", t0], ["-10m", now - 600], ["-5m", now - 300], ["now", now]]) {
      root.append(svg("text", { class: "label", x: x(t), y: H - 5,
        "text-anchor": label === "now" ? "end" : label === "-15m" ? "start" : "middle" }, label));
    }
    const drawn = series.filter((s) => s.points.length);
    if (!drawn.length || max === 0) {
      root.append(svg("text", { class: "empty", x: (L + W) / 2, y: H / 2, "text-anchor": "middle" },
        opts.empty || "nothing yet"));
    }
    drawn.forEach((s, i) => {
      const pts = s.points.filter(([t]) => t >= t0).map(([t, v]) => `${x(t).toFixed(1)},${y(v).toFixed(1)}`);
      const color = s.color || COLORS[i % COLORS.length];
      root.append(svg("polyline", { points: pts.join(" "), stroke: color }));
      // The latest value as a dot: visible even while a series has a single sample.
      const [lt, lv] = s.points[s.points.length - 1];
      if (lt >= t0) root.append(svg("circle", { cx: x(lt), cy: y(lv), r: 2.5, fill: color }));
    });
    const legend = el("div", { class: "legend" });
    let total = 0;
    series.forEach((s, i) => {
      const latest = s.points.length ? s.points[s.points.length - 1][1] : 0;
      for (const [, v, dt] of s.points) total += v * (dt || 0);
      legend.append(el("span", { "data-series": s.name },
        el("span", { class: "swatch", style: `background:${s.color || COLORS[i % COLORS.length]}` }),
        s.name + " ", el("span", { class: "legend-value" }, fmt(latest) + (opts.unit || ""))));
    });
    container.replaceChildren(root, legend);
    if (opts.totalLabel) {
      container.dataset.total = String(Math.round(total));
      container.append(el("div", { class: "chart-total" },
        `${fmt(total)} ${opts.totalLabel} in the last ${Math.round(span / 60)} minutes`));
    }
  }

  function niceCeil(v) {
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
    return 10 * p;
  }

  // Series from a field of each sample that is an object of name -> rate, busiest first.
  function keyedSeries(field, limit) {
    const totals = new Map();
    for (const s of state.samples) {
      for (const [k, v] of Object.entries(s[field] || {})) totals.set(k, (totals.get(k) || 0) + v * s.dt);
    }
    const names = [...totals.entries()].sort((a, b) => b[1] - a[1]).slice(0, limit || 8).map((e) => e[0]);
    return names.map((name) => ({
      name,
      points: state.samples.map((s) => [s.t, (s[field] || {})[name] || 0, s.dt]),
    }));
  }

  function fieldSeries(spec) {
    return spec.map(([name, get, color]) => ({
      name, color, points: state.samples.map((s) => [s.t, get(s), s.dt]),
    }));
  }

  // ---------------------------------------------------------------- configuration

  function renderConfig(cfg) {
    state.config = cfg;
    if ((cfg.envoy_files || []).length && $("envoy-form").hidden) {
      envoyRoutes().catch((err) => $("envoy-result").replaceChildren(el("p", { class: "error" }, String(err.message || err))));
    }
    $("config-version").textContent = `config v${cfg.version}, loaded ${when(cfg.loaded_at)}`;
    $("config-meta").textContent = `${cfg.domains.length} domain(s) from ${cfg.directory || "?"}`;
    const banner = $("config-error");
    if (cfg.last_error) {
      banner.hidden = false;
      banner.replaceChildren(
        el("strong", {}, `The last configuration load failed (${when(cfg.last_error_at)}); ` +
          "the configuration below stays in force until a load succeeds.\n"),
        cfg.last_error);
    } else {
      banner.hidden = true;
      banner.replaceChildren();
    }
    const domains = $("domains");
    if (!cfg.domains.length) {
      domains.replaceChildren(el("p", { class: "muted" }, "no configuration loaded"));
    } else {
      domains.replaceChildren(...cfg.domains.map((d) => el("details", { class: "domain", open: true,
        "data-domain": d.name }, el("summary", {}, d.name, " ",
          el("span", { class: "muted" }, d.files.join(", "))), tree(d.nodes))));
    }
    $("domain-names").replaceChildren(...cfg.domains.map((d) => el("option", { value: d.name })));
    renderBurstNodes();
  }

  function tree(nodes) {
    const ul = el("ul", { class: "tree" });
    for (const n of nodes) {
      const flags = [];
      if (n.shadow_mode) flags.push(el("span", { class: "badge flag" }, "shadow"));
      if (n.quota_mode) flags.push(el("span", { class: "badge flag" }, "quota"));
      if (n.detailed_metric) flags.push(el("span", { class: "badge flag" }, "detailed"));
      const li = el("li", { "data-stats-key": n.stats_key },
        el("span", { class: "node-key" }, n.value ? `${n.key}=${n.value}` : n.key),
        el("span", { class: `badge kind-${n.kind}` }, n.kind.replace("_", " ")),
        n.kind !== "none" ? el("span", { class: "numbers" }, n.numbers) : null,
        n.name ? el("span", { class: "muted" }, ` (name ${n.name})`) : null,
        n.replaces ? el("span", { class: "muted" }, `, replaces ${n.replaces.join(", ")}`) : null,
        ...flags, " ", el("span", { class: "muted source" }, n.source));
      if (n.children && n.children.length) li.append(tree(n.children));
      ul.append(li);
    }
    return ul;
  }

  function burstNodes() {
    const found = [];
    const walk = (nodes) => { for (const n of nodes) { if (n.kind === "burst_tiers") found.push(n); walk(n.children || []); } };
    for (const d of (state.config ? state.config.domains : [])) walk(d.nodes);
    return found;
  }

  // ---------------------------------------------------------------- burst tiers

  function renderBurstNodes() {
    const nodes = burstNodes();
    const box = $("burst-nodes");
    if (!nodes.length) {
      box.replaceChildren(el("p", { class: "muted" }, "no burst-tier node configured"));
      return;
    }
    box.replaceChildren(...nodes.slice(0, 12).map((n) => {
      const tiers = n.tiers.map((t, i) => el("li", {},
        `tier ${i + 1}: ${t.limit} per ${t.window}s, active ${t.active}s, cooldown ${t.cooldown}s` +
        (t.skippable ? ", skippable" : "")));
      return el("div", { class: "burst-node", "data-series": n.series },
        el("h3", {}, n.series, " ", el("span", { class: "now muted" }, "")),
        el("ol", { class: "muted", start: "1" }, ...tiers),
        el("div", { class: "chart" }), el("div", { class: "timeline" }));
    }));
    renderBursts();
  }

  function renderBursts() {
    const nodes = burstNodes();
    for (const box of document.querySelectorAll(".burst-node")) {
      const node = nodes.find((n) => n.series === box.dataset.series);
      if (!node) continue;
      const tierNames = node.tiers.map((_, i) => String(i + 1));
      const series = tierNames.map((t) => ({
        name: `tier ${t}`,
        points: state.samples.map((s) => [s.t, ((s.tiers || {})[node.series] || {})[t] || 0, s.dt]),
      }));
      lineChart(box.querySelector(".chart"), series, { unit: "/s", empty: "no hits yet",
        title: `hits per second by tier, ${node.series}` });
      const current = timeline(box.querySelector(".timeline"), node);
      box.querySelector(".now").textContent = current.tier
        ? `current tier: ${current.tier}, active until ${new Date(current.until * 1000).toLocaleTimeString()}`
        : "no tier active";
    }
  }

  // One row per tier: the samples it granted hits in, and from each entry into the tier its
  // active period (shaded) and cooldown (hatched), as the node's configuration sets them.
  // Returns the highest tier still active now, and until when.
  function timeline(container, node) {
    const current = { tier: 0, until: 0 };
    const W = 600, L = 42, R = 8, row = 14, n = node.tiers.length, H = n * row + 16;
    const now = Date.now() / 1000, span = state.span, t0 = now - span;
    const x = (t) => Math.max(L, Math.min(W - R, L + ((t - t0) / span) * (W - L - R)));
    const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "tier timeline" });
    const defs = svg("defs");
    const hatchId = "hatch-" + node.stats_key.replace(/[^A-Za-z0-9_-]/g, "_");
    const hatch = svg("pattern", { id: hatchId, width: 6, height: 6, patternUnits: "userSpaceOnUse",
      patternTransform: "rotate(45)" });
    hatch.append(svg("rect", { width: 6, height: 6, fill: "rgba(21,101,192,.08)" }));
    hatch.append(svg("line", { x1: 0, y1: 0, x2: 0, y2: 6, stroke: "rgba(21,101,192,.55)", "stroke-width": 2 }));
    defs.append(hatch);
    root.append(defs);
    node.tiers.forEach((tier, i) => {
      const name = String(i + 1), y0 = (n - 1 - i) * row;
      root.append(svg("text", { class: "label", x: L - 4, y: y0 + row - 4, "text-anchor": "end" }, `tier ${name}`));
      let before = 0;
      for (const s of state.samples) {
        const hits = ((s.tiers || {})[node.series] || {})[name] || 0;
        if (hits > 0 && before === 0) {
          const a = s.t - s.dt, active = a + tier.active, cool = active + tier.cooldown;
          if (active > now && i + 1 >= current.tier) { current.tier = i + 1; current.until = active; }
          root.append(svg("rect", { class: "active", x: x(a), y: y0 + 1, width: Math.max(0, x(active) - x(a)), height: row - 2 }));
          if (tier.cooldown > 0) {
            root.append(svg("rect", { class: "cooldown", fill: `url(#${hatchId})`, x: x(active), y: y0 + 1, width: Math.max(0, x(cool) - x(active)), height: row - 2 }));
          }
        }
        if (hits > 0) {
          root.append(svg("rect", { class: "used", x: x(s.t - s.dt), y: y0 + 4, width: Math.max(1, x(s.t) - x(s.t - s.dt)), height: row - 8 }));
        }
        before = hits;
      }
    });
    for (const s of state.samples) {
      if ((s.bursts || {})[node.series]) {
        root.append(svg("rect", { class: "burst", x: x(s.t) - 1, y: n * row + 2, width: 2, height: 8 }));
      }
    }
    root.append(svg("text", { class: "label", x: L - 4, y: n * row + 10, "text-anchor": "end" }, "bursts"));
    container.replaceChildren(root);
    return current;
  }

  // ---------------------------------------------------------------- live data

  function renderCharts() {
    lineChart($("chart-domains"), keyedSeries("domains"), { unit: "/s", totalLabel: "decisions",
      empty: "no decisions yet", title: "decisions per second by domain" });
    lineChart($("chart-rules"), keyedSeries("rules"), { unit: "/s", totalLabel: "decisions",
      empty: "no decisions yet", title: "decisions per second by rule" });
    lineChart($("chart-outcomes"), fieldSeries([
      ["OK", (s) => s.ok, "#2e7d32"],
      ["over limit", (s) => s.over_limit, "#c62828"],
      ["shadow", (s) => s.shadow, "#8e6cc0"],
    ]), { unit: "/s", totalLabel: "decisions", empty: "no decisions yet", title: "outcomes" });
    lineChart($("chart-latency"), fieldSeries([
      ["mean", (s) => s.backend.mean_ms, "#1565c0"],
      ["p99", (s) => s.backend.p99_ms, "#ef6c00"],
      ["max", (s) => s.backend.max_ms, "#90a4ae"],
    ]), { unit: " ms", empty: "no backend calls yet", title: "backend latency" });
    lineChart($("chart-errors"), fieldSeries([
      ["backend", (s) => s.errors.backend + s.backend.errors, "#c62828"],
      ["bad requests", (s) => s.errors.service, "#ef6c00"],
      ["degraded (fail open)", (s) => s.errors.degraded, "#6a1b9a"],
    ]), { unit: "/s", totalLabel: "errors", empty: "no errors", title: "errors" });
    lineChart($("chart-holds"), fieldSeries([
      ["copies held", (s) => (s.holds || {}).copies || 0, "#00838f"],
      ["sessions", (s) => (s.holds || {}).sessions || 0, "#1565c0"],
    ]), { empty: "nothing held", title: "held resources" });
    renderBursts();
  }

  function renderTop(rows) {
    const body = $("top-over-limit").tBodies[0];
    if (!rows.length) {
      body.replaceChildren(el("tr", {}, el("td", { colspan: "2", class: "muted" }, "nothing over the limit")));
      return;
    }
    body.replaceChildren(...rows.map((r) => el("tr", {},
      el("td", {}, r.series), el("td", { class: "num" }, fmt(r.weight)))));
  }

  function renderHolds(h) {
    const t = h.transfers || {};
    $("holds-gauges").replaceChildren(
      ...[["sessions", h.sessions], ["copies held", h.copies_held], ["transfers staged", t.staged],
        ["seized", t.seized], ["expired", t.expired]]
        .map(([k, v]) => el("div", { class: "gauge" }, el("b", {}, fmt(v || 0)), el("span", { class: "muted" }, k))));
    const body = $("holds-groups").tBodies[0];
    const rows = [];
    for (const [node, held] of Object.entries(h.nodes || {})) rows.push([node, "(all)", held]);
    for (const g of h.groups || []) rows.push([g.node, g.group, g.held]);
    body.replaceChildren(...(rows.length ? rows.map((r) => el("tr", {}, el("td", {}, r[0]), el("td", {}, r[1]),
      el("td", { class: "num" }, fmt(r[2])))) : [el("tr", {}, el("td", { colspan: "3", class: "muted" }, "no copies held"))]));
  }

  async function refreshPanels() {
    const list = await getJSON("/console/panels");
    const box = $("panels");
    const ids = list.panels.map((p) => p.id).join(",");
    if (box.dataset.ids !== ids) {
      box.dataset.ids = ids;
      box.replaceChildren(...list.panels.map((p) => el("section", { "data-panel": p.id },
        el("h2", {}, p.title), el("p", { class: "muted note" }), el("table", { class: "table" }))));
    }
    for (const p of list.panels) {
      const section = box.querySelector(`[data-panel="${CSS.escape(p.id)}"]`);
      const data = await getJSON(`/console/panel?id=${encodeURIComponent(p.id)}`);
      section.querySelector(".note").textContent = data.note || "";
      const head = el("tr", {}, ...data.columns.map((c) => el("th", {}, c)));
      const rows = data.rows.map((r) => el("tr", {}, ...r.map((v) => el("td", {}, v))));
      section.querySelector("table").replaceChildren(el("thead", {}, head), el("tbody", {}, ...rows));
    }
  }

  let busy = false;

  async function refresh() {
    if (busy) return;
    busy = true;
    try {
      const data = await getJSON(`/console/data?since=${state.last}`);
      state.span = data.span;
      if (data.config_version !== state.configVersion || data.config_error !== state.configError) {
        renderConfig(await getJSON("/console/config"));
        state.configVersion = data.config_version;
        state.configError = data.config_error;
      }
      state.samples.push(...data.samples);
      if (state.samples.length) state.last = state.samples[state.samples.length - 1].t;
      const cutoff = Date.now() / 1000 - state.span;
      state.samples = state.samples.filter((s) => s.t >= cutoff);
      renderCharts();
      renderTop(data.top_over_limit);
      renderHolds(data.holds);
      await refreshPanels();
      await showTenant();
      $("refresh-state").textContent = `updated ${new Date().toLocaleTimeString()}, every ${REFRESH_MS / 1000}s`;
      $("refresh-state").classList.remove("error");
    } catch (err) {
      $("refresh-state").textContent = `cannot reach the server: ${err.message}`;
      $("refresh-state").classList.add("error");
    } finally {
      busy = false;
    }
  }

  // ---------------------------------------------------------------- explain

  async function explain(event) {
    event.preventDefault();
    const domain = $("explain-domain").value.trim();
    const lines = $("explain-descriptors").value.split("\n").map((s) => s.trim()).filter(Boolean);
    const query = new URLSearchParams({ domain });
    for (const line of lines) query.append("descriptor", line);
    const out = $("explain-result");
    try {
      const response = await fetch(`/explain?${query}`, { cache: "no-store" });
      const answer = await response.json();
      if (!response.ok) {
        out.replaceChildren(el("p", { class: "error", "data-explain": "error" }, answer.error || response.statusText));
        return;
      }
      out.replaceChildren(...answer.descriptors.map(explained));
    } catch (err) {
      out.replaceChildren(el("p", { class: "error", "data-explain": "error" }, String(err.message || err)));
    }
  }

  function explained(d, index) {
    const entries = d.entries.map(([k, v]) => `${k}=${v}`).join(",");
    const steps = (d.walk || []).map((s) => {
      if (s.matched === null) {
        return el("li", { class: "error" }, `${s.key}=${s.value}: no match; this level has: ` +
          (s.expected.join(", ") || "nothing (a leaf)"));
      }
      const how = s.matched === "wildcard" ? `wildcard ${s.pattern}` : s.matched;
      return el("li", {}, `${s.key}=${s.value}: ${how} `, el("span", { class: "muted source" }, s.source));
    });
    return el("div", { class: "explained", "data-explain": "descriptor" },
      el("h3", {}, `descriptor[${index}] ${entries}`),
      steps.length ? el("ol", {}, ...steps) : null,
      d.rule ? el("p", {}, "rule: ", ...ruleParts(d.rule)) : null,
      d.counter_key ? el("p", {}, "counter: ", el("code", {}, d.counter_key)) : null,
      "count" in d ? el("p", { "data-explain": "count" },
        `now: ${d.count} counted, ${d.remaining} left, window resets in ${d.reset_after}s`) : null,
      "tokens" in d ? el("p", { "data-explain": "count" },
        `now: ${d.tokens} tokens, ${d.remaining} left` +
        (d.debt_ms ? `, in debt: ${d.debt_ms}ms to wait` : "")) : null,
      "estimate" in d ? el("p", { "data-explain": "count" },
        `now: ${d.estimate} counted (estimate), ${d.remaining} left, window ends in ${d.reset_after}s`) : null,
      "charged" in d ? el("p", { "data-explain": "count" },
        `now: ${d.charged} charged, ${d.reserved} reserved by ${d.open_reservations} open requests, ` +
        `${d.remaining} left, debt ${d.debt}, window resets in ${d.reset_after}s`) : null,
      d.outcome ? el("p", { class: "outcome" }, d.outcome) : null);
  }

  function ruleParts(rule) {
    const numbers = rule.kind === "fixed_window" || rule.kind === "sliding_window"
      ? `${rule.requests_per_unit} per ${rule.unit}`
      : rule.kind === "token_bucket" ? `size ${rule.size}, ${rule.fill_rate} per second`
      : rule.kind === "burst_tiers" ? rule.tiers : rule.kind === "copies" ? rule.copies
      : rule.kind === "cost_budget" ? `${rule.budget} per ${rule.per}, max debt ${rule.max_debt}` : "";
    return [el("span", { class: `badge kind-${rule.kind}` }, rule.kind.replace("_", " ")),
      ` ${numbers}`, rule.name ? ` (name ${rule.name})` : "",
      rule.shadow_mode ? el("span", { class: "badge flag" }, "shadow") : null,
      rule.quota_mode ? el("span", { class: "badge flag" }, "quota") : null,
      " ", el("span", { class: "muted source" }, `${rule.stats_key} at ${rule.source}`)];
  }

  // ---------------------------------------------------------------- an Envoy route

  // Shown when the server was given Envoy files (/console/config names them).
  async function envoyRoutes() {
    const listing = await getJSON("/explain/envoy");
    $("envoy-route").replaceChildren(...listing.routes.map((r) => el("option", { value: r }, r)));
    $("envoy-form").hidden = false;
  }

  async function explainRoute(event) {
    if (event) event.preventDefault();
    const query = new URLSearchParams({ route: $("envoy-route").value });
    for (const line of $("envoy-headers").value.split("\n").map((s) => s.trim()).filter(Boolean)) {
      query.append("header", line);
    }
    if ($("envoy-address").value.trim()) query.set("remote_address", $("envoy-address").value.trim());
    const out = $("envoy-result");
    try {
      out.replaceChildren(...(await getJSON(`/explain/envoy?${query}`)).entries.map(envoyEntry));
    } catch (err) {
      out.replaceChildren(el("p", { class: "error", "data-explain": "error" }, String(err.message || err)));
    }
  }

  function envoyEntry(e) {
    const descriptors = e.descriptors.map((d, i) => {
      const node = d.explain ? explained(d.explain, i) : el("div", { class: "explained", "data-explain": "descriptor" },
        el("h3", {}, `descriptor[${i}] ` + d.entries.map(([k, v, s]) => `${k}=${v === null ? `<${s}>` : v}`).join(",")),
        el("ul", {},
          ...d.reaches.map((r) => el("li", {}, ...ruleParts(r), r.only_when.length ? ` when ${r.only_when.join(", ")}` : "")),
          ...d.stops.map((s) => el("li", { class: "error" }, s.no_limit ? `${s.no_limit}: no limit there`
            : `stops at level ${s.level}: no (${s.key}, ${s.value}); the tree has: ${s.expected.join(", ") || "nothing"}`))));
      node.querySelector("h3").after(...[...d.conditions.map((w) => `not sent when ${w}`),
        ...(d.dropped_when || []).map((w) => `not sent at all when ${w}`),
        ...(d.absent ? [`when absent: ${d.absent.join(", ")}`] : [])].map((t) => el("p", { class: "muted" }, t)));
      return node;
    });
    return el("div", { class: "explained", "data-envoy": "entry" },
      el("h3", {}, `route ${e.routes.join(", ") || "(every route)"} → domain ${e.domain}`),
      el("p", { class: "muted" }, `sends [${e.sends}]`, el("span", { class: "source" }, ` ${e.file}: ${e.where}`)),
      e.error ? el("p", { class: "error" }, e.error) : null, ...descriptors);
  }

  // ---------------------------------------------------------------- a tenant's tiers

  let tenantQuery = null;

  async function showTenant() {
    const out = $("tenant-result");
    if (!tenantQuery) return;
    try {
      const response = await fetch(`/console/tenant?${tenantQuery}`, { cache: "no-store" });
      const t = await response.json();
      if (!response.ok) {
        out.replaceChildren(el("p", { class: "error" }, t.error || response.statusText));
        return;
      }
      const until = (at) => (at === null ? "–" : `${Math.max(0, at - t.now).toFixed(1)}s`);
      const rows = t.tiers.map((tier, i) => el("tr", { "data-tier": String(i + 1) },
        el("td", {}, `tier ${i + 1}`),
        el("td", { class: `phase-${tier.phase}` }, tier.phase),
        el("td", { class: "num" }, `${tier.hits} / ${tier.limit} per ${tier.window}s`),
        el("td", { class: "num" }, tier.phase === "active" ? until(tier.active_until) : "–"),
        el("td", { class: "num" }, tier.phase === "inactive" ? "–" : until(tier.cooldown_until))));
      out.replaceChildren(
        el("p", { "data-tenant": "current" }, `${t.series}, tenant ${t.tenant}: `,
          el("strong", {}, t.current ? `current tier ${t.current}` : "no tier active"),
          `; ${t.last_second} hit(s) in the last second` +
          (t.hard_limit !== null ? ` (hard limit ${t.hard_limit})` : "")),
        el("table", { class: "table" },
          el("thead", {}, el("tr", {}, ...["tier", "phase", "hits in window", "active for", "cooled down in"]
            .map((h, i) => el("th", { class: i > 1 ? "num" : null }, h)))),
          el("tbody", {}, ...rows)));
    } catch (err) {
      out.replaceChildren(el("p", { class: "error" }, String(err.message || err)));
    }
  }

  $("tenant-form").addEventListener("submit", (event) => {
    event.preventDefault();
    tenantQuery = new URLSearchParams({ domain: $("tenant-domain").value.trim(),
      descriptor: $("tenant-descriptor").value.trim() }).toString();
    showTenant();
  });

  $("explain-form").addEventListener("submit", explain);
  $("envoy-form").addEventListener("submit", explainRoute);
  $("envoy-route").addEventListener("change", () => explainRoute());
  refresh();
  window.setInterval(refresh, REFRESH_MS);
})();
