// How the Fleet page words a GPU: its figures, its status and who holds it (or its MIG instances and shares).
// Pure functions of the records the page keeps, so the table rows and the overview map's tooltips say the same.

// A GPU the scheduler can hand out: healthy, its node online, its figures fresh.
export function usable(g) {
  return g.status === "ok" && g.node_status === "online" && !g.stale;
}

export const pctText = (v) => (v == null ? "—" : `${Math.round(v)}%`);
const gib = (m) => (m == null ? "—" : (m / 1024).toFixed(m >= 10240 ? 0 : 1));
export const memText = (g) => (g.mem_used == null ? "—" : `${gib(g.mem_used)} / ${gib(g.mem_total)} GiB`);
export const tempText = (g) => (g.temp == null ? "—" : `${g.temp} °C`);
export const powerText = (g) => (g.power == null ? "—" : `${Math.round(g.power)} W`);
const timeFmt = new Intl.DateTimeFormat(undefined, { hour: "2-digit", minute: "2-digit" });

// A GPU in MIG mode or split in shares: how many parts are free, then each held part's holder, with the memory a
// MIG instance uses when the agent reported it. Shares are time-sliced unless the node runs MPS, so the page says so.
function partMem(h) {
  if (!h.mem) return "";
  return h.used == null ? ` ${gib(h.mem)} GiB` : ` ${gib(h.used)} / ${gib(h.mem)} GiB`;
}

function partsText(g) {
  const p = g.parts;
  const what = p.kind === "mig" ? "MIG instances" : "shares (shared, no memory isolation)";
  const held = (Array.isArray(g.holder) ? g.holder : []).map((h) => {
    const part = h.part ? `${h.part}${partMem(h)}: ` : "";
    return part + (h.user ? `${h.user} · ${h.team}` : h.team || "in use");
  });
  return [`${p.free}/${p.total} ${what} free`, ...held].join(" · ");
}

// A GPU nothing in the portal holds can still be in use: a process started on the node by hand, or one a finished
// job left behind. Its memory is then gone for the next job placed there, so the page says so, and whose processes
// they are where the viewer may know (a teammate's name; a uid no portal user has, for admins). The fleet publisher
// decides (`outside`: apps/telemetry/keys.py, SnapshotGpu), with the scheduler's threshold and grace after a job.
export function outsideText(g) {
  const o = g.outside;
  if (!o || g.holder || g.parts) return "";
  const by = Array.isArray(o.by) ? o.by : [];
  const names = by.map((e) => e.user || (e.uid != null ? `uid ${e.uid}` : "")).filter(Boolean);
  const others = names.length < by.length ? " and others" : "";
  return `${gib(o.mib)} GiB in use outside the portal${names.length ? ` by ${names.join(", ")}${others}` : ""}`;
}

export function outsideUse(g) {
  return outsideText(g) !== "";
}

export function holderText(g) {
  if (g.parts) return partsText(g);
  const h = g.holder;
  if (!h) {
    if (outsideUse(g)) return `${usable(g) ? "free" : "—"} · ${outsideText(g)}`;
    return usable(g) ? "free" : "—";
  }
  const until = h.until ? ` until ${timeFmt.format(new Date(h.until))}` : "";
  if (h.user) return `${h.user} · ${h.team}${h.kind ? ` (${h.kind})` : ""}${until}`;
  if (h.team) return `${h.team}${h.kind ? ` (${h.kind})` : ""}`;
  return "in use";
}

export function statusOf(g) {
  if (g.node_status !== "online") return g.node_status; // draining or offline: the node is what matters
  if (g.stale && g.status === "ok") return "stale";
  return g.status;
}

export function ago(iso) {
  if (!iso) return "never";
  const s = Math.max(0, Math.round((Date.now() - new Date(iso).getTime()) / 1000));
  return s < 90 ? `${s} s ago` : s < 5400 ? `${Math.round(s / 60)} min ago` : `${Math.round(s / 3600)} h ago`;
}
