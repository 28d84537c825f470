// Book page: a timeline of GPUs (rows, by node) against time (columns), a booking form, live availability and
// quota, "my reservations" with cancel/release. Plain DOM; times shown in the browser's zone, sent as UTC ISO.
import "../css/book.css";
import { gpusText, linkModelAndPart, partModels } from "../lib/parts.js";
import { waitlistOffer } from "../lib/waitlist.js";

const { api } = window.Portal;
const cfg = JSON.parse(document.getElementById("book-config").textContent);
const GRAIN = Math.max(1, cfg.policy.granularity_minutes);
const MINUTE = 60 * 1000;
const HOUR = 60 * MINUTE;
const DAY = 24 * HOUR;

const $ = (id) => document.getElementById(id);
const form = $("book-form");
const el = {
  team: $("book-team"), model: $("book-model"), count: $("book-count"), start: $("book-start"), end: $("book-end"),
  note: $("book-note"), error: $("book-error"), success: $("book-success"), avail: $("book-availability"),
  quota: $("book-quota"), picked: $("book-picked"), pickedName: $("book-picked-name"), timeline: $("timeline"),
  mine: $("my-reservations"), mineError: $("my-error"), ended: $("ended-reservations"), submit: $("book-submit"), part: $("book-part"),
};

const state = { from: startOfDay(new Date()), days: 7, data: null, gpu: null, drag: null };

// --- time helpers ---------------------------------------------------------------------------------------
function startOfDay(d) { return new Date(d.getFullYear(), d.getMonth(), d.getDate()); }
function snap(d, mode = "round") {
  const ms = GRAIN * MINUTE;
  const local = d.getTime() - d.getTimezoneOffset() * MINUTE; // grid in local wall time
  const f = mode === "floor" ? Math.floor : mode === "ceil" ? Math.ceil : Math.round;
  const snapped = f(local / ms) * ms;
  return new Date(snapped + d.getTimezoneOffset() * MINUTE);
}
const pad = (n) => String(n).padStart(2, "0");
function toInput(d) {
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T${pad(d.getHours())}:${pad(d.getMinutes())}`;
}
function fromInput(v) { return v ? new Date(v) : null; }
const dtFmt = new Intl.DateTimeFormat(undefined, { weekday: "short", month: "short", day: "numeric", hour: "2-digit", minute: "2-digit" });
const tFmt = new Intl.DateTimeFormat(undefined, { hour: "2-digit", minute: "2-digit" });
const dayFmt = new Intl.DateTimeFormat(undefined, { weekday: "short", day: "numeric", month: "short" });
const fmt = (v) => dtFmt.format(new Date(v));
function span(a, b) {
  const s = new Date(a), e = new Date(b);
  return startOfDay(s).getTime() === startOfDay(e).getTime() ? `${fmt(s)}–${tFmt.format(e)}` : `${fmt(s)} – ${fmt(e)}`;
}
const windowEnd = () => new Date(state.from.getTime() + state.days * DAY);
function pct(t) {
  const a = state.from.getTime(), b = windowEnd().getTime();
  return Math.max(0, Math.min(100, ((t - a) / (b - a)) * 100));
}
function h(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v == null || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "style") node.style.cssText = v;
    else if (k.startsWith("data-")) node.setAttribute(k, v);
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children.flat()) if (c != null) node.append(c.nodeType ? c : document.createTextNode(String(c)));
  return node;
}

// --- form state --------------------------------------------------------------------------------------------
function formWindow() {
  const s = fromInput(el.start.value), e = fromInput(el.end.value);
  return s && e && e > s ? { start: s, end: e } : null;
}
function setWindow(s, e) {
  el.start.value = toInput(s);
  el.end.value = toInput(e);
}
// A GPU the chosen team's quota excludes is refused when it is picked, not at submit.
function quotaRefuses(gpu) {
  const team = cfg.teams.find((t) => t.slug === el.team.value);
  if (!gpu || !team || team.models.includes(gpu.model)) return "";
  return `${team.name || team.slug}'s quota does not allow ${gpu.model}: pick a GPU of ${team.models.join(", ") || "another model"}, or another team.`;
}
function showRefusal(text) {
  el.error.hidden = false;
  el.error.replaceChildren(h("p", { "data-code": "quota_model" }, text));
}
function pickGpu(gpu) {
  state.gpu = gpu;
  el.picked.hidden = !gpu;
  el.count.disabled = !!gpu;
  if (gpu) {
    el.pickedName.textContent = `${gpu.node}/${gpu.index} · ${gpu.model}`;
    el.model.value = gpu.model;
    el.count.value = 1;
  }
}
$("book-picked-clear").addEventListener("click", () => { pickGpu(null); drawPick(); refreshInfo(); });

