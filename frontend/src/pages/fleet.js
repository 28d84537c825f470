// Fleet page: every node and GPU with live figures from /ws/fleet/ (one message a second carrying the whole fleet).
//
// Built to stay smooth with 1,000+ GPUs:
// - the table is virtualized: a fixed pool of row elements (what fits the viewport plus a margin) is re-used as
//   you scroll, so the DOM holds ~50 rows whatever the fleet size; rows are absolutely positioned with transforms
//   and `contain: strict`, so writing into one never re-lays out the others;
// - the overview map of every GPU is one canvas, and so is each visible row's sparkline;
// - a message only updates plain objects and marks things dirty; one requestAnimationFrame callback then paints:
//   it reads the scroll position once, then only writes (no read-after-write layout thrash), and it skips DOM
//   writes whose value did not change.
import "../css/fleet.css";
import { overviewMap } from "../lib/fleet_map.js";
import { ago, holderText, memText, pctText, powerText, statusOf, tempText, usable } from "../lib/fleet_text.js";

const { liveSocket } = window.Portal;

const ROW_H = 32; // px, must match .fleet-row height in fleet.css
const OVERSCAN = 6; // rows rendered above and below the viewport

const $ = (id) => document.getElementById(id);
const initial = JSON.parse($("fleet-initial").textContent);
const SPARK = initial.spark_points || 60;

// --- Model -------------------------------------------------------------------------------------------------------
const state = {
  gpus: [], // snapshot order: node name, then index
  byUuid: new Map(),
  nodes: new Map(), // name -> {name, status, last_heartbeat, gpus: [...]}
  nodeOrder: [],
  items: [], // what the table shows after filtering: {header, node, count} and gpu records
  filters: { model: "", node: "", status: "", free: false },
  lastSeq: null,
  skipped: 0,
  lastMessageAt: 0,
  socket: "connecting",
  version: 0, // bumped by every message: rows repaint their sparkline when it moves
};
const dirty = { items: true, rows: true, map: true, mapLayout: true, summary: true, options: true };

// Timing for the browser test and for anyone curious (window.__fleet.stats in the console).
const stats = { messages: 0, gpus: 0, applyMs: [], renderMs: [], updateMs: [], frames: 0, rowsInDom: 0, mapCells: 0 };
let pendingApply = null; // ms spent applying messages that no frame has painted yet

function newRecord(g) {
  return { uuid: g.uuid, hist: new Float32Array(SPARK).fill(NaN), head: 0, version: 0 };
}

function pushHist(rec, value) {
  rec.hist[rec.head] = value == null ? NaN : value;
  rec.head = (rec.head + 1) % SPARK;
}

function assign(rec, g) {
  rec.node = g.node;
  rec.index = g.index;
  rec.model = g.model;
  rec.util = g.util;
  rec.mem_used = g.mem_used;
  rec.mem_total = g.mem_total;
  rec.temp = g.temp;
  rec.power = g.power;
  rec.status = g.status || "ok";
  rec.node_status = g.node_status || "online";
  rec.stale = !!g.stale;
  rec.holder = g.holder || null;
  rec.parts = g.parts || null;
  rec.outside = g.outside || null;
}

function setStructure(list) {
  const byUuid = new Map();
  const gpus = list.map((g) => {
    const rec = state.byUuid.get(g.uuid) || newRecord(g);
    assign(rec, g);
    byUuid.set(g.uuid, rec);
    return rec;
  });
  state.gpus = gpus;
  state.byUuid = byUuid;
  dirty.items = dirty.mapLayout = dirty.options = true;
}

function setNodes(list, gpus) {
  const nodes = new Map();
  for (const n of list || []) nodes.set(n.name, { name: n.name, status: n.status, last_heartbeat: n.last_heartbeat, gpus: [] });
  for (const g of gpus) {
    let n = nodes.get(g.node);
    if (!n) nodes.set(g.node, (n = { name: g.node, status: g.node_status, last_heartbeat: null, gpus: [] }));
    n.gpus.push(g);
  }
  const changed = nodes.size !== state.nodes.size || [...nodes.keys()].some((k) => !state.nodes.has(k)) ||
    [...nodes.values()].some((n) => state.nodes.get(n.name)?.status !== n.status);
  state.nodes = nodes;
  state.nodeOrder = [...nodes.keys()].sort();
  if (changed) dirty.items = dirty.options = true;
}

