// GPU detail page: live figures from /ws/fleet/, history charts from /api/v1/gpus/{uuid}/history/ (per-minute or
// per-hour rollups; "last 2 min" is the raw 1 Hz samples and keeps growing from the websocket), probe results.
import "../css/fleet.css";
import {
  Chart, Filler, Legend, LinearScale, LineController, LineElement, PointElement, Tooltip,
} from "chart.js";

import { outsideText } from "../lib/fleet_text.js";

Chart.register(LineController, LineElement, PointElement, LinearScale, Filler, Legend, Tooltip);

const { api, liveSocket } = window.Portal;
const $ = (id) => document.getElementById(id);
const cfg = JSON.parse($("gpu-config").textContent);
const RAW_KEEP = 180; // points kept on the live (raw) chart

// --- Live figures ----------------------------------------------------------------------------------------------------
const timeFmt = new Intl.DateTimeFormat(undefined, { hour: "2-digit", minute: "2-digit" });

function holderText(h) {
  if (!h) return "nobody (free)";
  const until = h.until ? ` until ${timeFmt.format(new Date(h.until))}` : "";
  if (h.user) return `${h.user} (team ${h.team}, ${h.kind || "in use"} ${h.id ?? ""})${until}`.replace(" )", ")");
  if (h.team) return `team ${h.team}${h.kind ? ` (${h.kind})` : ""}`;
  return "in use";
}

// A GPU in MIG mode or split in shares: the summary line, and each part's row of the parts table.
function partsSummary(g) {
  const p = g.parts;
  const what = p.kind === "mig" ? "MIG instances" : "shares";
  return `${p.free}/${p.total} ${what} free`;
}

const gib = (mib) => (mib / 1024).toFixed(1);

function showParts(g) {
  const held = new Map((Array.isArray(g.holder) ? g.holder : []).map((h) => [h.part_uuid, h]));
  const used = (g.parts && g.parts.used) || {};
  for (const row of document.querySelectorAll("#gpu-parts tr[data-part]")) {
    const uuid = row.dataset.part;
    const holder = row.querySelector(".part-holder");
    const value = held.has(uuid) ? holderText(held.get(uuid)) : "nobody (free)";
    if (holder.textContent !== value) holder.textContent = value;
    const meter = row.querySelector("meter");
    if (!meter) continue; // a page rendered before parts had meters
    const mib = g.stale ? undefined : used[uuid];
    meter.value = mib == null ? 0 : mib;
    const busy = g.stale ? undefined : ((g.parts && g.parts.busy) || {})[uuid]; // SM activity, where GPM gives it
    const text = (mib == null ? "—" : `${gib(mib)} / ${gib(Number(meter.max))} GiB`) + (busy == null ? "" : ` · SM ${busy}%`);
    const span = row.querySelector(".part-used-text");
    if (span.textContent !== text) span.textContent = text;
  }
}

function setText(id, value) {
  const e = $(id);
  if (e.textContent !== value) e.textContent = value;
}

function showLive(g) {
  setText("live-util", g.util == null ? "—" : `${g.util}%`);
  setText("live-mem", g.mem_used == null ? "—" : `${(g.mem_used / 1024).toFixed(1)} / ${(g.mem_total / 1024).toFixed(1)} GiB`);
  setText("live-temp", g.temp == null ? "—" : `${g.temp} °C`);
  setText("live-power", g.power == null ? "—" : `${Math.round(g.power)} W`);
  setText("live-clock", g.sm_clock == null ? "—" : `${g.sm_clock} MHz`);
  const outside = outsideText(g) ? ` · ${outsideText(g)}` : "";
  setText("gpu-holder", g.parts ? partsSummary(g) : holderText(g.holder) + outside);
  if (g.parts) showParts(g);
  for (const [id, value] of [["gpu-status", g.status], ["gpu-node-status", g.node_status]]) {
    if (!value) continue;
    const e = $(id);
    setText(id, value);
    e.className = `badge status-${value}`;
  }
}

