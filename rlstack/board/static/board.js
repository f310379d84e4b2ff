// rlstack board: metric curves (Plotly.js), a rollout browser and the run's config, polled live.
// The page's state (tab, filters) lives in the URL's query, so a view can be linked or reloaded.
"use strict";

const POLL_MS = 5000;
// Groups are a metric name's first part (`actor/pg_loss` -> `actor`); these open by default, first, in this order.
const OPEN_GROUPS = ["reward", "critic", "actor", "response_length", "val", "agent"];
// Within a group these come first; the rest by name.
const PREFERRED = [
  "critic/score/mean", "val/reward_score", "response_length/mean", "actor/pg_loss", "actor/entropy",
  "actor/grad_norm", "actor/kl_loss", "agent/num_turns/mean", "agent/tool_calls/mean",
  "agent/tool_success_rate", "timing_s/step", "perf/max_rss_gb",
];
const NOT_METRICS = new Set(["step", "timestamp"]); // the columns of metrics.jsonl that say when
const MAX_CHARTS = 60; // charts drawn before the page asks (many Plotly charts make it slow); said on the page
const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
const params = new URLSearchParams(location.search);
const state = {
  tab: params.get("tab") || "curves",
  metricFilter: params.get("metrics") || "",
  smoothing: Math.min(0.99, Math.max(0, Number(params.get("smoothing") || 0))),
  log: params.get("log") === "1",
  x: ["step", "relative", "wall"].includes(params.get("x")) ? params.get("x") : "step",
  toggled: new Set((params.get("toggled") || "").split(",").filter((x) => x !== "")),
  all: params.get("all") === "1",
  shown: new Set((params.get("runs") || "").split(",").filter((x) => x !== "").map(Number)),
  run: Number(params.get("run") || 0),
  kind: params.get("kind") || "train",
  step: params.get("step") || "",
  min: params.get("min_score") || "",
  max: params.get("max_score") || "",
  source: params.get("source") || "",
  end: params.get("end_reason") || "",
};
let runs = [];
const metrics = {}; // run id -> rows of metrics.jsonl
let rows = []; // the trajectories of the selected generations file

const $ = (id) => document.getElementById(id);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "text") node.textContent = v;
    else node.setAttribute(k, v);
  }
  for (const c of children) if (c) node.append(c);
  return node;
}

async function getJSON(url) {
  const r = await fetch(url, { cache: "no-store" });
  if (!r.ok) throw new Error(`${url}: ${r.status}`);
  return r.json();
}

function saveState() {
  const q = new URLSearchParams();
  const put = (k, v) => { if (v !== "" && v !== null && v !== undefined) q.set(k, v); };
  put("tab", state.tab);
  put("metrics", state.metricFilter);
  put("smoothing", state.smoothing || "");
  put("log", state.log ? "1" : "");
  put("x", state.x === "step" ? "" : state.x);
  put("toggled", [...state.toggled].join(","));
  put("all", state.all ? "1" : "");
  put("runs", [...state.shown].join(","));
  put("run", state.run);
  put("kind", state.kind);
  put("step", state.step);
  put("min_score", state.min);
  put("max_score", state.max);
  put("source", state.source);
  put("end_reason", state.end);
  history.replaceState(null, "", "?" + q.toString());
}

// ------------------------------------------------------------------------------------------ tabs

function showTab(tab) {
  state.tab = tab;
  for (const name of ["curves", "rollouts", "config"]) $("tab-" + name).hidden = name !== tab;
  document.querySelectorAll("header button").forEach((b) => b.classList.toggle("active", b.dataset.tab === tab));
  saveState();
  if (tab === "curves") drawCharts();
  if (tab === "config") loadConfig();
}

// ---------------------------------------------------------------------------------------- curves

const NO_PREFIX = "(no prefix)"; // the group of names without a slash

function groupOf(name) {
  return name.includes("/") ? name.split("/")[0] : NO_PREFIX;
}

function byPreference(a, b) {
  const [i, j] = [PREFERRED.indexOf(a), PREFERRED.indexOf(b)];
  if (i !== j) return i === -1 ? 1 : j === -1 ? -1 : i - j;
  return a < b ? -1 : a > b ? 1 : 0;
}