function applySnapshot(doc, { push = true } = {}) {
  const list = doc.gpus || [];
  let same = list.length === state.gpus.length;
  for (let i = 0; same && i < list.length; i++) same = list[i].uuid === state.gpus[i].uuid;
  if (!same) setStructure(list);
  for (let i = 0; i < list.length; i++) {
    const g = list[i];
    const rec = state.gpus[i];
    const wasFree = !rec.holder;
    const wasUsable = rec.status !== undefined && usable(rec);
    assign(rec, g);
    if (push) pushHist(rec, rec.stale ? null : rec.util);
    // Filters depend on status and holder: a change there re-filters, a new figure does not.
    if (wasFree !== !rec.holder || wasUsable !== usable(rec)) dirty.items = true;
  }
  setNodes(doc.nodes, state.gpus);
  state.version++;
  dirty.rows = dirty.map = dirty.summary = true;
}

// --- Filters -----------------------------------------------------------------------------------------------------
const filterEls = { model: $("f-model"), node: $("f-node"), status: $("f-status"), free: $("f-free") };

function matches(g) {
  const f = state.filters;
  if (f.model && g.model !== f.model) return false;
  if (f.node && g.node !== f.node) return false;
  if (f.status) {
    const [kind, value] = f.status.split(":");
    if (kind === "gpu" && g.status !== value) return false;
    if (kind === "node" && g.node_status !== value) return false;
  }
  if (f.free && (g.holder || !usable(g))) return false;
  return true;
}

function filtering() {
  const f = state.filters;
  return !!(f.model || f.node || f.status || f.free);
}

function rebuildItems() {
  const items = [];
  const any = filtering();
  let shown = 0;
  for (const name of state.nodeOrder) {
    const node = state.nodes.get(name);
    const gs = any ? node.gpus.filter(matches) : node.gpus;
    if (!gs.length && any) continue;
    items.push({ header: true, node, count: gs.length });
    for (const g of gs) items.push(g);
    shown += gs.length;
  }
  state.items = items;
  state.shown = shown;
}

function fillSelect(select, values, current) {
  const keep = select.options[0];
  select.replaceChildren(keep, ...values.map((v) => new Option(v, v, false, v === current)));
}

function refreshOptions() {
  fillSelect(filterEls.model, [...new Set(state.gpus.map((g) => g.model))].sort(), state.filters.model);
  fillSelect(filterEls.node, state.nodeOrder, state.filters.node);
}

function readFiltersFromUrl() {
  const q = new URLSearchParams(location.search);
  state.filters = { model: q.get("model") || "", node: q.get("node") || "", status: q.get("status") || "", free: q.get("free") === "1" };
  filterEls.status.value = state.filters.status;
  filterEls.free.checked = state.filters.free;
}

function onFilterChange() {
  state.filters = {
    model: filterEls.model.value, node: filterEls.node.value, status: filterEls.status.value, free: filterEls.free.checked,
  };
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(state.filters)) if (v) q.set(k, v === true ? "1" : v);
  history.replaceState(null, "", q.toString() ? `?${q}` : location.pathname);
  dirty.items = dirty.rows = dirty.map = true;
  viewport.scrollTop = 0;
  schedule();
}
for (const el of Object.values(filterEls)) el.addEventListener("change", onFilterChange);

// --- Table: a pool of rows re-used while scrolling -----------------------------------------------------------------
const viewport = $("fleet-viewport");
const spacer = $("fleet-spacer");
const pool = [];
const DPR = Math.min(window.devicePixelRatio || 1, 2);
const SPARK_W = 110;
const SPARK_H = 20;

function el(tag, cls, parent) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (parent) parent.appendChild(e);
  return e;
}

function text(parent, cls) {
  const span = el("span", cls, parent);
  const node = document.createTextNode("");
  span.appendChild(node);
  return node;
}