// --- Charts ---------------------------------------------------------------------------------------------------------
let spanMs = 3600 * 1000;

// Round steps for the time axis (a linear scale of epoch ms: chart.js needs a date adapter for a time scale, and
// this keeps the bundle free of one).
function stepFor(span) {
  const m = 60 * 1000;
  if (span <= 5 * m) return 15 * 1000;
  if (span <= 90 * m) return 10 * m;
  if (span <= 6 * 60 * m) return 60 * m;
  if (span <= 24 * 60 * m) return 3 * 60 * m;
  return 24 * 60 * m;
}

// Ticks on round local times (every 10 min, every hour...), whatever the window's first instant.
function roundTicks(axis) {
  const step = stepFor(spanMs);
  const off = new Date().getTimezoneOffset() * 60 * 1000; // UTC minus local, in ms
  const ticks = [];
  for (let v = Math.ceil((axis.min - off) / step) * step + off; v <= axis.max; v += step) ticks.push({ value: v });
  axis.ticks = ticks;
}

const xAxis = () => ({ type: "linear", afterBuildTicks: roundTicks, ticks: { callback: (v) => timeLabel(v) } });

function setWindow(end = Date.now()) {
  for (const c of Object.values(charts)) {
    c.options.scales.x.min = end - spanMs;
    c.options.scales.x.max = end;
  }
}

function timeLabel(ms) {
  const d = new Date(ms);
  if (spanMs > 2 * 86400 * 1000) return d.toLocaleDateString(undefined, { weekday: "short", day: "numeric" }) + " " + timeFmt.format(d);
  if (spanMs <= 10 * 60 * 1000) return d.toLocaleTimeString(undefined, { hour: "2-digit", minute: "2-digit", second: "2-digit" });
  return timeFmt.format(d);
}

function lineChart(canvas, datasets, yOptions = {}) {
  return new Chart(canvas, {
    type: "line",
    data: { datasets },
    options: {
      responsive: true,
      maintainAspectRatio: false,
      animation: false,
      parsing: false,
      normalized: true,
      spanGaps: false,
      elements: { point: { radius: 0 }, line: { borderWidth: 1.5 } },
      interaction: { mode: "nearest", axis: "x", intersect: false },
      plugins: { legend: { display: datasets.length > 1 }, tooltip: { callbacks: { title: (items) => timeLabel(items[0].parsed.x) } } },
      scales: { x: xAxis(), ...yOptions },
    },
  });
}

const charts = {
  util: lineChart($("chart-util"), [
    { label: "max", data: [], borderColor: "rgba(47,111,237,0.25)", backgroundColor: "rgba(47,111,237,0.12)", fill: "+1", borderWidth: 0 },
    { label: "min", data: [], borderColor: "rgba(47,111,237,0.25)", borderWidth: 0, fill: false },
    { label: "mean", data: [], borderColor: "#2f6fed", fill: false },
  ], { y: { min: 0, max: 100 } }),
  mem: lineChart($("chart-mem"), [
    { label: "max", data: [], borderColor: "rgba(142,68,173,0.35)", borderDash: [4, 3], fill: false },
    { label: "mean", data: [], borderColor: "#8e44ad", fill: false },
  ], { y: { min: 0, suggestedMax: cfg.memory_mib / 1024 } }),
  power: lineChart($("chart-power"), [
    { label: "power (W)", data: [], borderColor: "#d68a00", fill: false, yAxisID: "y" },
    { label: "temperature max (°C)", data: [], borderColor: "#d64545", fill: false, yAxisID: "y1" },
  ], { y: { min: 0, position: "left" }, y1: { min: 0, suggestedMax: 90, position: "right", grid: { drawOnChartArea: false } } }),
};