function clearMessages() {
  el.error.hidden = true;
  el.error.textContent = "";
  el.success.hidden = true;
  form.querySelectorAll(".field-error").forEach((d) => { d.textContent = ""; });
}

function describeConflict(c) {
  if (c.maintenance) return `${c.node} GPU ${c.gpu}: maintenance`;
  const who = c.user ? `${c.team} (${c.user}${c.reservation_id ? `, #${c.reservation_id}` : ""})` : c.team;
  return `${c.node}/${c.gpu_index} is held by ${who}, ${span(c.start, c.end)}`;
}
function money(v) { return v == null ? "unlimited" : window.Portal.money(v, cfg.currency); }
function hours(v) { return v == null ? "unlimited" : `${Number(v).toFixed(2)} GPU-h`; }

function showError(err) {
  el.error.hidden = false;
  el.error.replaceChildren();
  const body = err.body || {};
  el.error.append(h("strong", {}, err.message || "Booking failed."));
  if (body.code === "conflict" && Array.isArray(body.conflicts) && body.conflicts.length) {
    el.error.append(h("ul", { class: "conflicts" }, body.conflicts.map((c) => h("li", {}, describeConflict(c)))));
  }
  if (body.code === "conflict" && body.free !== undefined && state.lastBody && state.lastBody.gpu_model) {
    el.error.append(waitlistOffer(api, h, state.lastBody));
  }
  if (body.code === "quota_exceeded" && body.remaining) {
    const r = body.remaining;
    const parts = [];
    if (r.gpu_hours != null) parts.push(`${hours(r.gpu_hours)} left`);
    if (r.budget != null) parts.push(`${money(r.budget)} of budget left`);
    if (r.concurrent_gpus != null) parts.push(`${r.concurrent_gpus} more GPUs at once`);
    el.error.append(h("p", { class: "quota-left" }, `Quota ${body.month}: ${parts.join(", ") || "nothing left"}.`));
  }
  for (const [field, msgs] of Object.entries(body.fields || {})) {
    const slot = form.querySelector(`.field-error[data-field="${field}"]`);
    if (slot) slot.textContent = msgs.join(" ");
  }
}

function idempotencyKey() {
  if (window.crypto && crypto.randomUUID) return crypto.randomUUID();
  return `k-${Date.now()}-${Math.random().toString(36).slice(2)}`;
}

form.addEventListener("submit", async (ev) => {
  ev.preventDefault();
  clearMessages();
  const w = formWindow();
  if (!w) {
    showError({ message: "Choose a start and an end after it.", body: { fields: { end: ["Must be after start."] } } });
    return;
  }
  const body = { team: el.team.value, start: w.start.toISOString(), end: w.end.toISOString(), note: el.note.value };
  const part = el.part ? el.part.value : "";
  if (part.startsWith("mig:")) { body.mig_profile = part.slice(4); body.gpu_count = Number(el.count.value); }
  else if (part.startsWith("share:")) body.gpu_share = Number(part.slice(6));
  if (state.gpu) body.gpus = [state.gpu.uuid];
  else if (!part) { body.gpu_model = el.model.value; body.gpu_count = Number(el.count.value); }
  else body.gpu_model = el.model.value; // a part of the model chosen (the quota line asked for the same)
  state.lastBody = body;
  el.submit.disabled = true;
  try {
    const r = await api("/api/v1/reservations/", { method: "POST", body, headers: { "Idempotency-Key": idempotencyKey() } });
    el.success.hidden = false;
    const gpus = gpusText(r.gpus);
    el.success.textContent = `Booked #${r.id}: ${gpus}, ${span(r.start, r.end)}.`;
    for (const wng of r.warnings || []) el.success.textContent += ` Note: over the soft budget for ${wng.month}.`;
    pickGpu(null);
    await Promise.all([loadTimeline(), loadMine(), refreshInfo()]);
  } catch (err) {
    showError(err);
  } finally {
    el.submit.disabled = false;
  }
});

