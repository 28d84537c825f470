export function money(value, currency = document.body.dataset.currency || "EUR") {
  const n = typeof value === "string" ? Number(value) : value;
  return new Intl.NumberFormat(undefined, { style: "currency", currency }).format(n);
}
export function pct(v) { return v == null ? "—" : `${Math.round(v)}%`; }
export function mib(v) { return v == null ? "—" : v >= 1024 ? `${(v / 1024).toFixed(1)} GiB` : `${v} MiB`; }
// The server's `money`/`quantity` template filters in the browser: two decimals, grouped by thousands, so a live
// update reads like the figure the page was rendered with.
const TWO = new Intl.NumberFormat("en-US", { minimumFractionDigits: 2, maximumFractionDigits: 2 });
// The server's `duration` filter: 45 s, 3 min 05 s, 4 h 00 min.
export function duration(seconds) {
  if (seconds == null || !Number.isFinite(Number(seconds)) || seconds < 0) return "—";
  const total = Math.round(Number(seconds));
  const h = Math.floor(total / 3600), m = Math.floor((total % 3600) / 60), s = total % 60;
  const two = (n) => String(n).padStart(2, "0");
  if (h) return `${h.toLocaleString("en-US")} h ${two(m)} min`;
  if (m) return `${m} min ${two(s)} s`;
  return `${s} s`;
}
export function amount(v) {
  if (v == null || v === "") return "—";
  const n = Number(v);
  return Number.isFinite(n) ? TWO.format(n) : "—";
}