// Every metric of the shown runs, by group, in order: [{group, all, matching (what the filter keeps), open}].
function metricGroups() {
  const names = new Set();
  for (const id of state.shown) for (const row of metrics[id] || []) for (const k of Object.keys(row)) if (!NOT_METRICS.has(k)) names.add(k);
  const groups = new Map();
  for (const name of [...names].sort(byPreference)) {
    const g = groupOf(name);
    if (!groups.has(g)) groups.set(g, []);
    groups.get(g).push(name);
  }
  const rank = (g) => (OPEN_GROUPS.includes(g) ? OPEN_GROUPS.indexOf(g) : OPEN_GROUPS.length);
  const order = [...groups.keys()].sort((a, b) => rank(a) - rank(b) || (a === NO_PREFIX) - (b === NO_PREFIX) || (a < b ? -1 : 1));
  return order.map((group) => {
    const all = groups.get(group);
    const matching = state.metricFilter ? all.filter((n) => n.includes(state.metricFilter)) : all;
    // a filter opens the groups it matches; without one the common groups are open; a click flips either
    const byDefault = state.metricFilter ? matching.length > 0 : OPEN_GROUPS.includes(group);
    return { group, all, matching, open: byDefault !== state.toggled.has(group) };
  });
}

// TensorBoard's smoothing: an exponential moving average, debiased so that it starts at the first value.
function smooth(ys, weight) {
  let last = 0;
  let n = 0;
  return ys.map((y) => {
    if (!Number.isFinite(y)) return y;
    last = last * weight + (1 - weight) * y;
    n += 1;
    return last / (1 - Math.pow(weight, n));
  });
}

// A whole number of steps between ticks, about six ticks an axis: 1, 2, 5, 10, 20, ...
function stepTick(span) {
  const raw = span / 6;
  if (raw <= 1) return 1;
  const scale = Math.pow(10, Math.floor(Math.log10(raw)));
  const m = raw / scale;
  return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * scale;
}

// The time axis: seconds since the run's first row, shown in s, min or h by the longest run.
function timeUnit() {
  let longest = 0;
  for (const id of state.shown) {
    const t = (metrics[id] || []).map((r) => r.timestamp).filter(Number.isFinite);
    if (t.length) longest = Math.max(longest, Math.max(...t) - Math.min(...t));
  }
  return longest >= 7200 ? [3600, "h"] : longest >= 120 ? [60, "min"] : [1, "s"];
}

function xOf(rows, id, unit) {
  if (state.x === "step") return rows.map((r) => r.step);
  if (state.x === "wall") return rows.map((r) => new Date(r.timestamp * 1000));
  const start = Math.min(...(metrics[id] || []).map((r) => r.timestamp).filter(Number.isFinite));
  return rows.map((r) => (r.timestamp - start) / unit[0]);
}

function traces(name, unit) {
  const out = [];
  for (const id of state.shown) {
    const points = (metrics[id] || []).filter((r) => typeof r[name] === "number" && (state.x === "step" || Number.isFinite(r.timestamp)));
    const x = xOf(points, id, unit);
    const y = points.map((r) => r[name]);
    const color = COLORS[id % COLORS.length];
    const common = { x, type: "scatter", name: runs[id].name, legendgroup: String(id) };
    // on a time axis the hover still says the step
    const step = state.x === "step" ? "%{x}" : "%{customdata}";
    if (state.x !== "step") common.customdata = points.map((r) => r.step);
    const smoothed = state.smoothing > 0;
    // the raw values: the curve itself, or faint behind the smoothed one
    out.push({ ...common, y, mode: "lines+markers", showlegend: !smoothed, opacity: smoothed ? 0.25 : 1, line: { color }, marker: { color, size: 5 }, hovertemplate: `step ${step}: %{y:.4g}` });
    if (smoothed) out.push({ ...common, y: smooth(y, state.smoothing), mode: "lines", line: { color, width: 2 }, hovertemplate: `step ${step}: %{y:.4g} (smoothed)` });
  }
  return out;
}

function xAxis(name, unit) {
  if (state.x === "wall") return { title: { text: "wall clock" }, type: "date" };
  if (state.x === "relative") return { title: { text: `time since the run's first row (${unit[1]})` } };
  const steps = [...state.shown].flatMap((id) => (metrics[id] || []).filter((r) => typeof r[name] === "number").map((r) => r.step));
  const span = steps.length ? Math.max(...steps) - Math.min(...steps) : 1;
  return { title: { text: "step" }, tickmode: "linear", tick0: 0, dtick: stepTick(span), tickformat: "d" };
}