// --- availability and quota, while choosing -----------------------------------------------------------------
let infoTimer = null;
let infoSeq = 0;
let infoWaiting = [];
// Debounced: a call within 200 ms replaces the pending load, and every caller's promise resolves when the load
// that replaced it ends (a dropped promise would leave the Book button disabled after a booking while typing).
function refreshInfo() {
  clearTimeout(infoTimer);
  return new Promise((resolve) => {
    infoWaiting.push(resolve);
    infoTimer = setTimeout(() => {
      const waiting = infoWaiting;
      infoWaiting = [];
      loadInfo().finally(() => waiting.forEach((done) => done()));
    }, 200);
  });
}
async function loadInfo() {
  const w = formWindow();
  const seq = ++infoSeq;
  if (!w) { el.avail.textContent = ""; el.quota.textContent = ""; return; }
  const q = (o) => new URLSearchParams(o).toString();
  const range = { start: w.start.toISOString(), end: w.end.toISOString() };
  const count = state.gpu ? 1 : Number(el.count.value) || 1;
  // A part of a GPU counts its fraction against the quota, as the booking will (a MIG instance 1/7 per g).
  const part = el.part ? el.part.value : "";
  const asked = part.startsWith("mig:") ? { gpu_count: count, mig_profile: part.slice(4) }
    : part.startsWith("share:") ? { gpu_share: part.slice(6) } : { gpu_count: count };
  try {
    const [avail, quota] = await Promise.all([
      api(`/api/v1/availability/?${q({ ...range, model: el.model.value })}`),
      el.team.value
        ? api(`/api/v1/booking/quota/?${q({ ...range, team: el.team.value, ...asked, gpu_model: el.model.value })}`)
        : null,
    ]);
    if (seq !== infoSeq) return;
    const m = avail.models.find((x) => x.model === el.model.value) || { free: 0, total: 0, max_free_on_one_node: 0 };
    el.avail.replaceChildren(
      h("span", { class: m.free >= count ? "ok" : "bad", "data-free": String(m.free) },
        `${m.free} of ${m.total} ${el.model.value} free in this window`),
      ` (at most ${m.max_free_on_one_node} on one node).`,
    );
    if (quota) {
      const parts = quota.months.map((mo) => {
        const left = [];
        if (mo.remaining.gpu_hours != null) left.push(`${hours(mo.remaining.gpu_hours)}`);
        if (mo.remaining.budget != null) left.push(`${money(mo.remaining.budget)}`);
        if (mo.remaining.concurrent_gpus != null) left.push(`${mo.remaining.concurrent_gpus} GPUs at once`);
        return `${mo.month}: uses ${hours(mo.requested.gpu_hours)} (${money(mo.requested.cost)}); left ${left.join(", ") || "unlimited"}`
          + (mo.exceeded.length ? ` — exceeds ${mo.exceeded.join(", ")}` : "")
          + (mo.warnings.length ? " — over the soft budget" : "");
      });
      el.quota.replaceChildren(h("span", { class: quota.fits ? "ok" : "bad", "data-fits": String(quota.fits) }, `Quota ${parts.join("; ")}.`));
    }
  } catch (err) {
    if (seq === infoSeq) el.avail.textContent = err.message;
  }
}
// The model select offers only what the chosen team's quota allows (the server lists it per team).
function syncModels() {
  const team = cfg.teams.find((t) => t.slug === el.team.value);
  const names = team ? team.models : [];
  const keep = el.model.value;
  el.model.replaceChildren(...names.map((n) => new Option(n, n)));
  if (names.includes(keep)) el.model.value = keep;
}
// The model and the part stay consistent (lib/parts.js); a booking of a part is of the model chosen. The server
// refuses a mismatch all the same (400).
const syncPart = linkModelAndPart(el.model, el.part, partModels(cfg.parts));
el.team.addEventListener("change", () => {
  syncModels();
  syncPart();
  const refused = quotaRefuses(state.gpu); // a GPU picked for another team
  if (refused) { pickGpu(null); clearMessages(); showRefusal(refused); drawPick(); }
});
for (const input of [el.team, el.model, el.count, el.start, el.end, el.part].filter(Boolean)) {
  for (const type of ["input", "change"]) input.addEventListener(type, () => { drawPick(); refreshInfo(); });
}

