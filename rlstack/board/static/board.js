// rlstack board: metric curves (Plotly.js), a rollout browser and the run's config, polled live.
// The page's state (tab, filters) lives in the URL's query, so a view can be linked or reloaded.
"use strict";

const POLL_MS = 5000;
const PREFERRED = [
  "critic/score/mean", "val/reward_score", "response_length/mean", "actor/pg_loss", "actor/entropy",
  "actor/grad_norm", "actor/kl_loss", "agent/num_turns/mean", "agent/tool_calls/mean",
  "agent/tool_success_rate", "timing_s/step", "perf/max_rss_gb",
];
const MAX_CHARTS = 40;
const params = new URLSearchParams(location.search);
const state = {
  tab: params.get("tab") || "curves",
  metricFilter: params.get("metrics") || "",
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

function metricNames() {
  const names = new Set();
  for (const id of state.shown) for (const row of metrics[id] || []) for (const k of Object.keys(row)) if (k !== "step") names.add(k);
  const all = [...names].sort();
  if (state.metricFilter) return all.filter((n) => n.includes(state.metricFilter)).slice(0, MAX_CHARTS);
  const accuracy = all.filter((n) => n.startsWith("val/") && n.endsWith("/accuracy"));
  return [...new Set([...PREFERRED.filter((n) => names.has(n)), ...accuracy])].slice(0, MAX_CHARTS);
}

function drawCharts() {
  const names = metricNames();
  $("metric-count").textContent = `${names.length} chart(s)`;
  const box = $("charts");
  const wanted = new Set(names);
  for (const div of [...box.children]) if (!wanted.has(div.dataset.metric)) div.remove();
  names.forEach((name) => {
    let div = box.querySelector(`[data-metric="${CSS.escape(name)}"]`);
    if (!div) {
      div = el("div", { class: "chart", "data-metric": name });
      box.append(div);
    }
    const traces = [...state.shown].map((id) => {
      const points = (metrics[id] || []).filter((r) => typeof r[name] === "number");
      return { x: points.map((r) => r.step), y: points.map((r) => r[name]), name: runs[id].name, mode: "lines+markers", type: "scatter" };
    });
    Plotly.react(div, traces, {
      title: { text: name, font: { size: 13 }, x: 0.01, xanchor: "left" },
      margin: { l: 50, r: 10, t: 30, b: 30 },
      showlegend: state.shown.size > 1,
      legend: { orientation: "h" },
      xaxis: { title: { text: "step" } },
    }, { displaylogo: false, responsive: true, displayModeBar: "hover" });
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

function trajectoryCard(r, i) {
  const components = el("div", { class: "components" },
    ...Object.entries(r.reward_components || {}).map(([k, v]) => el("span", { text: `${k}: ${typeof v === "number" ? v.toFixed(3) : v}` })));
  const card = el("div", { class: "card trajectory", "data-end-reason": r.end_reason || "", "data-score": String(r.score) },
    el("h3", { text: `#${i} · score ${Number(r.score).toFixed(3)} · ${r.end_reason}` }),
    el("div", { class: "meta", text: [r.data_source && `data source ${r.data_source}`, `uid ${r.uid}`, `ground truth ${JSON.stringify(r.ground_truth)}`, r.num_turns !== undefined && `${r.num_turns} turns, ${r.tool_calls} tool calls`].filter(Boolean).join(" · ") }),
    components,
    el("div", { class: "label", text: "prompt" }),
    el("pre", { class: "prompt", text: compact(typeof r.prompt === "string" ? r.prompt : JSON.stringify(r.prompt, null, 2)) }));
  if (r.images && r.images.length) card.append(el("div", { class: "images input-images" }, ...r.images.map(image)));
  if (r.turns && r.turns.length) {
    let n = 0;
    r.turns.forEach((turn) => {
      if (turn.role === "assistant") {
        n += 1;
        card.append(el("div", { class: "turn assistant" },
          el("div", { class: "label", text: `model, turn ${n}` }),
          el("pre", { class: "text", text: turn.text }),
          turn.tool_call ? callBlock(turn.tool_call) : null));
      } else if (turn.role === "user") {
        card.append(el("div", { class: "turn tool" },
          el("div", { class: "label", text: "environment reply" }),
          el("pre", { class: "output", text: turn.text })));
      } else {
        const shots = (turn.images || []).map((j) => image(r.tool_images[j]));
        card.append(el("div", { class: "turn tool" + (turn.ok === false ? " failed" : "") },
          el("div", { class: "label", text: turn.ok === false ? "tool output (the call failed)" : "tool output" }),
          el("pre", { class: "output", text: turn.text }),
          shots.length ? el("div", { class: "images tool-images" }, ...shots) : null));
      }
    });
  } else {
    card.append(el("div", { class: "label", text: "response" }), el("pre", { class: "response", text: r.response }));
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
    return el("label", { title: r.path }, box, document.createTextNode(" " + r.name));
  }));
  for (const id of ["g-run", "c-run"]) $(id).replaceChildren(...runs.map((r) => el("option", { value: String(r.id), text: r.name })));
  $("g-run").value = String(state.run);
  $("g-kind").value = state.kind;
  $("g-min").value = state.min;
  $("g-max").value = state.max;
  $("metric-filter").value = state.metricFilter;
  document.querySelectorAll("header button").forEach((b) => b.addEventListener("click", () => showTab(b.dataset.tab)));
  $("metric-filter").addEventListener("input", (e) => { state.metricFilter = e.target.value; saveState(); drawCharts(); });
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
  document.body.dataset.ready = "true";
  setInterval(async () => {
    await pollMetrics();
    const latest = $("g-step").value === $("g-step").options[$("g-step").options.length - 1]?.value;
    if (state.tab === "rollouts" && latest) { state.step = ""; await loadSteps(); }
  }, POLL_MS);
}

start().catch((e) => { document.body.prepend(el("pre", { id: "error", text: String(e) })); });