// the charts Plotly is still drawing: the page says it is ready (data-ready) once none are
const drawing = new Set();

function drawChart(div, name, unit) {
  // redrawn only when its data or the view changed (the page polls every few seconds)
  const key = JSON.stringify([[...state.shown].map((id) => [id, (metrics[id] || []).length]), state.smoothing, state.log, state.x]);
  if (div.dataset.drawn === key) return;
  div.dataset.drawn = key;
  const done = Plotly.react(div, traces(name, unit), {
    title: { text: name, font: { size: 13 }, x: 0.01, xanchor: "left" },
    margin: { l: 50, r: 10, t: 30, b: state.shown.size > 1 ? 50 : 30 },
    showlegend: state.shown.size > 1,
    legend: { orientation: "h", x: 1, xanchor: "right", y: -0.12, yanchor: "top" }, // beside the axis title
    xaxis: xAxis(name, unit),
    yaxis: { type: state.log ? "log" : "linear" },
  }, { displaylogo: false, responsive: true, displayModeBar: "hover" });
  drawing.add(done);
  done.catch(() => {}).finally(() => drawing.delete(done)); // a failed draw is not waited for again
}

async function allDrawn() {
  while (drawing.size) await Promise.allSettled([...drawing]);
}

function toggleGroup(group) {
  state.toggled.has(group) ? state.toggled.delete(group) : state.toggled.add(group);
  saveState();
  drawCharts();
}

function drawCharts() {
  const groups = metricGroups();
  const unit = timeUnit();
  const total = groups.reduce((n, g) => n + g.all.length, 0);
  const matching = groups.reduce((n, g) => n + g.matching.length, 0);
  const closed = groups.filter((g) => !g.open).reduce((n, g) => n + g.matching.length, 0);
  const open = groups.filter((g) => g.open).reduce((n, g) => n + g.matching.length, 0);
  const limit = state.all ? Infinity : MAX_CHARTS;
  const counts = [`showing ${Math.min(open, limit)} of ${total} metrics`];
  if (state.metricFilter) counts.push(`${total - matching} hidden by the filter`);
  if (closed) counts.push(`${closed} in closed groups`);
  if (open > limit) counts.push(`${open - limit} not drawn`);
  $("metric-count").textContent = counts.join("; ");

  const notes = [];
  if (open > limit) {
    const more = el("button", { id: "draw-all", text: `draw all ${open}` });
    more.addEventListener("click", () => { state.all = true; saveState(); drawCharts(); });
    notes.push(el("div", { class: "note cap" }, document.createTextNode(`The open groups hold ${open} charts; the first ${limit} are drawn (many charts make the page slow). `), more));
  }
  if (state.x !== "step") {
    const untimed = [...state.shown].filter((id) => (metrics[id] || []).length && !(metrics[id] || []).some((r) => Number.isFinite(r.timestamp)));
    if (untimed.length) notes.push(el("div", { class: "note", text: `No time axis for ${untimed.map((id) => runs[id].name).join(", ")}: its metrics.jsonl has no timestamps (written before rlstack recorded them); the step axis shows it.` }));
  }
  $("chart-notes").replaceChildren(...notes);

  const box = $("groups");
  const wanted = new Set(groups.filter((g) => g.matching.length).map((g) => g.group));
  for (const div of [...box.children]) if (!wanted.has(div.dataset.group)) div.remove();
  let drawn = 0;
  groups.forEach((g) => {
    if (!g.matching.length) return;
    let div = [...box.children].find((d) => d.dataset.group === g.group);
    if (!div) {
      const head = el("button", { class: "group-head" });
      head.addEventListener("click", () => toggleGroup(g.group));
      div = el("div", { class: "group", "data-group": g.group }, head, el("div", { class: "charts" }));
    }
    box.append(div); // in order
    div.classList.toggle("open", g.open);
    const label = g.group === NO_PREFIX ? NO_PREFIX : `${g.group}/`;
    const size = state.metricFilter ? `${g.matching.length} of ${g.all.length} metrics` : `${g.all.length} metrics`;
    div.firstChild.textContent = `${g.open ? "▾" : "▸"} ${label} · ${size}`;
    div.firstChild.setAttribute("aria-expanded", String(g.open));
    const charts = div.lastChild;
    const names = g.open ? g.matching.slice(0, Math.max(0, limit - drawn)) : [];
    drawn += names.length;
    const keep = new Set(names);
    for (const c of [...charts.children]) if (!keep.has(c.dataset.metric)) { Plotly.purge(c); c.remove(); }
    names.forEach((name) => {
      let chart = charts.querySelector(`[data-metric="${CSS.escape(name)}"]`);
      if (!chart) chart = el("div", { class: "chart", "data-metric": name });
      charts.append(chart); // in order
      drawChart(chart, name, unit);
    });
  });
}