// A GPU in MIG mode: each instance's memory (the one reading NVML gives per instance), one line per instance, from
// the same history request (minute and hour ranges; the raw range has none).
const INSTANCE_COLORS = ["#2f6fed", "#8e44ad", "#d68a00", "#1e8449", "#d64545", "#17a2b8", "#6c757d"];
if ($("chart-instances")) charts.instances = lineChart($("chart-instances"), [], { y: { min: 0 } });

function setInstances(instances) {
  if (!charts.instances) return;
  charts.instances.data.datasets = instances.map((inst, i) => ({
    label: `${inst.profile}${inst.gi_id == null ? "" : ` (GI ${inst.gi_id})`}`,
    data: inst.points.map((p) => ({ x: new Date(p.t).getTime(), y: p.mem_used_max == null ? null : p.mem_used_max / 1024 })),
    borderColor: INSTANCE_COLORS[i % INSTANCE_COLORS.length],
    fill: false,
  }));
  const chart = charts.instances.options;
  chart.plugins.legend.display = true;
  chart.plugins.legend.labels = { boxWidth: 12 };
  // The scale of the instances' own size, so that an empty instance looks empty.
  chart.scales.y.suggestedMax = Math.max(0, ...instances.map((inst) => inst.memory_mib)) / 1024;
  charts.instances.update("none");
  const shown = instances.filter((inst) => inst.points.length).length;
  $("instances-note").textContent = range.resolution === "raw" ? "per-instance memory is kept per minute: pick 1 h or more"
    : `${shown} of ${instances.length} instances with readings in this range`;
  document.body.dataset.instanceLines = String(shown); // for the browser test
}

// Both shapes to one: raw samples {ts, util, mem_used, temp, power} and rollups {t, util_min/mean/max, ...}.
function normalize(point) {
  if (point.t !== undefined) {
    return {
      x: new Date(point.t).getTime(),
      utilMin: point.util_min, util: point.util_mean, utilMax: point.util_max,
      mem: point.mem_used_mean == null ? null : point.mem_used_mean / 1024,
      memMax: point.mem_used_max == null ? null : point.mem_used_max / 1024,
      temp: point.temp_max, power: point.power_mean,
    };
  }
  const mem = point.mem_used == null ? null : point.mem_used / 1024;
  return { x: point.ts * 1000, utilMin: point.util, util: point.util, utilMax: point.util, mem, memMax: mem, temp: point.temp, power: point.power };
}

function setSeries(points) {
  const xy = (key) => points.map((p) => ({ x: p.x, y: p[key] ?? null }));
  charts.util.data.datasets[0].data = xy("utilMax");
  charts.util.data.datasets[1].data = xy("utilMin");
  charts.util.data.datasets[2].data = xy("util");
  charts.mem.data.datasets[0].data = xy("memMax");
  charts.mem.data.datasets[1].data = xy("mem");
  charts.power.data.datasets[0].data = xy("power");
  charts.power.data.datasets[1].data = xy("temp");
  for (const c of Object.values(charts)) c.update("none");
}

function appendLive(g) {
  if (g.ts == null || g.stale) return;
  const p = normalize({ ts: g.ts, util: g.util, mem_used: g.mem_used, temp: g.temp, power: g.power });
  const last = charts.util.data.datasets[2].data.at(-1);
  if (last && last.x >= p.x) return; // same sample as the last one
  const add = (chart, i, y) => {
    const d = chart.data.datasets[i].data;
    d.push({ x: p.x, y: y ?? null });
    if (d.length > RAW_KEEP) d.shift();
  };
  add(charts.util, 0, p.utilMax);
  add(charts.util, 1, p.utilMin);
  add(charts.util, 2, p.util);
  add(charts.mem, 0, p.memMax);
  add(charts.mem, 1, p.mem);
  add(charts.power, 0, p.power);
  add(charts.power, 1, p.temp);
  setWindow(p.x); // the live window slides with the samples
  for (const c of Object.values(charts)) c.update("none");
}

let range = { hours: 1, resolution: null };
let loadToken = 0;

