import { chart, color } from "../lib/charts.js";

// Reservation page: while the reservation holds its GPUs, each device's utilization and memory now, from
// /api/v1/gpus/?uuid=... every 2 s. A MIG instance shows its own memory and, where the GPU reads it (GPM, Hopper and later), its
// own SM activity; a share shows what this reservation's processes use (`share_holders`: known where it is the GPU's
// only reservation or its holders' uids are known), and its GPU's utilization: NVML has none per share.
function init() {
  const root = document.getElementById("reservation-page");
  if (!root || root.dataset.live !== "true") return;
  const { api, pct, mib } = window.Portal;
  const rows = [...document.querySelectorAll("#res-devices tr[data-gpu]")];
  const wanted = new Set(rows.map((tr) => tr.dataset.gpu));
  async function refresh() {
    try {
      // Only its GPUs: a fleet may have more GPUs than one page of the list holds.
      const q = new URLSearchParams({ uuid: [...wanted].join(","), limit: String(wanted.size) });
      const body = await api(`/api/v1/gpus/?${q}`);
      for (const g of body.results || body) {
        if (!wanted.has(g.uuid)) continue;
        for (const tr of rows.filter((r) => r.dataset.gpu === g.uuid)) {
          let util = g.utilization;
          let mem = g.memory_used_mib;
          if (tr.dataset.kind === "mig") {
            const instance = (g.mig_devices || []).find((d) => d.uuid === tr.dataset.uuid);
            mem = instance ? instance.memory_used_mib : null;
            if (instance && instance.sm_active_pct != null) util = instance.sm_active_pct;
          } else if (tr.dataset.kind === "share") {
            // The GPU's memory is every holder's together; the holder's own reading is on its first share's row.
            const holder = (g.share_holders || []).find((h) => h.share_uuids[0] === tr.dataset.uuid);
            mem = holder ? holder.memory_used_mib : null;
          }
          tr.querySelector(".util").textContent = pct(util);
          tr.querySelector(".mem").textContent = mem == null ? "—" : mib(mem);
        }
      }
    } catch (e) { /* the fleet API may be away for a moment; try again next tick */ }
  }
  refresh();
  setInterval(refresh, 2000);
}

document.addEventListener("DOMContentLoaded", init);

// While the reservation may still change, the page follows what others do to it (a teammate or a manager moves its
// end, an admin cancels it, the portal starts, moves or reclaims it): the bookings socket says that bookings
// changed in a window; when the window touches this one, the page asks the API whether this reservation changed
// and reloads if it did (the socket never says whose booking changed). A reload waits while its end is being edited.
function follow() {
  const root = document.getElementById("reservation-page");
  if (!root || root.dataset.follow !== "true") return;
  const { api, liveSocket } = window.Portal;
  const start = new Date(root.dataset.start);
  const end = new Date(root.dataset.end);
  const shown = (status, s, e) => `${status}|${new Date(s).getTime()}|${new Date(e).getTime()}`;
  const onPage = shown(root.dataset.status, start, end);
  let timer = null;
  let seen = false;
  async function check() {
    timer = null;
    if (document.activeElement && document.activeElement.id === "change-end") { timer = setTimeout(check, 1000); return; }
    try {
      const r = await api(`/api/v1/reservations/${root.dataset.reservation}/`);
      if (shown(r.status, r.start, r.end) !== onPage) location.reload();
    } catch (e) { /* away for a moment, or no longer the user's to see: the next change or a reload tells */ }
  }
  liveSocket("/ws/bookings/", (msg) => {
    if (msg.type === "bookings.watching") {
      root.dataset.following = "1"; // changes reach this page from now on (tests wait on it)
      if (!seen) { seen = true; return; } // on a reconnect, check: a change may have come while away
    } else if (msg.type === "bookings.changed") {
      if (msg.kind === "job" || new Date(msg.start) > end || new Date(msg.end) < start) return;
    } else {
      return;
    }
    if (!timer) timer = setTimeout(check, 300);
  });
}

document.addEventListener("DOMContentLoaded", follow);

// Its devices' use over its window (apps.telemetry.selectors.devices_series), put in the page by the server.
function useChart() {
  const el = document.getElementById("reservation-series");
  const data = el ? JSON.parse(el.textContent) : null;
  if (!data || !data.series.length) return;
  const hasMemory = data.series.some((p) => p.mem != null); // a share's memory is not read per share
  const label = (iso) => {
    const d = new Date(iso);
    return data.hourly ? d.toLocaleString([], { month: "short", day: "numeric", hour: "2-digit" }) : d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
  };
  chart(document.getElementById("chart-reservation"), {
    type: "line",
    data: {
      labels: data.series.map((p) => label(p.t)),
      datasets: [
        ...(hasMemory ? [{ label: "memory (MiB)", data: data.series.map((p) => p.mem), borderColor: color(3), backgroundColor: color(3, 0.15), fill: true, yAxisID: "y", pointRadius: 0 }] : []),
        { label: "utilization (%)", data: data.series.map((p) => p.util), borderColor: color(0), yAxisID: "y1", pointRadius: 0 },
      ],
    },
    options: {
      scales: {
        y: { display: hasMemory, min: 0, suggestedMax: data.total || undefined, title: { display: true, text: "MiB" } },
        y1: { min: 0, max: 100, position: "right", grid: { drawOnChartArea: !hasMemory }, title: { display: true, text: "%" } },
      },
    },
  });
}

document.addEventListener("DOMContentLoaded", useChart);