async function pollMetrics() {
  await Promise.all(runs.map(async (r) => { metrics[r.id] = await getJSON(`/api/run/${r.id}/metrics`); }));
  if (state.tab === "curves") drawCharts();
}

// -------------------------------------------------------------------------------------- rollouts

async function loadSteps() {
  const files = (await getJSON(`/api/run/${state.run}/generations`)).filter((f) => f.kind === state.kind);
  const select = $("g-step");
  const previous = state.step;
  select.replaceChildren(...files.map((f) => el("option", { value: String(f.step), text: `step ${f.step}` })));
  const steps = files.map((f) => String(f.step));
  state.step = steps.includes(previous) ? previous : (steps[steps.length - 1] || "");
  select.value = state.step;
  await loadRows();
}

async function loadRows() {
  rows = state.step === "" ? [] : await getJSON(`/api/run/${state.run}/generations/${state.kind}_step_${state.step}.jsonl`);
  fillSelect($("g-source"), rows.map((r) => r.data_source), state.source);
  fillSelect($("g-end"), rows.map((r) => r.end_reason), state.end);
  drawRows();
}

function fillSelect(select, values, current) {
  const options = [...new Set(values.filter((v) => v !== undefined && v !== null))].sort();
  if (current && !options.includes(current)) options.push(current);
  select.replaceChildren(el("option", { value: "", text: "all" }), ...options.map((v) => el("option", { value: v, text: v })));
  select.value = current;
}

function visibleRows() {
  return rows.filter((r) =>
    (state.min === "" || r.score >= Number(state.min)) &&
    (state.max === "" || r.score <= Number(state.max)) &&
    (state.source === "" || r.data_source === state.source) &&
    (state.end === "" || r.end_reason === state.end));
}

function compact(text) {
  // a picture's hundreds of placeholder tokens, as one count
  return text.replace(/(<\|image_pad\|>)+/g, (run) => `<|image_pad|>x${run.length / 13}`);
}

// A text as a <pre>; one with no visible character says what it holds instead of showing a blank box.
function textBlock(cls, text) {
  text = typeof text === "string" ? text : JSON.stringify(text, null, 2);
  if (text.trim() !== "") return el("pre", { class: cls, text: compact(text) });
  const kinds = [["\n", "⏎", "newline"], [" ", "␣", "space"], ["\t", "⇥", "tab"]];
  const counts = kinds.map(([c]) => text.split(c).length - 1);
  const other = text.length - counts.reduce((a, b) => a + b, 0);
  const glyphs = [...text].map((c) => (kinds.find(([k]) => k === c) || [c, "·"])[1]).join("");
  const parts = kinds.map(([, , word], i) => counts[i] && `${counts[i]} ${word}${counts[i] > 1 ? "s" : ""}`).filter(Boolean);
  if (other) parts.push(`${other} other blank character${other > 1 ? "s" : ""}`);
  const what = text === "" ? "∅ (empty, no text)" : `${glyphs.length > 40 ? glyphs.slice(0, 40) + "…" : glyphs} (${parts.join(", ")}, no text)`;
  return el("pre", { class: cls + " blank", text: what });
}

// Why a tool call has no output the model read: the reply was dropped (`dropped` in the turn), or, in runs
// written before turns recorded that, the trajectory ended right after the call.
function droppedNote(dropped) {
  if (dropped.reason === "over_length") return `tool output dropped: the response reached its maximum length (data.max_response_length), ${dropped.tokens} tokens cut (${dropped.room} were left); the model never read it`;
  if (dropped.reason === "max_images") return `tool output dropped: its ${dropped.images} image(s) would pass worker.rollout.agent.max_images; the model never read it`;
  if (dropped.reason === "tool_error") return `tool output dropped: it could not be turned into tokens (${dropped.error}); the model never read it`;
  return `tool output dropped (${dropped.reason}); the model never read it`;
}

