// The trace UI: a search of the store's traces, a list, one trace's waterfall, and the hotspot view (stage
// self-time shares, critical paths, slow against typical traces). Reads the JSON API of services/traces/web_api.py;
// loads nothing from elsewhere. Every value from the store reaches the page as text (textContent), never as HTML.
"use strict";

(function () {
  const FIELDS = ["pipeline", "status", "degraded", "trigger", "partial", "min_ms", "max_ms", "since", "from", "to",
    "order", "limit"];
  const HEX = /^[0-9a-f]{1,32}$/;
  const SERVICES = ["envoy", "gateway", "cache", "feature", "model"];
  const form = document.getElementById("search");
  const view = document.getElementById("view");
  const errorBox = document.getElementById("error");
  let facetsLoaded = false;
  let generation = 0; // a newer navigation wins over answers still on their way

  // -- small helpers ---------------------------------------------------------------------------------------------

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "class") node.className = value;
      else if (key === "text") node.textContent = value;
      else if (key === "dataset") Object.assign(node.dataset, value);
      else if (key === "style") Object.assign(node.style, value);
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? "" : String(value));
    }
    for (const child of children.flat(Infinity)) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function ms(value) {
    if (value === null || value === undefined) return "";
    return value >= 100 ? value.toFixed(1) : value.toFixed(2);
  }

  function pct(share) {
    const value = share * 100;
    return value > 0 && value < 9.95 ? `${value.toFixed(1)}%` : `${Math.round(value)}%`;
  }

  function pad(n, width = 2) {
    return String(n).padStart(width, "0");
  }

  function clock(epochMs) {
    const d = new Date(epochMs);
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
      `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
  }

  function toLocalInput(epochMs) {
    const d = new Date(epochMs);
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T` +
      `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  }

  function serviceClass(stage) {
    const head = String(stage || "").split(".")[0];
    return "svc-" + (SERVICES.includes(head) ? head : "other");
  }

  function traceHref(traceId, spanId) {
    if (!HEX.test(traceId)) return null;
    return `#/trace/${traceId}` + (spanId && HEX.test(spanId) ? `?span=${spanId}` : "");
  }

  function shortId(id) {
    return String(id).slice(0, 12);
  }

  function badge(text, cls, title) {
    return el("span", { class: `badge ${cls || ""}`, title: title || null, text });
  }

  function showError(message) {
    errorBox.textContent = message;
    errorBox.hidden = !message;
  }

  async function api(path, params) {
    const query = params && params.toString() ? `?${params}` : "";
    const response = await fetch(`api/${path}${query}`, { headers: { Accept: "application/json" } });
    let body = null;
    try {
      body = await response.json();
    } catch (e) {
      body = null;
    }
    if (!response.ok) throw new Error((body && body.error) || `${response.status} ${response.statusText}`);
    return body;
  }

  // -- the search form and the address bar -------------------------------------------------------------------------

  function formParams() {
    const params = new URLSearchParams();
    for (const name of FIELDS) {
      const input = form.elements[name];
      let value = (input.value || "").trim();
      if (!value) continue;
      if (name === "from" || name === "to") {
        const t = new Date(value).getTime();
        if (Number.isNaN(t)) continue;
        value = String(t);
      }
      if (name === "order" && value === "recent") continue;
      params.set(name, value);
    }
    return params;
  }

  function fillForm(params) {
    for (const name of FIELDS) {
      const input = form.elements[name];
      let value = params.get(name) || "";
      if ((name === "from" || name === "to") && value) value = toLocalInput(Number(value));
      if (input.tagName === "SELECT" && value && ![...input.options].some((o) => o.value === value)) {
        input.append(el("option", { value, text: value }));
      }
      input.value = value || (name === "order" ? "recent" : "");
    }
  }

  function route() {
    const hash = location.hash.replace(/^#/, "") || "/traces";
    const [path, query] = hash.split("?", 2);
    return { parts: path.split("/").filter(Boolean), params: new URLSearchParams(query || "") };
  }

  function currentSearch() {
    const { parts, params } = route();
    return parts[0] === "trace" ? new URLSearchParams(sessionStorage.getItem("search") || "") : params;
  }

  async function loadFacets() {
    if (facetsLoaded) return;
    const facets = await api("facets");
    facetsLoaded = true;
    const fill = (name, values) => {
      const select = form.elements[name];
      const chosen = select.value;
      for (const value of values) {
        if (![...select.options].some((o) => o.value === value)) select.append(el("option", { value, text: value }));
      }
      select.value = chosen;
    };
    fill("pipeline", facets.pipelines);
    fill("trigger", facets.triggers);
    document.getElementById("store-info").textContent = `${facets.traces} traces in the store`;
  }

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const { parts } = route();
    const where = parts[0] === "hotspots" ? "hotspots" : "traces";
    const params = formParams();
    const target = `#/${where}` + (params.toString() ? `?${params}` : "");
    if (location.hash === target) render();
    else location.hash = target;
  });

  document.getElementById("search-reset").addEventListener("click", () => {
    const { parts } = route();
    location.hash = parts[0] === "hotspots" ? "#/hotspots" : "#/traces";
  });

  // -- the list ----------------------------------------------------------------------------------------------------

  function marks(row) {
    const out = [];
    out.push(row.error
      ? badge(row.code_name && row.code_name !== "OK" ? row.code_name : "ERROR", "bad")
      : badge("OK", "good"));
    if (row.degraded) out.push(badge(`degraded: ${row.degraded}`, "warn"));
    if (row.partial) out.push(badge("partial", "warn", "a process's buffer rolled over before collection"));
    else if (!row.complete) out.push(badge("incomplete", "quiet", "some parent spans have not arrived"));
    for (const trigger of row.triggers || []) out.push(badge(trigger, "trigger", "why the trace was kept"));
    return out;
  }

  function renderList(data, params) {
    const rows = data.traces;
    const widest = Math.max(1e-9, ...rows.map((r) => r.duration_ms));
    const table = el("table", { id: "trace-list", class: "list" },
      el("thead", {}, el("tr", {},
        el("th", { text: "start" }), el("th", { text: "trace" }), el("th", { text: "pipeline" }),
        el("th", { text: "root" }), el("th", { class: "num", text: "duration ms" }), el("th", { class: "bar-col" }),
        el("th", { class: "num", text: "spans" }), el("th", { text: "marks" }))),
      el("tbody", {}, rows.map((row) => el("tr", {
        class: row.error ? "trace-row is-error" : "trace-row",
        dataset: { traceId: row.trace_id, durationMs: row.duration_ms },
      },
      el("td", { class: "mono muted", text: clock(row.start_at_ms) }),
      el("td", { class: "mono" }, el("a", { href: traceHref(row.trace_id), class: "trace-link", text: shortId(row.trace_id),
        title: row.trace_id })),
      el("td", { text: row.pipeline || "" }),
      el("td", { class: "mono", text: row.root ? row.root.stage : "?", title: row.root ? row.root.name : null }),
      el("td", { class: "num mono", text: ms(row.duration_ms) }),
      el("td", { class: "bar-col" }, el("div", { class: "mini-bar", style: { width: `${(100 * row.duration_ms) / widest}%` } })),
      el("td", { class: "num", text: row.span_count }),
      el("td", { class: "marks" }, marks(row))))));
    const hotspots = `#/hotspots` + (params.toString() ? `?${params}` : "");
    view.replaceChildren(
      el("p", { class: "summary", id: "list-summary" },
        `${data.total} trace${data.total === 1 ? "" : "s"} match; showing ${rows.length}. `,
        el("a", { href: hotspots, text: "Hotspots of these traces →" })),
      rows.length ? table : el("p", { class: "empty", text: "No traces match this search." }));
  }

  // -- one trace -------------------------------------------------------------------------------------------------

  function keyValues(object) {
    const entries = Object.entries(object || {});
    if (!entries.length) return el("p", { class: "muted", text: "none" });
    return el("table", { class: "kv" }, el("tbody", {}, entries.map(([key, value]) => el("tr", {},
      el("th", { text: key }),
      el("td", { text: typeof value === "string" ? value : JSON.stringify(value) })))));
  }

  function spanDetail(span) {
    const sections = [];
    sections.push(el("div", { class: "ids mono muted" },
      `span ${span.span_id}` + (span.parent_span_id ? ` · parent ${span.parent_span_id}` : " · root") +
      ` · ${span.kind} · ${span.service}` + (span.orphan ? " · parent not in the store" : "")));
    if (span.error || span.status_message) {
      sections.push(el("p", { class: "bad-text" }, `status ERROR${span.status_message ? `: ${span.status_message}` : ""}`));
    }
    sections.push(el("h4", { text: "Attributes" }), keyValues(span.attributes));
    if (span.events.length) {
      sections.push(el("h4", { text: `Events (${span.events.length})` }),
        el("table", { class: "events" }, el("tbody", {}, span.events.map((e) => el("tr", {},
          el("td", { class: "num mono", text: `+${ms(e.at_ms)} ms` }),
          el("td", { class: "mono", text: e.name }),
          el("td", {}, keyValues(e.attributes)))))));
    }
    if (span.links.length) {
      const what = span.batch
        ? `Batched call of ${span.members} request${span.members === 1 ? "" : "s"} (links to each member's span)`
        : `Links (${span.links.length})`;
      sections.push(el("h4", { text: what }), el("ol", { class: "links" }, span.links.map((link) => el("li", {},
        el("a", { href: traceHref(link.trace_id, link.span_id), class: "mono", text: `${shortId(link.trace_id)}/${link.span_id}` }),
        Object.keys(link.attributes).length ? el("span", { class: "muted", text: ` ${JSON.stringify(link.attributes)}` }) : null))));
    }
    if (span.linked_by.length) {
      sections.push(el("h4", { text: "Linked from" }), el("ul", { class: "links" }, span.linked_by.map((by) => el("li", {},
        by.batch ? `batched with ${Math.max(0, by.members - 1)} other request${by.members === 2 ? "" : "s"} in ` : "linked from ",
        el("a", { href: traceHref(by.trace_id, by.span_id), class: "mono", text: `${shortId(by.trace_id)}/${by.span_id}` }),
        ` (${by.name})`))));
    }
    const shared = Object.entries(span.shared_ms || {});
    if (shared.length) {
      sections.push(el("h4", { text: "Self time spent in the batched call's stages" }),
        el("ul", { class: "links" }, shared.map(([stage, value]) => el("li", { class: "mono", text: `${stage} ${ms(value)} ms` }))));
    }
    return el("div", { class: "wf-detail", dataset: { spanId: span.span_id } }, sections);
  }

  function toggleDetail(row, span) {
    const next = row.nextElementSibling;
    if (next && next.classList.contains("wf-detail")) {
      next.remove();
      row.classList.remove("open");
      return;
    }
    row.classList.add("open");
    row.after(spanDetail(span));
  }

  function ticks(durationMs) {
    return el("div", { class: "wf-axis" }, [0, 0.25, 0.5, 0.75, 1].map((f) =>
      el("span", { class: "tick", style: { left: `${f * 100}%` }, text: `${ms(f * durationMs)} ms` })));
  }

  function renderTrace(t, selected) {
    const total = Math.max(t.duration_ms, 1e-9);
    const maxStage = Math.max(1e-9, ...t.stages.map((s) => s.self_ms));
    const header = el("section", { class: "trace-head" },
      el("h2", {}, "Trace ", el("span", { class: "mono", id: "trace-id", text: t.trace_id })),
      el("p", { class: "facts" },
        el("span", { text: clock(t.start_at_ms) }),
        el("span", { class: "strong", text: `${ms(t.duration_ms)} ms` }),
        el("span", { text: `${t.span_count} spans` }),
        t.pipeline ? el("span", { text: `pipeline ${t.pipeline}` }) : null,
        el("span", { class: "marks" }, marks(t))));
    const stages = el("section", { class: "panel" },
      el("h3", { text: "Self time by stage" }),
      el("div", { id: "stage-self", class: "stage-bars" }, t.stages.map((s, i) => el("div", {
        class: `stage-row${i === 0 ? " top" : ""}`, dataset: { stage: s.stage, selfMs: s.self_ms },
      },
      el("span", { class: "stage-name mono", text: s.stage }),
      el("span", { class: "stage-track" }, el("span", {
        class: `stage-fill ${serviceClass(s.stage)}`, style: { width: `${(100 * s.self_ms) / maxStage}%` },
      })),
      el("span", { class: "num mono", text: `${ms(s.self_ms)} ms · ${pct(s.self_ms / total)}` })))));
    const path = el("section", { class: "panel" },
      el("h3", { text: "Critical path" }),
      el("p", { id: "critical-path", class: "path" }, t.critical_path.map((step, i) => [
        i ? el("span", { class: "arrow", text: "→" }) : null,
        el("span", { class: `chip ${serviceClass(step.stage)}`, text: `${step.stage} ${ms(step.critical_ms)} ms` })])));
    const onPath = new Set(t.critical_path.filter((p) => p.critical_ms > 0).map((p) => p.span_id));
    const rows = t.spans.map((span) => {
      const left = (100 * span.start_ms) / total;
      const width = Math.max(0.15, (100 * span.duration_ms) / total);
      const largest = span.span_id === t.largest_self_span;
      const classes = ["wf-row", largest ? "largest" : "", span.error ? "is-error" : "", onPath.has(span.span_id) ? "critical" : ""];
      const name = el("span", { class: "wf-name", style: { paddingLeft: `${span.depth * 14}px` } },
        span.depth ? el("span", { class: "elbow", text: "└ " }) : null,
        el("span", { class: "span-name", text: span.name }),
        span.kind === "server" || span.kind === "client" ? el("span", { class: "muted", text: ` ${span.kind}` }) : null,
        span.links.length || span.linked_by.length ? el("span", { class: "link-mark", title: "has links", text: " ↔" }) : null,
        span.events.length ? el("span", { class: "event-mark", title: "has events", text: ` ◆${span.events.length}` }) : null);
      const row = el("div", {
        class: classes.filter(Boolean).join(" "),
        role: "button",
        tabindex: "0",
        dataset: { spanId: span.span_id, stage: span.stage, selfMs: span.self_ms, largest: largest ? "true" : null },
        title: `${span.name} (${span.service}): total ${ms(span.duration_ms)} ms, self ${ms(span.self_ms)} ms`,
      },
      name,
      el("span", { class: "wf-stage mono", text: span.stage }),
      el("span", { class: "num mono", text: ms(span.duration_ms) }),
      el("span", { class: "num mono wf-self" }, largest
        ? el("span", { class: "hot-pill", title: "the largest self time in this trace", text: ms(span.self_ms) })
        : ms(span.self_ms)),
      el("span", { class: "wf-track" },
        el("span", { class: `wf-bar ${serviceClass(span.stage)}`, style: { left: `${left}%`, width: `${width}%` } }),
        span.events.map((e) => el("span", { class: "wf-event", style: { left: `${(100 * e.at_ms) / total}%` }, title: e.name }))));
      const open = () => toggleDetail(row, span);
      row.addEventListener("click", open);
      row.addEventListener("keydown", (event) => {
        if (event.key === "Enter" || event.key === " ") {
          event.preventDefault();
          open();
        }
      });
      return row;
    });
    const waterfall = el("section", { class: "panel" },
      el("h3", { text: "Waterfall" }, el("span", { class: "muted hint", text: " · click a span for its attributes, events and links" })),
      el("div", { id: "waterfall", class: "waterfall" },
        el("div", { class: "wf-row wf-header" },
          el("span", { text: "span" }), el("span", { text: "stage" }), el("span", { class: "num", text: "total ms" }),
          el("span", { class: "num", text: "self ms" }), ticks(t.duration_ms)),
        rows));
    view.replaceChildren(header, el("div", { class: "two" }, stages, path), waterfall);
    if (selected) {
      const row = view.querySelector(`.wf-row[data-span-id="${selected}"]`);
      const span = t.spans.find((s) => s.span_id === selected);
      if (row && span) {
        toggleDetail(row, span);
        row.scrollIntoView({ block: "center" });
      }
    }
  }

  // -- hotspots ----------------------------------------------------------------------------------------------------

  function shareCell(share, top) {
    return el("td", { class: "share" },
      el("span", { class: "share-track" }, el("span", { class: "share-fill", style: { width: `${(100 * share) / top}%` } })),
      el("span", { class: "num mono", text: pct(share) }));
  }

  function renderHotspots(data, params) {
    if (!data.traces) {
      view.replaceChildren(el("p", { class: "empty", text: "No traces match this search." }));
      return;
    }
    const topShare = Math.max(1e-9, ...data.stages.map((s) => Math.max(s.share, s.p99_share)));
    const hot = data.hotspot;
    const list = `#/traces` + (params.toString() ? `?${params}` : "");
    const summary = el("p", { class: "summary" },
      `${data.traces} traces; end-to-end p50 ${ms(data.e2e_p50_ms)} ms, p99 ${ms(data.e2e_p99_ms)} ms; ` +
      `${data.p99_traces} at or above p99. `, el("a", { href: list, text: "← the traces" }));
    const line = el("p", { id: "hotspot", class: "hotspot", dataset: { stage: hot ? hot.stage : "" } },
      hot ? `hotspot: ${hot.stage} (${pct(hot.p99_share)} of p99)` : "hotspot: none");
    const table = el("section", { class: "panel" },
      el("h3", { text: "Stage self time: share of end-to-end time, overall and over the p99-slowest traces" }),
      el("table", { id: "stage-table", class: "list" },
        el("thead", {}, el("tr", {}, el("th", { text: "stage" }), el("th", { class: "num", text: "traces" }),
          el("th", { class: "num", text: "self p50 ms" }), el("th", { class: "num", text: "self p99 ms" }),
          el("th", { text: "share" }), el("th", { text: "share of p99" }))),
        el("tbody", {}, data.stages.map((s) => el("tr", { dataset: { stage: s.stage } },
          el("td", { class: "mono" }, el("span", { class: `dot ${serviceClass(s.stage)}` }), s.stage),
          el("td", { class: "num", text: s.traces }),
          el("td", { class: "num mono", text: ms(s.self_p50_ms) }),
          el("td", { class: "num mono", text: ms(s.self_p99_ms) }),
          shareCell(s.share, topShare), shareCell(s.p99_share, topShare))))));
    const paths = el("section", { class: "panel" },
      el("h3", { text: "Critical paths of the slowest traces" }),
      el("ul", { id: "critical-paths", class: "paths" }, data.slowest.map((t) => el("li", {},
        el("a", { href: traceHref(t.trace_id), class: "mono", text: shortId(t.trace_id) }),
        el("span", { class: "strong", text: ` ${ms(t.duration_ms)} ms ` }),
        t.path.map((step, i) => [i ? el("span", { class: "arrow", text: "→" }) : null,
          el("span", { class: `chip ${serviceClass(step.stage)}`, text: `${step.stage} ${ms(step.critical_ms)}` })])))));
    const c = data.comparison;
    const maxDelta = Math.max(1e-9, ...c.stages.map((s) => Math.abs(s.delta_ms)));
    const compare = el("section", { class: "panel" },
      el("h3", { text: "Slow against typical traces, by stage (mean self time per trace)" }),
      el("p", { class: "muted" },
        `slow: ${c.slow.traces} traces at or above p90 (${ms(c.slow.from_ms)} ms) and past p75, ` +
        `mean ${ms(c.slow.mean_ms)} ms; ` +
        `typical: ${c.typical.traces} traces from p25 to p75 (${ms(c.typical.from_ms)}–${ms(c.typical.to_ms)} ms), ` +
        `mean ${ms(c.typical.mean_ms)} ms`),
      el("table", { id: "comparison", class: "list" },
        el("thead", {}, el("tr", {}, el("th", { text: "stage" }), el("th", { class: "num", text: "typical ms" }),
          el("th", { class: "num", text: "slow ms" }), el("th", { class: "num", text: "slow − typical" }), el("th", {}))),
        el("tbody", {}, c.stages.map((s) => el("tr", { dataset: { stage: s.stage, deltaMs: s.delta_ms } },
          el("td", { class: "mono" }, el("span", { class: `dot ${serviceClass(s.stage)}` }), s.stage),
          el("td", { class: "num mono", text: ms(s.typical_ms) }),
          el("td", { class: "num mono", text: ms(s.slow_ms) }),
          el("td", { class: "num mono", text: `${s.delta_ms >= 0 ? "+" : "−"}${ms(Math.abs(s.delta_ms))}` }),
          el("td", { class: "share" }, el("span", { class: "share-track" }, el("span", {
            class: s.delta_ms >= 0 ? "delta-fill" : "delta-fill less",
            style: { width: `${(100 * Math.abs(s.delta_ms)) / maxDelta}%` },
          }))))))));
    view.replaceChildren(summary, line, table, el("div", { class: "two" }, paths, compare));
  }

  // -- navigation --------------------------------------------------------------------------------------------------

  async function render() {
    const mine = ++generation;
    const { parts, params } = route();
    const search = currentSearch().toString();
    for (const where of ["traces", "hotspots"]) {  // both views of the same search
      const link = document.getElementById(`nav-${where}`);
      link.classList.toggle("active", (parts[0] === "hotspots") === (where === "hotspots"));
      link.setAttribute("href", `#/${where}` + (search ? `?${search}` : ""));
    }
    showError("");
    view.classList.add("loading");
    try {
      await loadFacets();
      if (parts[0] === "trace" && parts[1]) {
        fillForm(currentSearch());
        const id = parts[1].toLowerCase();
        if (!HEX.test(id)) throw new Error(`${parts[1]} is not a trace id`);
        const t = await api(`traces/${id}`);
        if (mine === generation) renderTrace(t, params.get("span"));
        document.title = `trace ${shortId(t.trace_id)} · meshserve traces`;
      } else if (parts[0] === "hotspots") {
        fillForm(params);
        sessionStorage.setItem("search", params.toString());
        const data = await api("hotspots", params);
        if (mine === generation) renderHotspots(data, params);
        document.title = "hotspots · meshserve traces";
      } else {
        fillForm(params);
        sessionStorage.setItem("search", params.toString());
        const data = await api("traces", params);
        if (mine === generation) renderList(data, params);
        document.title = "meshserve traces";
      }
    } catch (err) {
      if (mine === generation) {
        showError(err.message);
        view.replaceChildren();
      }
    } finally {
      if (mine === generation) {
        view.classList.remove("loading");
        document.body.dataset.ready = String(generation);
      }
    }
  }

  window.addEventListener("hashchange", render);
  render();
})();