async function loadHistory() {
  const token = ++loadToken;
  const q = new URLSearchParams({ hours: String(range.hours) });
  if (range.resolution) q.set("resolution", range.resolution);
  spanMs = range.resolution === "raw" ? 2 * 60 * 1000 : range.hours * 3600 * 1000;
  const note = $("history-note");
  note.textContent = "loading…";
  try {
    const data = await api(`${cfg.history_url}?${q}`);
    if (token !== loadToken) return; // a newer range was picked meanwhile
    const points = data.points.map(normalize).sort((a, b) => a.x - b.x);
    setWindow();
    setSeries(points);
    setInstances(data.instances || []);
    note.textContent = points.length
      ? (data.resolution === "raw"
        ? `${points.length} samples, 1 a second`
        : `${points.length} points, each a ${data.resolution}'s average`) // "21 minute averages" read as 21 minutes
      : "no data for this range yet";
    document.body.dataset.historyPoints = String(points.length); // for the browser test
  } catch (err) {
    if (token === loadToken) note.textContent = `could not load the history: ${err.message}`;
  }
}

for (const b of document.querySelectorAll(".gpu-ranges button")) {
  b.addEventListener("click", () => {
    range = { hours: Number(b.dataset.hours), resolution: b.dataset.resolution || null };
    for (const o of document.querySelectorAll(".gpu-ranges button")) o.setAttribute("aria-pressed", String(o === b));
    loadHistory();
  });
}
document.querySelector('.gpu-ranges button[data-hours="1"]:not([data-resolution])').setAttribute("aria-pressed", "true");

// --- Probe (admins) ---------------------------------------------------------------------------------------------------
const probeBtn = $("probe-run");
if (probeBtn && cfg.probe_url) {
  probeBtn.addEventListener("click", async () => {
    probeBtn.disabled = true;
    try {
      await api(cfg.probe_url, { method: "POST" });
      $("probe-msg").textContent = "requested: the agent runs it when it can; reload this page for the result.";
    } catch (err) {
      $("probe-msg").textContent = err.message;
      probeBtn.disabled = false;
    }
  });
}

// --- Shares (admins) --------------------------------------------------------------------------------------------------
const sharesForm = $("shares-form");
if (sharesForm && cfg.shares_url) {
  sharesForm.addEventListener("submit", async (event) => {
    event.preventDefault();
    const msg = $("shares-msg");
    const button = sharesForm.querySelector("button");
    button.disabled = true;
    msg.className = "muted";
    msg.textContent = "applying…";
    try {
      const body = await api(cfg.shares_url, { method: "POST", body: { shares: Number($("shares-count").value) } });
      msg.textContent = body.shares > 1 ? `split in ${body.shares} shares` : "exclusive";
      window.location.reload(); // the parts table and the live figures follow the new layout
    } catch (err) {
      msg.className = "form-error";
      msg.textContent = err.message;
      button.disabled = false;
    }
  });
}

// --- Wiring -------------------------------------------------------------------------------------------------------------
if (cfg.live) showLive(cfg.live);
loadHistory();

const live = $("fleet-live");
let lastAt = 0;
liveSocket("/ws/fleet/", (msg) => {
  if (msg.type !== "fleet") return;
  const g = (msg.gpus || []).find((x) => x.uuid === cfg.uuid);
  if (!g) return;
  lastAt = performance.now();
  showLive(g);
  if (range.resolution === "raw") appendLive(g);
}, {
  onState: (s) => {
    live.dataset.state = s;
    live.textContent = s === "open" ? "live" : s === "closed" ? "reconnecting…" : s === "refused" ? "not live: reload the page" : s;
  },
});
setInterval(() => {
  if (live.dataset.state === "open" && lastAt && performance.now() - lastAt > 5000) {
    live.dataset.state = "stale";
    live.textContent = "no updates";
  } else if (live.dataset.state === "stale" && performance.now() - lastAt < 5000) {
    live.dataset.state = "open";
    live.textContent = "live";
  }
}, 1000);