const UNRECORDED = {
  over_length: "no tool output: the response reached its maximum length (data.max_response_length) before the tool's reply (this run's generations do not record how many tokens were cut)",
  max_images: "no tool output: the tool's images would pass worker.rollout.agent.max_images",
  tool_error: "no tool output: the tool's reply could not be turned into tokens",
  timeout: "no tool output: the call ran past worker.rollout.agent.tool_timeout_s",
};

function image(path) {
  return el("img", { class: "shot", src: `/run/${state.run}/${path}`, alt: path });
}

function callBlock(call) {
  if (call.error) return el("div", { class: "toolcall" }, el("span", { class: "label", text: "malformed tool call: " }), document.createTextNode(call.error));
  const args = call.arguments || {};
  const code = typeof args.code === "string" ? args.code : null;
  const rest = Object.fromEntries(Object.entries(args).filter(([k]) => k !== "code" || code === null));
  return el("div", { class: "toolcall" },
    el("span", { class: "label", text: `tool call: ${call.name}` }),
    code !== null ? el("pre", { class: "code", text: code }) : null,
    Object.keys(rest).length ? el("pre", { text: JSON.stringify(rest, null, 2) }) : null);
}

// What the reward function said of the answer beside its score: a program's test status and the first
// failure (builtin:code), the answer it read (builtin:math), ...
function rewardInfo(info) {
  const entries = Object.entries(info || {}).filter(([, v]) => v !== "" && v !== null && v !== undefined);
  if (!entries.length) return null;
  return el("div", { class: "reward-info" },
    el("span", { class: "label", text: "reward: " }),
    document.createTextNode(entries.map(([k, v]) => `${k}: ${typeof v === "string" ? v : JSON.stringify(v)}`).join(" · ")));
}

function trajectoryCard(r, i) {
  const components = el("div", { class: "components" },
    ...Object.entries(r.reward_components || {}).map(([k, v]) => el("span", { text: `${k}: ${typeof v === "number" ? v.toFixed(3) : v}` })));
  const card = el("div", { class: "card trajectory", "data-end-reason": r.end_reason || "", "data-score": String(r.score) },
    el("h3", { text: `#${i} · score ${Number(r.score).toFixed(3)} · ${r.end_reason}` }),
    el("div", { class: "meta", text: [r.data_source && `data source ${r.data_source}`, `uid ${r.uid}`, `ground truth ${JSON.stringify(r.ground_truth)}`, r.num_turns !== undefined && `${r.num_turns} turns, ${r.tool_calls} tool calls`].filter(Boolean).join(" · ") }),
    components,
    rewardInfo(r.reward_info),
    el("div", { class: "label", text: "prompt" }),
    textBlock("prompt", r.prompt));
  if (r.images && r.images.length) card.append(el("div", { class: "images input-images" }, ...r.images.map(image)));
  if (r.turns && r.turns.length) {
    let n = 0;
    r.turns.forEach((turn, k) => {
      if (turn.role === "assistant") {
        n += 1;
        card.append(el("div", { class: "turn assistant" },
          el("div", { class: "label", text: `model, turn ${n}` }),
          textBlock("text", turn.text),
          turn.tool_call ? callBlock(turn.tool_call) : null));
        if (turn.tool_call && k === r.turns.length - 1 && UNRECORDED[r.end_reason]) {
          card.append(el("div", { class: "turn tool dropped" }, el("div", { class: "label", text: UNRECORDED[r.end_reason] })));
        }
      } else if (turn.dropped) {
        const note = turn.role === "user" ? droppedNote(turn.dropped).replace("tool output", "environment reply") : droppedNote(turn.dropped);
        card.append(el("div", { class: "turn tool dropped" },
          el("div", { class: "label", text: note }),
          textBlock("output unread", turn.text)));
      } else if (turn.role === "user") {
        card.append(el("div", { class: "turn tool" },
          el("div", { class: "label", text: "environment reply" }),
          textBlock("output", turn.text)));
      } else {
        const shots = (turn.images || []).map((j) => image(r.tool_images[j]));
        card.append(el("div", { class: "turn tool" + (turn.ok === false ? " failed" : "") },
          el("div", { class: "label", text: turn.ok === false ? "tool output (the call failed)" : "tool output" }),
          textBlock("output", turn.text),
          shots.length ? el("div", { class: "images tool-images" }, ...shots) : null));
      }
    });
  } else {
    card.append(el("div", { class: "label", text: "response" }), textBlock("response", r.response));
  }
  return card;
}

