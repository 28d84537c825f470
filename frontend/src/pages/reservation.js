// Reservation page: while the reservation holds its GPUs, each device's utilization and memory now, from
// /api/v1/gpus/ every 2 s (a part shows its GPU's utilization: NVML has none per part; a MIG instance its own memory).
function init() {
  const root = document.getElementById("reservation-page");
  if (!root || root.dataset.live !== "true") return;
  const { api, pct, mib } = window.Portal;
  const rows = [...document.querySelectorAll("#res-devices tr[data-gpu]")];
  const wanted = new Set(rows.map((tr) => tr.dataset.gpu));
  async function refresh() {
    try {
      const body = await api("/api/v1/gpus/?limit=1000");
      for (const g of body.results || body) {
        if (!wanted.has(g.uuid)) continue;
        for (const tr of rows.filter((r) => r.dataset.gpu === g.uuid)) {
          tr.querySelector(".util").textContent = pct(g.utilization);
          let mem = g.memory_used_mib;
          if (tr.dataset.kind === "mig") {
            const instance = (g.mig_devices || []).find((d) => d.uuid === tr.dataset.uuid);
            mem = instance ? instance.memory_used_mib : null;
          } else if (tr.dataset.kind === "share") {
            mem = null; // the GPU's memory is every share's together: not this booking's own
          }
          tr.querySelector(".mem").textContent = mem == null ? "—" : mib(mem);
        }
      }
    } catch (e) { /* the fleet API may be away for a moment; try again next tick */ }
  }
  refresh();
  setInterval(refresh, 2000);
}

document.addEventListener("DOMContentLoaded", init);