// --- timeline -----------------------------------------------------------------------------------------------
async function loadTimeline() {
  const q = new URLSearchParams({ start: state.from.toISOString(), end: windowEnd().toISOString() });
  const asked = q.toString();
  try {
    const data = await api(`/api/v1/booking/timeline/?${q}`);
    // A newer window was asked for meanwhile (the days or the dates changed): its answer draws, not this one.
    if (asked !== new URLSearchParams({ start: state.from.toISOString(), end: windowEnd().toISOString() }).toString()) return;
    state.data = data;
    drawTimeline();
    el.timeline.dataset.days = String(state.days); // drawn for this window (tests wait on it)
  } catch (err) {
    el.timeline.replaceChildren(h("p", { class: "form-error" }, err.message));
  }
}

function drawScale() {
  const ticks = [];
  const step = state.days <= 1 ? 2 * HOUR : state.days <= 3 ? 6 * HOUR : DAY;
  for (let t = state.from.getTime(); t < windowEnd().getTime(); t += DAY) {
    ticks.push(h("div", { class: "tl-day", style: `left:${pct(t)}%;width:${(100 * DAY) / (state.days * DAY)}%` }, dayFmt.format(new Date(t))));
  }
  if (step < DAY) {
    for (let t = state.from.getTime() + step; t < windowEnd().getTime(); t += step) {
      if ((t - state.from.getTime()) % DAY) ticks.push(h("div", { class: "tl-hour", style: `left:${pct(t)}%` }, tFmt.format(new Date(t))));
    }
  }
  return h("div", { class: "tl-row tl-head" }, h("div", { class: "tl-label" }, "GPU"), h("div", { class: "tl-track tl-scale" }, ticks));
}