function drawRows() {
  const shown = visibleRows();
  $("count").textContent = `${shown.length} of ${rows.length} trajectories`;
  $("trajectories").replaceChildren(...shown.map((r) => trajectoryCard(r, rows.indexOf(r))));
  saveState();
}

// ---------------------------------------------------------------------------------------- config

async function loadConfig() {
  const r = await fetch(`/api/run/${$("c-run").value}/config`, { cache: "no-store" });
  $("config").textContent = await r.text();
}

// ------------------------------------------------------------------------------------------ start

async function start() {
  runs = await getJSON("/api/runs");
  if (state.shown.size === 0) runs.forEach((r) => state.shown.add(r.id));
  $("runs").replaceChildren(...runs.map((r) => {
    const box = el("input", { type: "checkbox" });
    box.checked = state.shown.has(r.id);
    box.addEventListener("change", () => { box.checked ? state.shown.add(r.id) : state.shown.delete(r.id); saveState(); drawCharts(); });
    const swatch = el("span", { class: "swatch", style: `background: ${COLORS[r.id % COLORS.length]}` });
    return el("label", { title: r.path }, box, swatch, document.createTextNode(r.name));
  }));
  for (const id of ["g-run", "c-run"]) $(id).replaceChildren(...runs.map((r) => el("option", { value: String(r.id), text: r.name })));
  $("g-run").value = String(state.run);
  $("g-kind").value = state.kind;
  $("g-min").value = state.min;
  $("g-max").value = state.max;
  $("metric-filter").value = state.metricFilter;
  $("smoothing").value = String(state.smoothing);
  $("smoothing-value").textContent = state.smoothing.toFixed(2);
  $("log-scale").checked = state.log;
  $("x-axis").value = state.x;
  document.querySelectorAll("header button").forEach((b) => b.addEventListener("click", () => showTab(b.dataset.tab)));
  $("metric-filter").addEventListener("input", (e) => { state.metricFilter = e.target.value; state.toggled.clear(); saveState(); drawCharts(); });
  $("smoothing").addEventListener("input", (e) => {
    state.smoothing = Number(e.target.value);
    $("smoothing-value").textContent = state.smoothing.toFixed(2);
    saveState();
    drawCharts();
  });
  $("log-scale").addEventListener("change", (e) => { state.log = e.target.checked; saveState(); drawCharts(); });
  $("x-axis").addEventListener("change", (e) => { state.x = e.target.value; saveState(); drawCharts(); });
  $("g-run").addEventListener("change", (e) => { state.run = Number(e.target.value); state.step = ""; loadSteps(); });
  $("g-kind").addEventListener("change", (e) => { state.kind = e.target.value; state.step = ""; loadSteps(); });
  $("g-step").addEventListener("change", (e) => { state.step = e.target.value; loadRows(); });
  $("g-min").addEventListener("input", (e) => { state.min = e.target.value; drawRows(); });
  $("g-max").addEventListener("input", (e) => { state.max = e.target.value; drawRows(); });
  $("g-source").addEventListener("change", (e) => { state.source = e.target.value; drawRows(); });
  $("g-end").addEventListener("change", (e) => { state.end = e.target.value; drawRows(); });
  $("c-run").addEventListener("change", loadConfig);
  await pollMetrics();
  await loadSteps();
  showTab(state.tab);
  await allDrawn();
  document.body.dataset.ready = "true";
  setInterval(async () => {
    await pollMetrics();
    const latest = $("g-step").value === $("g-step").options[$("g-step").options.length - 1]?.value;
    if (state.tab === "rollouts" && latest) { state.step = ""; await loadSteps(); }
  }, POLL_MS);
}

start().catch((e) => { document.body.prepend(el("pre", { id: "error", text: String(e) })); });