function makeRow() {
  const row = el("div", "fleet-row fleet-item", viewport);
  row.setAttribute("role", "row");
  // Node header line (shown when this pooled row displays a node).
  const nodeLine = el("div", "fleet-node-line", row);
  const nodeName = text(nodeLine, "fleet-node-name");
  const nodeBadge = el("span", "badge", nodeLine);
  const nodeBadgeText = document.createTextNode("");
  nodeBadge.appendChild(nodeBadgeText);
  const nodeInfo = text(nodeLine, "muted");
  // GPU cells.
  const cells = el("div", "fleet-cells", row);
  const nameCell = el("span", "fleet-name", cells);
  const link = el("a", "", nameCell);
  const linkText = document.createTextNode("");
  link.appendChild(linkText);
  const model = text(cells, "fleet-model");
  const statusCell = el("span", "", cells);
  const badge = el("span", "badge", statusCell);
  const badgeText = document.createTextNode("");
  badge.appendChild(badgeText);
  const utilCell = el("span", "fleet-meter", cells);
  const utilBar = el("span", "fleet-bar", el("span", "fleet-track", utilCell));
  const utilText = text(utilCell, "fleet-num");
  const spark = el("canvas", "fleet-spark", cells);
  spark.width = SPARK_W * DPR;
  spark.height = SPARK_H * DPR;
  const memCell = el("span", "fleet-meter fleet-meter-mem", cells);
  const memBar = el("span", "fleet-bar fleet-bar-mem", el("span", "fleet-track", memCell));
  const memText_ = text(memCell, "fleet-num fleet-mem-num");
  const temp = text(cells, "fleet-num");
  const power = text(cells, "fleet-num");
  const holder = text(cells, "fleet-holder");
  const ctx = spark.getContext("2d");
  ctx.scale(DPR, DPR);
  return {
    row, nodeName, nodeBadge, nodeBadgeText, nodeInfo, link, linkText, model, badge, badgeText, utilBar, utilText,
    spark, ctx, memBar, memText: memText_, temp, power, holder, item: null, y: -1, cache: {},
  };
}

// Write a value only when it differs from what this row last wrote: DOM writes are the expensive part.
function put(r, key, value, write) {
  if (r.cache[key] !== value) {
    r.cache[key] = value;
    write(value);
  }
}

function bindNode(r, entry) {
  const n = entry.node;
  put(r, "kind", "node", () => r.row.classList.add("is-node"));
  put(r, "uuid", null, () => delete r.row.dataset.uuid); // only rows showing a GPU carry its uuid
  put(r, "nodeName", n.name, (v) => (r.nodeName.nodeValue = v));
  put(r, "nodeStatus", n.status, (v) => {
    r.nodeBadgeText.nodeValue = v;
    r.nodeBadge.className = `badge status-${v}`;
  });
  const gpus = `${entry.count} GPU${entry.count === 1 ? "" : "s"} · heartbeat ${ago(n.last_heartbeat)}`;
  put(r, "nodeInfo", gpus, (v) => (r.nodeInfo.nodeValue = v));
}

function bindGpu(r, g) {
  put(r, "kind", "gpu", () => r.row.classList.remove("is-node"));
  put(r, "uuid", g.uuid, (v) => {
    r.link.href = `/fleet/gpus/${encodeURIComponent(v)}/`;
    r.row.dataset.uuid = v;
  });
  put(r, "name", `${g.node} / ${g.index}`, (v) => (r.linkText.nodeValue = v));
  put(r, "model", g.model, (v) => (r.model.nodeValue = v));
  const st = statusOf(g);
  put(r, "status", st, (v) => {
    r.badgeText.nodeValue = v;
    r.badge.className = `badge status-${v}`;
  });
  put(r, "dim", !usable(g), (v) => r.row.classList.toggle("is-down", v));
  put(r, "util", g.util, (v) => {
    r.utilBar.style.transform = `scaleX(${(v || 0) / 100})`;
    r.utilText.nodeValue = pctText(v);
  });
  const memFrac = g.mem_used == null || !g.mem_total ? 0 : g.mem_used / g.mem_total;
  put(r, "memFrac", memFrac, (v) => (r.memBar.style.transform = `scaleX(${v})`));
  put(r, "mem", memText(g), (v) => (r.memText.nodeValue = v));
  put(r, "temp", tempText(g), (v) => (r.temp.nodeValue = v));
  put(r, "power", powerText(g), (v) => (r.power.nodeValue = v));
  put(r, "holder", holderText(g), (v) => {
    r.holder.nodeValue = v;
    r.holder.parentNode.title = v; // a GPU's parts and their holders can run past the column: the whole text on hover
  });
  put(r, "spark", `${g.uuid}:${state.version}`, () => drawSpark(r.ctx, g));
}

