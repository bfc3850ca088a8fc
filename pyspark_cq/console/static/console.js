// pyspark-cq console: loads /api/state, then follows /api/events (server-sent events).
// Charts: plotly.js served from the installed plotly package (no CDN).
"use strict";

const MAX_POINTS = 600;
const TRANSITION = ["window", "lower", "upper", "granularity"];
const S = { seq: 0, queries: {}, qkey: "", charts: {}, control: [], memoryBudget: null };

function fmtDuration(us) {
  if (typeof us !== "number") return String(us);
  const units = [["h", 3.6e9], ["min", 6e7], ["s", 1e6], ["ms", 1e3]];
  for (const [u, size] of units) if (Math.abs(us) >= size) return `${+(us / size).toPrecision(4)} ${u}`;
  return `${us} µs`;
}
function fmtBytes(b) {
  if (b == null) return "–";
  const units = ["B", "kB", "MB", "GB", "TB"]; let i = 0;
  while (Math.abs(b) >= 1000 && i < units.length - 1) { b /= 1000; i++; }
  return `${+b.toPrecision(3)} ${units[i]}`;
}
function fmtValue(param, v) {
  if (TRANSITION.includes(param)) return fmtDuration(v);
  if (typeof v === "object" && v !== null) return JSON.stringify(v);
  return String(v);
}
function fmtParams(p) {
  return Object.entries(p || {}).map(([k, v]) => `${k}=${fmtValue(k, v)}`).join(", ");
}
function fmtTime(t) {
  const d = typeof t === "number" ? new Date(t * 1000) : new Date(t);
  return isNaN(d) ? String(t) : d.toLocaleTimeString();
}
function el(tag, attrs = {}, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}
function num(v) { return v == null ? null : v; }

// ---- charts -----------------------------------------------------------------------------------

function series(q) {
  const ops = q.operators;
  const op = (o, k) => (p) => (p.operators && p.operators[o] ? num(p.operators[o][k]) : null);
  const dur = [{ name: "batch duration (s)", f: (p) => num(p.duration) }];
  if (q.deadline != null) dur.push({ name: `deadline ${q.deadline} s`, f: () => q.deadline, dash: true });
  if (q.period != null) dur.push({ name: `period ${q.period} s`, f: () => q.period, dash: true });
  return {
    rate: { title: "input rate (rows/s)", y: "rows/s", traces: [{ name: `${q.name} λ`, f: (p) => num(p.input_rate) }]
      .concat(ops.map((o) => ({ name: `${o} λ`, f: op(o, "input_rate") }))) },
    state: { title: "operator state" + (S.memoryBudget ? ` (memory budget ${fmtBytes(S.memoryBudget)})` : ""),
      y: "rows", y2: "bytes", traces: ops.flatMap((o) => [
        { name: `${o} rows`, f: op(o, "state_rows") },
        { name: `${o} bytes`, f: op(o, "state_bytes"), yaxis: "y2" }]) },
    duration: { title: "batch duration vs deadline / period (s)", y: "seconds", traces: dur },
    counts: { title: "late / shed / malformed rows (since start)", y: "rows", traces: ops.flatMap((o) => [
      { name: `${o} late`, f: op(o, "late") },
      { name: `${o} shed`, f: op(o, "shed") },
      { name: `${o} malformed`, f: op(o, "malformed") }]) },
  };
}

function makeChart(div, spec, points) {
  const traces = spec.traces.map((t) => ({
    name: t.name, mode: "lines+markers", marker: { size: 4 }, yaxis: t.yaxis || "y",
    line: t.dash ? { dash: "dash" } : {},
    x: points.map((p) => new Date(p.t * 1000)), y: points.map(t.f),
  }));
  Plotly.newPlot(div, traces, chartLayout(spec), { displayModeBar: false, responsive: true });
  div.dataset.points = String(points.length);
}

// Ticks as times of day only: Plotly's default date axis adds a second line with the date under the first
// tick, which ran into the legend below the axis; the date is in the hover label. Every axis names its unit.
function chartLayout(spec) {
  const layout = {
    title: { text: spec.title, font: { size: 13 } }, margin: { l: 60, r: spec.y2 ? 60 : 10, t: 30, b: 30 },
    legend: { orientation: "h", y: -0.25, font: { size: 10 } },
    xaxis: { type: "date", tickformat: "%H:%M:%S", hoverformat: "%Y-%m-%d %H:%M:%S" },
    yaxis: { rangemode: "tozero", title: { text: spec.y || "" } },
  };
  if (spec.y2) layout.yaxis2 = { overlaying: "y", side: "right", title: { text: spec.y2 }, rangemode: "tozero" };
  return layout;
}

