// Reservation page: while the reservation holds its GPUs, each device's utilization and memory now, from
// /api/v1/gpus/ every 2 s. A MIG instance shows its own memory and, where the GPU reads it (GPM, Hopper and later), its
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
      const body = await api("/api/v1/gpus/?limit=1000");
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