function drawSpark(ctx, g) {
  ctx.clearRect(0, 0, SPARK_W, SPARK_H);
  const step = SPARK_W / (SPARK - 1);
  ctx.beginPath();
  let pen = false;
  for (let i = 0; i < SPARK; i++) {
    const v = g.hist[(g.head + i) % SPARK];
    if (Number.isNaN(v)) {
      pen = false;
      continue;
    }
    const x = i * step;
    const y = SPARK_H - 1 - (v / 100) * (SPARK_H - 2);
    if (pen) ctx.lineTo(x, y);
    else ctx.moveTo(x, y);
    pen = true;
  }
  ctx.strokeStyle = usable(g) ? "#2f6fed" : "#9aa3b5";
  ctx.lineWidth = 1.25;
  ctx.stroke();
}

function renderRows(scrollTop, height) {
  const first = Math.max(0, Math.floor(scrollTop / ROW_H) - OVERSCAN);
  const want = Math.ceil(height / ROW_H) + 2 * OVERSCAN;
  while (pool.length < want) pool.push(makeRow());
  for (let i = 0; i < pool.length; i++) {
    const r = pool[i];
    const idx = first + i;
    const entry = idx < state.items.length && i < want ? state.items[idx] : null;
    if (!entry) {
      put(r, "hidden", true, () => (r.row.style.display = "none"));
      put(r, "uuid", null, () => delete r.row.dataset.uuid);
      r.item = null;
      continue;
    }
    put(r, "hidden", false, () => (r.row.style.display = ""));
    if (r.y !== idx) {
      r.y = idx;
      r.row.style.transform = `translateY(${idx * ROW_H}px)`;
    }
    r.item = entry;
    if (entry.header) bindNode(r, entry);
    else bindGpu(r, entry);
  }
  stats.rowsInDom = pool.length;
}

// --- Overview map: one canvas, one cell per GPU ---------------------------------------------------------------------
let flashUuid = null;
const map = $("fleet-map");
const overview = overviewMap(map, {
  dpr: DPR,
  onPick: (g) => {
    const idx = state.items.indexOf(g);
    if (idx < 0) return; // filtered out of the table
    viewport.scrollTop = Math.max(0, idx * ROW_H - viewport.clientHeight / 3);
    flashUuid = g.uuid;
    schedule();
  },
});

// --- Summary -------------------------------------------------------------------------------------------------------
const sumEls = { busy: $("sum-busy"), free: $("sum-free"), down: $("sum-down"), util: $("sum-util"), power: $("sum-power"), nodes: $("sum-nodes") };
const sumCache = {};

function drawSummary() {
  let busy = 0;
  let free = 0;
  let down = 0;
  let utilSum = 0;
  let utilN = 0;
  let power = 0;
  for (const g of state.gpus) {
    const ok = usable(g);
    if (g.holder) busy++;
    else if (ok) free++;
    else down++;
    if (ok && g.util != null) {
      utilSum += g.util;
      utilN++;
    }
    if (!g.stale && g.power != null) power += g.power;
  }
  let online = 0;
  for (const n of state.nodes.values()) if (n.status === "online") online++;
  const values = {
    busy: `${busy} / ${state.gpus.length}`,
    free: String(free),
    down: String(down),
    util: utilN ? `${Math.round(utilSum / utilN)}%` : "—",
    power: power >= 10000 ? `${(power / 1000).toFixed(1)} kW` : `${Math.round(power)} W`,
    nodes: `${online} / ${state.nodes.size}`,
  };
  for (const [k, v] of Object.entries(values)) {
    if (sumCache[k] !== v) {
      sumCache[k] = v;
      sumEls[k].textContent = v;
    }
  }
}

// --- Live indicator ------------------------------------------------------------------------------------------------
const live = $("fleet-live");
let liveText = "";

function drawLive() {
  let s = state.socket;
  if (s === "open" && state.lastMessageAt && performance.now() - state.lastMessageAt > 5000) s = "stale";
  const label = { connecting: "connecting…", open: "live", stale: "no updates", closed: "reconnecting…", refused: "not live: reload the page" }[s] || s;
  const txt = state.skipped ? `${label} · ${state.skipped} skipped` : label;
  if (txt !== liveText) {
    liveText = txt;
    live.textContent = txt;
    live.dataset.state = s;
    live.title = state.skipped
      ? `${state.skipped} snapshots were skipped because this tab could not keep up or the connection dropped`
      : "Live updates, one a second";
  }
}
setInterval(drawLive, 1000);