function extendChart(div, spec, points) {
  if (!points.length) return;
  const idx = spec.traces.map((_, i) => i);
  Plotly.extendTraces(div, {
    x: spec.traces.map(() => points.map((p) => new Date(p.t * 1000))),
    y: spec.traces.map((t) => points.map(t.f)),
  }, idx, MAX_POINTS);
  div.dataset.points = String(Number(div.dataset.points || 0) + points.length);
}

// ---- queries ----------------------------------------------------------------------------------

function buildQueries(st) {
  const box = document.getElementById("queries");
  box.replaceChildren();
  S.charts = {};
  for (const q of Object.values(st.queries).sort((a, b) => a.name.localeCompare(b.name))) {
    const card = el("div", { class: "query", id: `query-${q.name}` });
    card.append(el("h2", {}, `query ${q.name}` + (q.group ? ` (member of group ${q.group})` : "")));
    card.append(el("div", { class: "facts", id: `facts-${q.name}` }));
    const plan = el("div", { class: "plan-box", id: `plan-${q.name}` });
    card.append(plan);
    const charts = el("div", { class: "charts" });
    card.append(charts);
    box.append(card);
    const specs = series(q);
    const points = st.samples.filter((p) => p.query === q.name);
    S.charts[q.name] = {};
    for (const [kind, spec] of Object.entries(specs)) {
      const div = el("div", { class: "chart", id: `chart-${q.name}-${kind}` });
      charts.append(div);
      makeChart(div, spec, points);
      S.charts[q.name][kind] = { div, spec };
    }
    updateFacts(q, points[points.length - 1]);
  }
}

function updateFacts(q, p) {
  const f = document.getElementById(`facts-${q.name}`);
  if (!f) return;
  const parts = [`operators: ${q.operators.join(", ") || "–"}`];
  if (q.period != null) parts.push(`period ${q.period} s, deadline ${q.deadline} s`);
  if (p) parts.push(`batches: ${p.batches}`, `λ: ${p.input_rate == null ? "–" : p.input_rate.toFixed(1)} rows/s`,
    `batch duration: ${p.duration == null ? "–" : p.duration.toFixed(2)} s`);
  f.textContent = parts.join(" · ");
  f.dataset.batches = p ? String(p.batches) : "0";
}

function addSamples(samples) {
  const fresh = samples.filter((p) => p.seq > S.seq);
  if (!fresh.length) return;
  S.seq = Math.max(...fresh.map((p) => p.seq));
  const byQuery = {};
  for (const p of fresh) (byQuery[p.query] = byQuery[p.query] || []).push(p);
  for (const [name, points] of Object.entries(byQuery)) {
    for (const { div, spec } of Object.values(S.charts[name] || {})) extendChart(div, spec, points);
    if (S.queries[name]) updateFacts(S.queries[name], points[points.length - 1]);
  }
}

// ---- query groups ------------------------------------------------------------------------------

// One panel per registered group: its Spark query, its state (each shared slice table counted once), its slice
// classes, and a row per member: status, mode, the query whose slices it shares, rows delivered, counters, and its
// own stream's watermark and delay (with several streams the group's Spark watermark is the group clock's).
function groupRows(g) {
  const n = (v) => (v == null ? "–" : Number(v).toLocaleString());
  return Object.entries(g.members || {}).map(([name, m]) => [
    name, m.status, m.mode === "alone" && m.why ? `alone (${m.why})` : m.mode,
    m.slices == null ? "–" : (m.slices === name ? "its own" : m.slices),
    n(m.rows), n(m.input_rows), n(m.late_rows), n(m.malformed_rows),
    m.state_rows === 0 && m.slices && m.slices !== name ? `in ${m.slices}'s` : n(m.state_rows),
    m.state_rows === 0 && m.slices && m.slices !== name ? "" : fmtBytes(m.state_bytes),
    m.start ? fmtTime(m.start) : "group start",
    m.watermark ? `${m.watermark.slice(0, 19).replace("T", " ")} UTC` : "–",
    m.watermark_delay == null ? "–" : fmtDuration(m.watermark_delay * 1e6)]);
}

function renderGroups(groups) {
  const box = document.getElementById("groups");
  box.replaceChildren();
  for (const g of Object.values(groups || {}).sort((a, b) => a.name.localeCompare(b.name))) {
    const card = el("div", { class: "panel group", id: `group-${g.name}` });
    card.append(el("h2", {}, `query group ${g.name}`));
    const classes = (g.slice_classes || []).filter((c) => c.length > 1).map((c) => c.join(" + ")).join("; ");
    card.append(el("div", { class: "facts" }, [
      g.running ? "running" : "not running", `Spark query ${g.query_id || "–"}`, `${g.shards} shards`,
      `state ${Number(g.state_rows || 0).toLocaleString()} rows, ${fmtBytes(g.state_bytes || 0)} (each shared ` +
        "slice table counted once)",
      `sharing slices: ${classes || "none"}`].join(" · ")));
    const table = el("table", { id: `group-table-${g.name}` });
    const head = el("tr");
    for (const h of ["query", "status", "mode", "slices of", "rows delivered", "input rows", "late", "malformed",
      "state rows", "state bytes", "start", "stream watermark", "delay"]) head.append(el("th", {}, h));
    const thead = el("thead");
    thead.append(head);
    const body = el("tbody");
    for (const cells of groupRows(g)) {
      const tr = el("tr");
      for (const c of cells) tr.append(el("td", {}, String(c)));
      body.append(tr);
    }
    table.append(thead, body);
    card.append(table);
    box.append(card);
  }
}

