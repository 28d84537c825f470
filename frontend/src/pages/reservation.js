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