function drawTimeline() {
  const data = state.data;
  if (!data) return;
  if (!data.gpus.length) {
    el.timeline.replaceChildren(h("p", { class: "muted" }, "No GPUs have registered yet."));
    return;
  }
  const slotsByGpu = new Map();
  for (const s of data.slots) {
    if (!slotsByGpu.has(s.gpu_id)) slotsByGpu.set(s.gpu_id, []);
    slotsByGpu.get(s.gpu_id).push(s);
  }
  const now = Date.now();
  const rows = [drawScale()];
  let node = null;
  for (const g of data.gpus) {
    if (g.node !== node) {
      node = g.node;
      rows.push(h("div", { class: "tl-node" }, node, g.node_status !== "online" ? h("span", { class: `badge status-${g.node_status}` }, g.node_status) : null));
    }
    const track = h("div", { class: "tl-track", "data-gpu-id": g.id });
    for (let t = state.from.getTime() + DAY; t < windowEnd().getTime(); t += DAY) track.append(h("div", { class: "tl-grid", style: `left:${pct(t)}%` }));
    for (const m of data.maintenance) {
      if (m.gpu_id === g.id || m.node === g.node || (m.gpu_id == null && m.node == null)) {
        const l = pct(new Date(m.start).getTime()), r = pct(new Date(m.end).getTime());
        track.append(h("div", { class: "tl-slot maint", style: `left:${l}%;width:${r - l}%`, title: `Maintenance: ${m.reason || ""} ${span(m.start, m.end)}` }, "maintenance"));
      }
    }
    for (const s of slotsByGpu.get(g.id) || []) {
      const l = pct(new Date(s.start).getTime()), r = pct(new Date(s.end).getTime());
      const part = s.lanes ? `${s.profile || `${Math.round(s.share * 100)}%`} · ` : "";
      const label = part + (s.mine ? `${s.team}${s.user ? ` · ${s.user}` : ""}${s.reservation_id ? ` #${s.reservation_id}` : ""}` : s.team);
      // A MIG instance or a share takes its own lane of the row: the row shows how much of the GPU is held.
      const lane = s.lanes ? `;top:${(s.lane / s.lanes) * 100}%;height:${100 / s.lanes}%;bottom:auto` : "";
      const title = s.mine || s.kind
        ? `${s.team} ${s.kind === "job" ? `job ${s.job_id}` : `reservation #${s.reservation_id}`} by ${s.user || "?"}\n${span(s.start, s.end)}${s.note ? `\n${s.note}` : ""}`
        : `${s.team}\n${span(s.start, s.end)}`;
      track.append(h("div", {
        class: `tl-slot ${s.mine ? "mine" : "other"}`, style: `left:${l}%;width:${Math.max(r - l, 0.3)}%${lane}`, title,
        "data-reservation-id": s.reservation_id, "data-job-id": s.job_id, "data-team": s.team,
      }, label));
    }
    if (now > state.from.getTime() && now < windowEnd().getTime()) track.append(h("div", { class: "tl-now", style: `left:${pct(now)}%` }));
    const bookable = g.bookable;
    track.classList.toggle("disabled", !bookable);
    if (bookable) track.addEventListener("pointerdown", (ev) => startDrag(ev, g, track));
    rows.push(h("div", { class: "tl-row", "data-gpu-uuid": g.uuid },
      h("div", { class: "tl-label", title: g.uuid }, `${g.index} · ${g.model}`, bookable ? null : h("span", { class: "badge status-offline" }, g.status)),
      track));
  }
  el.timeline.replaceChildren(h("div", { class: "tl" }, rows));
  drawPick();
}

function timeAt(track, clientX) {
  const r = track.getBoundingClientRect();
  const f = Math.max(0, Math.min(1, (clientX - r.left) / r.width));
  return new Date(state.from.getTime() + f * (windowEnd().getTime() - state.from.getTime()));
}
function startDrag(ev, gpu, track) {
  if (ev.button !== 0 || ev.target.closest(".tl-slot.mine, .tl-slot.other")) return;
  ev.preventDefault();
  track.setPointerCapture(ev.pointerId);
  const t0 = snap(timeAt(track, ev.clientX), "floor");
  state.drag = { gpu, track, t0, t1: new Date(t0.getTime() + GRAIN * MINUTE) };
  drawDrag();
  const move = (e) => {
    const t = snap(timeAt(track, e.clientX), "ceil");
    state.drag.t1 = t;
    drawDrag();
  };
  const up = () => {
    track.removeEventListener("pointermove", move);
    track.removeEventListener("pointerup", up);
    const d = state.drag;
    state.drag = null;
    let s = d.t0 < d.t1 ? d.t0 : d.t1, e = d.t0 < d.t1 ? d.t1 : d.t0;
    if (e.getTime() - s.getTime() < Math.max(GRAIN, cfg.policy.min_duration_minutes) * MINUTE) {
      e = new Date(s.getTime() + Math.max(HOUR, cfg.policy.min_duration_minutes * MINUTE));
    }
    // A drag over time that has already passed keeps its length and moves to start now:
    // clamping only the start would leave the end before it.
    const earliest = snap(new Date(), "floor");
    if (s < earliest) {
      const length = e.getTime() - s.getTime();
      s = earliest;
      if (e <= s) e = new Date(s.getTime() + length);
    }
    setWindow(s, e);
    clearMessages();
    const refused = quotaRefuses(gpu);
    pickGpu(refused ? null : gpu);
    if (refused) showRefusal(refused);
    else fitPart(gpu);
    drawPick();
    refreshInfo();
  };
  track.addEventListener("pointermove", move);
  track.addEventListener("pointerup", up);
}
function drawDrag() {
  document.querySelectorAll(".tl-pick").forEach((n) => n.remove());
  const d = state.drag;
  const a = Math.min(d.t0, d.t1), b = Math.max(d.t0, d.t1);
  d.track.append(h("div", { class: "tl-pick", style: `left:${pct(a)}%;width:${pct(b) - pct(a)}%` }));
}
// Which GPUs the part asked for can land on: a whole GPU is never one in MIG mode, an instance only one in MIG mode,
// a share only a GPU split in shares (the server decides; this only keeps the highlight honest).
function takesPart(g) {
  const part = el.part ? el.part.value : "";
  if (part.startsWith("mig:")) return g.mig_mode;
  if (part.startsWith("share:")) return !g.mig_mode && g.shares > 1;
  return !g.mig_mode;
}
// A GPU picked on the timeline gets a part it can give: an instance of it when it is in MIG mode (it is never
// booked whole), the whole GPU when the part asked for is one it cannot give.
function fitPart(gpu) {
  if (!el.part || takesPart(gpu)) return;
  const models = partModels(cfg.parts);
  const gives = (o) => o.value === "" || (models[o.value] || []).includes(gpu.model);
  const wanted = (o) => (gpu.mig_mode ? o.value.startsWith("mig:") : o.value === "");
  const fit = [...el.part.options].find((o) => gives(o) && wanted(o));
  if (fit) el.part.value = fit.value;
}
function drawPick() {
  document.querySelectorAll(".tl-pick").forEach((n) => n.remove());
  const w = formWindow();
  if (!w || !state.data) return;
  const l = pct(w.start.getTime()), r = pct(w.end.getTime());
  if (r <= l) return;
  const tracks = state.gpu
    ? [el.timeline.querySelector(`.tl-track[data-gpu-id="${state.gpu.id}"]`)]
    : state.data.gpus.filter((g) => g.model === el.model.value && g.bookable && takesPart(g))
      .map((g) => el.timeline.querySelector(`.tl-track[data-gpu-id="${g.id}"]`));
  for (const t of tracks) if (t) t.append(h("div", { class: `tl-pick${state.gpu ? "" : " soft"}`, style: `left:${l}%;width:${r - l}%` }));
}

$("tl-prev").addEventListener("click", () => { state.from = new Date(state.from.getTime() - state.days * DAY); loadTimeline(); });
$("tl-next").addEventListener("click", () => { state.from = new Date(state.from.getTime() + state.days * DAY); loadTimeline(); });
$("tl-today").addEventListener("click", () => { state.from = startOfDay(new Date()); loadTimeline(); });
$("tl-days").addEventListener("change", (e) => { state.days = Number(e.target.value); loadTimeline(); });

// --- my reservations ----------------------------------------------------------------------------------------
async function loadMine() {
  const q = new URLSearchParams({ status: "booked,active", limit: "200" });
  const tbody = el.mine.querySelector("tbody");
  try {
    const page = await api(`/api/v1/reservations/?${q}`);
    const rows = page.results || page;
    if (!rows.length) {
      tbody.replaceChildren(h("tr", {}, h("td", { colspan: 8, class: "muted" }, "No upcoming or active reservations.")));
      return;
    }
    const now = Date.now();
    tbody.replaceChildren(...rows.map((r) => {
      const started = new Date(r.start).getTime() <= now;
      const action = started ? "Release" : "Cancel";
      const btn = h("button", { class: "danger small", type: "button", "data-action": action.toLowerCase(), onclick: () => endReservation(r, action) }, action);
      const more = h("button", { class: "small", type: "button", "data-action": "extend", title: "End an hour later, if its GPUs are free then", onclick: () => extendReservation(r) }, "+1 h");
      return h("tr", { "data-reservation-id": r.id },
        h("td", {}, h("a", { href: `/book/reservations/${r.id}/` }, `#${r.id}`)), h("td", {}, r.team),
        h("td", {}, gpusText(r.gpus), h("div", { class: "muted small" }, r.gpu_model || "")),
        h("td", {}, fmt(r.start)), h("td", {}, fmt(r.end)),
        h("td", {}, h("span", { class: `badge status-${r.status}` }, r.status)),
        h("td", {}, r.user || ""), h("td", {}, more, " ", btn));
    }));
  } catch (err) {
    tbody.replaceChildren(h("tr", {}, h("td", { colspan: 8, class: "form-error" }, err.message)));
  }
}
// --- ended early: what the holder released and what the portal ended, with the reason ------------------------
const ENDED_BY = {
  idle: "Reclaimed by the portal: its GPUs were idle.",
  unused: "Reclaimed by the portal: its GPUs were not used.",
  empty: "Reclaimed by the portal: its GPUs were not used.",
  layout: "Ended by the portal: the MIG layout of its GPU changed and no equal device was free.",
  gpu_gone: "Ended by the portal: its GPU is gone from its node and no equal GPU was free.",
  scheduler: "Refused by the pool's scheduler.",
};
function endedWhy(r) {
  if (r.released_reason) return ENDED_BY[r.released_reason] || `Ended by the portal (${r.released_reason}).`;
  return r.status === "cancelled" ? "Cancelled before its start." : "Released early.";
}
async function loadEnded() {
  const since = new Date(Date.now() - 7 * DAY);
  const q = new URLSearchParams({ early: "true", from: since.toISOString(), limit: "200" });
  const tbody = el.ended.querySelector("tbody");
  try {
    const page = await api(`/api/v1/reservations/?${q}`);
    const rows = (page.results || page)
      .filter((r) => r.ended_at && new Date(r.ended_at) >= since)
      .sort((a, b) => new Date(b.ended_at) - new Date(a.ended_at))
      .slice(0, 20);
    if (!rows.length) {
      tbody.replaceChildren(h("tr", {}, h("td", { colspan: 6, class: "muted" }, "None.")));
      return;
    }
    tbody.replaceChildren(...rows.map((r) => h("tr", { "data-reservation-id": r.id, "data-reason": r.released_reason || "" },
      h("td", {}, h("a", { href: `/book/reservations/${r.id}/` }, `#${r.id}`)), h("td", {}, r.team), h("td", {}, gpusText(r.gpus)),
      h("td", {}, span(r.start, r.booked_end || r.end)), h("td", {}, fmt(r.ended_at)),
      h("td", {}, h("span", { class: `badge status-${r.status}` }, r.status), " ", endedWhy(r)))));
  } catch (err) {
    tbody.replaceChildren(h("tr", {}, h("td", { colspan: 6, class: "form-error" }, err.message)));
  }
}
// The banner (every page) hears when the portal moves or ends one of the user's bookings: the lists follow.
window.addEventListener("portal:reservation-changed", () => {
  Promise.all([loadMine(), loadEnded(), loadTimeline()]).catch(showError);
});

// Bookings made, changed or ended by anyone (a teammate, another team, the portal), and jobs outside reservations
// taking or leaving GPUs, reach this page as they happen: the timeline when the change touches the days shown, the
// lists when it is one of the user's teams' reservations.
// Changes that come together are reloaded together; a reload waits while the user drags on the timeline.
const live = { timer: null, timeline: false, mine: false, seen: false };
function liveReload() {
  live.timer = null;
  if (state.drag) { live.timer = setTimeout(liveReload, 500); return; }
  const work = [refreshInfo()];
  if (live.timeline) work.push(loadTimeline());
  if (live.mine) work.push(loadMine(), loadEnded());
  live.timeline = live.mine = false;
  Promise.all(work).catch(showError);
}
window.Portal.liveSocket("/ws/bookings/", (msg) => {
  if (msg.type === "bookings.watching") {
    el.timeline.dataset.live = "1"; // changes reach this page from now on (tests wait on it)
    // On a reconnect (not the first connect) changes may have been missed while away: reload everything.
    if (live.seen) { live.timeline = live.mine = true; } else { live.seen = true; return; }
  } else if (msg.type === "bookings.changed") {
    const touches = new Date(msg.start) < windowEnd() && new Date(msg.end) > state.from;
    if (!touches && !msg.mine) return;
    live.timeline = live.timeline || touches;
    live.mine = live.mine || (msg.mine && msg.kind !== "job"); // a job outside a reservation shows on the timeline only
  } else {
    return;
  }
  if (!live.timer) live.timer = setTimeout(liveReload, 300);
});

// An hour more, when its GPUs are free then and the quota allows it; the portal says why not.
async function extendReservation(r) {
  el.mineError.hidden = true;
  const end = new Date(new Date(r.end).getTime() + HOUR).toISOString();
  try {
    const changed = await api(`/api/v1/reservations/${r.id}/`, { method: "PATCH", body: { end } });
    await Promise.all([loadMine(), loadTimeline(), refreshInfo()]);
    const over = (changed.warnings || []).map((w) => w.month);
    if (over.length) {
      el.mineError.hidden = false;
      el.mineError.textContent = `#${r.id} extended. Note: over the soft budget for ${over.join(", ")}.`;
    }
  } catch (err) {
    el.mineError.hidden = false;
    el.mineError.textContent = err.message;
  }
}

async function endReservation(r, action) {
  el.mineError.hidden = true;
  const what = action === "Release" ? "Release its GPUs now" : "Cancel it";
  if (!window.confirm(`${what}? Reservation #${r.id}, ${span(r.start, r.end)}.`)) return;
  try {
    await api(`/api/v1/reservations/${r.id}/`, { method: "DELETE" });
    await Promise.all([loadMine(), loadEnded(), loadTimeline(), refreshInfo()]);
  } catch (err) {
    el.mineError.hidden = false;
    el.mineError.textContent = err.message;
  }
}

// --- start -----------------------------------------------------------------------------------------------------
(function init() {
  const s = snap(new Date(Date.now() + HOUR), "ceil");
  setWindow(s, new Date(s.getTime() + 2 * HOUR));
  loadTimeline();
  loadMine();
  loadEnded();
  refreshInfo();
})();