// ---- tables -----------------------------------------------------------------------------------

function fillTable(id, rows) {
  const body = document.querySelector(`#${id} tbody`);
  body.replaceChildren(...rows.map((cells) => {
    const tr = el("tr");
    for (const c of cells) tr.append(c instanceof Node ? c : el("td", {}, c == null ? "" : String(c)));
    return tr;
  }));
}

// The decisions log, newest first: time, round, policy, kind, decisions, applied, error. Consecutive rounds of
// one policy that decided nothing (and failed nothing) share one line with their count and time span, so that
// the rounds that did something are not lost among screenfuls of "(none)".
function decisionRows(decisions) {
  const groups = [];
  for (const d of (decisions || []).slice().reverse()) {
    const decs = (d.decisions || []).map((x) => `${x.operator}: ${fmtParams(x.changes)}`).join("; ");
    const err = d.error || (d.rejected ? `rejected: ${d.rejected}` : "");
    const idle = !decs && !err;
    const g = groups[groups.length - 1];
    if (idle && g && g.idle && g.policy === d.policy && g.kind === d.kind) {
      g.count += 1;
      g.oldest = d;
      continue;
    }
    groups.push({ idle, policy: d.policy, kind: d.kind, count: 1, oldest: d, newest: d, decs, err });
  }
  return groups.map((g) => (g.count === 1
    ? [fmtTime(g.newest.time), g.newest.round, g.policy, g.kind, g.decs || "(none)", g.newest.applied ? "yes" : "no",
      g.err]
    : [`${fmtTime(g.oldest.time)} – ${fmtTime(g.newest.time)}`, `${g.oldest.round}–${g.newest.round}`, g.policy,
      g.kind, `(none) × ${g.count} rounds`, "–", ""]));
}

function renderLogs(st) {
  S.memoryBudget = st.memory_budget;
  S.control = st.control || [];
  renderGroups(st.groups);
  fillTable("control-table", S.control.map((r) => [r.operator, r.query, r.version, fmtParams(r.params)]));
  fillTable("change-log", (st.changes || []).slice().reverse().map((c) => {
    const what = Object.keys(c.new || {}).concat(Object.keys(c.old || {}).filter((k) => !(k in (c.new || {}))))
      .map((k) => `${k}: ${c.old && k in c.old && c.old[k] != null ? fmtValue(k, c.old[k]) : "–"} → ` +
        `${c.new && k in c.new ? fmtValue(k, c.new[k]) : "–"}`).join("; ");
    const at = Object.entries(c.at || {}).filter(([, v]) => v != null)
      .map(([k, v]) => `${k} @ ${new Date(v / 1000).toLocaleTimeString()}`).join("; ");
    return [c.version, fmtTime(c.time), c.who, c.operator, c.action, what, at, c.reason];
  }));
  fillTable("decisions-log", decisionRows(st.decisions).map((cells) =>
    cells.slice(0, 6).concat([el("td", { class: cells[6] ? "bad" : "" }, cells[6])])));
  for (const q of Object.values(st.queries || {})) {
    const box = document.getElementById(`plan-${q.name}`);
    if (box) box.innerHTML = q.plan_svg || "<em>no plan registered</em>";
  }
  const pol = (st.policies || []).join(", ") || "none";
  document.getElementById("summary").textContent =
    `policies: ${pol}` + (st.memory_budget ? ` · memory budget ${fmtBytes(st.memory_budget)}` : "") +
    (st.error ? ` · error: ${st.error}` : "");
  fillEditForm();
}

// ---- editing ----------------------------------------------------------------------------------

function editableParams(row) {
  const q = S.queries[row.query];
  const out = [];
  for (const [label, rng] of Object.entries((q && q.qos) || {})) {
    const i = label.lastIndexOf(".");
    if (label.slice(0, i) === row.operator) out.push([label.slice(i + 1), rng]);
  }
  if (!out.some(([p]) => p === "drop_ratio")) out.push(["drop_ratio", null]);
  if ("plan_id" in (row.params || {})) out.push(["plan_id", null]);
  return out;
}