// --- The frame ------------------------------------------------------------------------------------------------------
let scheduled = false;

function schedule() {
  if (!scheduled) {
    scheduled = true;
    requestAnimationFrame(frame);
  }
}

function frame() {
  scheduled = false;
  const t0 = performance.now();
  // Reads first, all of them...
  const scrollTop = viewport.scrollTop;
  const height = viewport.clientHeight;
  const mapWidth = overview.width();
  const width = dirty.mapLayout || !mapWidth ? map.parentElement.clientWidth : mapWidth;
  // ...then only writes.
  if (dirty.options) {
    refreshOptions();
    dirty.options = false;
  }
  if (dirty.items) {
    rebuildItems();
    spacer.style.height = `${state.items.length * ROW_H}px`;
    $("f-count").textContent = filtering() ? `${state.shown} of ${state.gpus.length} GPUs` : `${state.gpus.length} GPUs`;
    $("fleet-empty").hidden = state.shown > 0 || !state.gpus.length;
    if (state.gpus.length && $("fleet-none")) $("fleet-none").hidden = true; // the first GPUs just registered
    dirty.items = false;
    dirty.map = true;
  }
  if (dirty.mapLayout || width !== mapWidth) {
    stats.mapCells = overview.layout(width, state.nodeOrder, state.nodes);
    dirty.mapLayout = false;
    dirty.map = true;
  }
  if (dirty.map) {
    const any = filtering();
    overview.draw((g) => any && !matches(g));
    dirty.map = false;
  }
  renderRows(scrollTop, height);
  if (flashUuid) {
    const r = pool.find((p) => p.item && p.item.uuid === flashUuid);
    if (r) {
      r.row.classList.add("is-flash");
      setTimeout(() => r.row.classList.remove("is-flash"), 1200);
    }
    flashUuid = null;
  }
  if (dirty.summary) {
    drawSummary();
    dirty.summary = false;
  }
  const t1 = performance.now();
  stats.frames++;
  record(stats.renderMs, t1 - t0);
  if (pendingApply !== null) {
    record(stats.updateMs, pendingApply + (t1 - t0));
    pendingApply = null;
  }
}

function record(list, v) {
  list.push(Math.round(v * 100) / 100);
  if (list.length > 200) list.shift();
}

viewport.addEventListener("scroll", schedule, { passive: true });
window.addEventListener("resize", () => {
  dirty.mapLayout = true;
  schedule();
});

// --- Wiring ----------------------------------------------------------------------------------------------------------
function onMessage(msg) {
  if (msg.type !== "fleet") return;
  const t0 = performance.now();
  if (typeof msg.seq === "number") {
    // A gap means this tab missed snapshots (it fell behind, or reconnected); a smaller seq is a restarted publisher.
    if (state.lastSeq !== null && msg.seq > state.lastSeq + 1) state.skipped += msg.seq - state.lastSeq - 1;
    state.lastSeq = msg.seq;
  }
  applySnapshot(msg);
  state.lastMessageAt = performance.now();
  stats.messages++;
  stats.gpus = state.gpus.length;
  const t1 = performance.now();
  record(stats.applyMs, t1 - t0);
  // Update time = applying the message + painting it, not the wait for the animation frame in between.
  pendingApply = (pendingApply || 0) + (t1 - t0);
  schedule();
}

// Initial state, rendered by the server (the last snapshot, or the database when no publisher runs), so the page is
// complete before the first websocket message.
readFiltersFromUrl();
applySnapshot(initial.snapshot, { push: false });
for (const [uuid, values] of Object.entries(initial.history || {})) {
  const rec = state.byUuid.get(uuid);
  if (rec) for (const v of values.slice(-SPARK)) pushHist(rec, v);
}
if (typeof initial.snapshot.seq === "number") state.lastSeq = initial.snapshot.seq;
stats.gpus = state.gpus.length;
refreshOptions();
dirty.options = false;
schedule();

liveSocket("/ws/fleet/", onMessage, {
  onState: (s) => {
    state.socket = s;
    drawLive();
  },
});

window.__fleet = { state, stats, cellOf: (uuid) => overview.cellOf(uuid) };
