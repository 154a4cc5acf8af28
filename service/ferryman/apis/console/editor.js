// The console's config editor: documents edited through the config API (/api/v1), checked
// before saving with the problems shown at their lines, the history with diffs and rollback,
// and a counter reset on each explained descriptor. Read-only without a write token.
"use strict";

(function () {
  const KEY = "ferryman-admin-token";
  const ed = { token: sessionStorage.getItem(KEY) || "", role: "", version: 0, readOnly: null,
    problems: [], checkTimer: 0 };

  function $(id) { return document.getElementById(id); }

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    for (const child of children) node.append(child instanceof Node ? child : String(child));
    return node;
  }

  async function api(method, path, body, headers) {
    const response = await fetch(`/api/v1${path}`, {
      method, body, cache: "no-store",
      headers: { Authorization: `Bearer ${ed.token}`, ...(headers || {}) },
    });
    const kind = response.headers.get("Content-Type") || "";
    const data = kind.startsWith("application/json") ? await response.json() : await response.text();
    return { status: response.status, etag: response.headers.get("ETag"), data };
  }

  function writable() { return ed.role === "write" && !ed.readOnly; }

  async function login(event) {
    if (event) event.preventDefault();
    ed.token = $("editor-token").value.trim() || ed.token;
    sessionStorage.setItem(KEY, ed.token);
    const got = await api("GET", "/config");
    if (got.status !== 200) {
      $("editor-status").textContent = got.status === 404 ? "the config API is off on this server"
        : `refused (${got.status}): ${got.data.error || got.data}`;
      $("editor-body").hidden = true;
      return;
    }
    ed.role = got.data.you.role;
    ed.readOnly = got.data.read_only;
    ed.version = got.data.version;
    $("editor-status").textContent = `${got.data.you.user} (${ed.role}), version ${ed.version}` +
      (ed.readOnly ? `; read-only: ${ed.readOnly}` : "") +
      (ed.role !== "write" ? "; read-only: this token may not write" : "");
    const select = $("editor-doc");
    const chosen = select.value;
    select.replaceChildren(...got.data.documents.map((d) => el("option", { value: d.name }, d.name)));
    if (chosen) select.value = chosen;
    $("editor-body").hidden = false;
    $("editor-text").readOnly = !writable();
    $("editor-save").hidden = !writable();
    await open();
    await history();
  }

  async function open() {
    const name = $("editor-doc").value;
    if (!name) return;
    const got = await api("GET", `/config/${encodeURIComponent(name)}`);
    if (got.status === 200) {
      $("editor-text").value = got.data;
      ed.version = parseInt((got.etag || "0").replace(/"/g, ""), 10);
    }
    ed.problems = [];
    draw();
  }

  function draw() {
    const lines = $("editor-text").value.split("\n").length;
    const bad = new Set(ed.problems.map((p) => p.line));
    const gutter = $("editor-gutter");
    gutter.replaceChildren();
    for (let i = 1; i <= lines; i++) {
      gutter.append(el("span", bad.has(i) ? { class: "bad", "data-line": i } : { "data-line": i },
        String(i)), "\n");
    }
    $("editor-problems").replaceChildren(...ed.problems.map((p) =>
      el("li", { "data-line": p.line === null ? "" : p.line },
        p.line === null ? p.text : `line ${p.line}: ${p.path ? p.path + ": " : ""}${p.message}`)));
  }

  async function check() {
    const name = $("editor-doc").value;
    const got = await api("POST", "/validate",
      JSON.stringify({ documents: { [name]: $("editor-text").value } }),
      { "Content-Type": "application/json" });
    if (got.status === 200) {
      ed.problems = got.data.problems.filter((p) => p.file === name || !p.file);
      draw();
    }
  }

  function edited() {
    draw();
    clearTimeout(ed.checkTimer);
    ed.checkTimer = setTimeout(check, 300);
  }

  async function save() {
    const name = $("editor-doc").value;
    const got = await api("PUT", `/config/${encodeURIComponent(name)}`, $("editor-text").value,
      { "If-Match": `"${ed.version}"`, "Content-Type": "application/yaml" });
    const result = $("editor-result");
    if (got.status === 200) {
      result.textContent = `saved: version ${got.data.version}`;
      ed.problems = [];
      await login();
    } else if (got.status === 400 && got.data.problems) {
      ed.problems = got.data.problems;
      result.textContent = "not saved: fix the problems";
      draw();
    } else {
      result.textContent = `not saved (${got.status}): ${got.data.error || got.data}`;
    }
  }

  async function history() {
    const got = await api("GET", "/history");
    if (got.status !== 200) return;
    const rows = got.data.history.slice(0, 30).map((e) => {
      const row = el("div", { class: "history-entry", "data-version": e.version },
        `${e.version} ${e.kind} by ${e.author}: ${e.summary} `);
      if (e.kind !== "reset" && e.version > 1) {
        const diff = el("button", { type: "button", class: "history-diff" }, "diff");
        diff.addEventListener("click", async () => {
          const d = await api("GET", `/diff?from=${e.version - 1}&to=${e.version}`);
          $("editor-diff").textContent = d.status === 200 ? d.data : (d.data.error || d.data);
        });
        row.append(diff);
      }
      if (e.kind !== "reset" && writable() && e.version !== got.data.current) {
        const back = el("button", { type: "button", class: "history-rollback" }, "rollback");
        back.addEventListener("click", async () => {
          const r = await api("POST", "/rollback", JSON.stringify({ version: e.version }),
            { "Content-Type": "application/json" });
          $("editor-result").textContent = r.status === 200 ? `rolled back: version ${r.data.version}`
            : `not rolled back (${r.status}): ${r.data.error || r.data}`;
          await login();
        });
        row.append(back);
      }
      return row;
    });
    $("editor-history").replaceChildren(...rows);
  }

  // A reset button on each explained descriptor (write tokens only).
  function resetButtons() {
    if (!writable()) return;
    const lines = $("explain-descriptors").value.split("\n").map((s) => s.trim()).filter(Boolean);
    const domain = $("explain-domain").value.trim();
    document.querySelectorAll("#explain-result [data-explain=descriptor]").forEach((node, i) => {
      if (node.querySelector(".reset-counter") || !lines[i]) return;
      const descriptor = lines[i].split(",").map((part) => {
        const at = part.indexOf("=");
        return { key: part.slice(0, at), value: part.slice(at + 1) };
      });
      const button = el("button", { type: "button", class: "reset-counter" }, "Reset counters");
      button.addEventListener("click", async () => {
        const r = await api("POST", "/counters/reset", JSON.stringify({ domain, descriptor }),
          { "Content-Type": "application/json" });
        button.textContent = r.status === 200 ? (r.data.held ? "reset" : "nothing was counted")
          : `refused (${r.status}): ${r.data.error || r.data}`;
      });
      node.append(button);
    });
  }

  $("editor-login").addEventListener("submit", login);
  $("editor-doc").addEventListener("change", open);
  $("editor-text").addEventListener("input", edited);
  $("editor-save").addEventListener("click", save);
  new MutationObserver(resetButtons).observe($("explain-result"), { childList: true });
  if (ed.token) login();
})();