function fillEditForm() {
  const opSel = document.getElementById("edit-operator");
  const keep = opSel.value;
  opSel.replaceChildren(...S.control.map((r) => el("option", { value: r.operator }, r.operator)));
  if (keep && S.control.some((r) => r.operator === keep)) opSel.value = keep;
  fillParams();
}

function fillParams() {
  const opSel = document.getElementById("edit-operator");
  const pSel = document.getElementById("edit-param");
  const keep = pSel.value;
  const row = S.control.find((r) => r.operator === opSel.value);
  const params = row ? editableParams(row) : [];
  pSel.replaceChildren(...params.map(([p]) => el("option", { value: p }, p)));
  if (keep && params.some(([p]) => p === keep)) pSel.value = keep;
  showRange();
}

function showRange() {
  const row = S.control.find((r) => r.operator === document.getElementById("edit-operator").value);
  const param = document.getElementById("edit-param").value;
  const hint = document.getElementById("edit-range");
  if (!row || !param) { hint.textContent = ""; return; }
  const rng = (editableParams(row).find(([p]) => p === param) || [])[1];
  const now = row.params && param in row.params ? `now ${fmtValue(param, row.params[param])}` : "not set";
  let range = param === "drop_ratio" ? "in [0, 1)" : "";
  if (rng) {
    const f = (v) => (param === "drop_ratio" ? v : fmtDuration(v));
    range = `QoS range ${f(rng.min)} … ${f(rng.max)}` + (rng.step ? `, step ${f(rng.step)}` : "");
  }
  hint.textContent = `${now}; ${range}`;
}

function parseValue(param, text) {
  text = text.trim();
  if (param === "drop_ratio") return text === "" || isNaN(Number(text)) ? text : Number(text);
  if (TRANSITION.includes(param) && /^-?\d+$/.test(text)) return Number(text);   // µs
  if (param === "params") { try { return JSON.parse(text); } catch (e) { return text; } }
  return text;
}

async function submitEdit(ev) {
  ev.preventDefault();
  const out = document.getElementById("edit-result");
  const operator = document.getElementById("edit-operator").value;
  const param = document.getElementById("edit-param").value;
  const body = {
    changes: { [param]: parseValue(param, document.getElementById("edit-value").value) },
    who: document.getElementById("edit-who").value, reason: document.getElementById("edit-reason").value,
  };
  out.className = "result"; out.textContent = "sending…";
  try {
    const r = await fetch(`/api/control/${encodeURIComponent(operator)}`, {
      method: "POST", body: JSON.stringify(body),
      headers: { "Content-Type": "application/json",
        Authorization: `Bearer ${document.getElementById("edit-token").value}` },
    });
    const res = await r.json();
    if (!r.ok) { out.className = "result error"; out.textContent = `refused (${r.status}): ${res.error}`; return; }
    out.className = "result ok";
    out.textContent = res.changes.length
      ? `applied: ${operator} ${fmtParams(res.entry.params)} (entry version ${res.entry.version})`
      : "no change: that value is already in force";
  } catch (e) {
    out.className = "result error"; out.textContent = `failed: ${e}`;
  }
}

// ---- wiring -----------------------------------------------------------------------------------

// `full`: a whole /api/state (every sample); otherwise an event with the samples since the last one
async function applyState(st, full) {
  if (st.queries) {
    const key = JSON.stringify(Object.values(st.queries).map((q) => [q.name, q.operators, q.qos, q.deadline]));
    if (key !== S.qkey) {   // queries came or went: rebuild the cards from the whole history
      if (!full) st = await (await fetch("/api/state")).json();
      S.qkey = key;
      S.queries = st.queries;
      S.memoryBudget = st.memory_budget;
      S.seq = Math.max(S.seq, ...(st.samples || []).map((p) => p.seq));
      buildQueries(st);
      renderLogs(st);
      return;
    }
    S.queries = st.queries;
    renderLogs(st);
  }
  addSamples(st.samples || []);
}

function connect() {
  const status = document.getElementById("status");
  const es = new EventSource(`/api/events?after=${S.seq}`);
  es.onopen = () => { status.textContent = "live"; status.className = "status live"; };
  es.onerror = () => { status.textContent = "reconnecting…"; status.className = "status down"; };
  es.onmessage = (e) => applyState(JSON.parse(e.data), false);
}

async function init() {
  const m = /token=([^&]+)/.exec(location.hash);
  if (m) document.getElementById("edit-token").value = decodeURIComponent(m[1]);
  document.getElementById("edit-operator").addEventListener("change", fillParams);
  document.getElementById("edit-param").addEventListener("change", showRange);
  document.getElementById("edit-form").addEventListener("submit", submitEdit);
  await applyState(await (await fetch("/api/state")).json(), true);
  connect();
}

if (typeof module !== "undefined" && module.exports) {
  module.exports = { decisionRows, chartLayout, series, groupRows };   // for tests under node (tests/test_console.py)
} else {
  init();
}
