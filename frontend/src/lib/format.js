export function money(value, currency = document.body.dataset.currency || "EUR") {
  const n = typeof value === "string" ? Number(value) : value;
  return new Intl.NumberFormat(undefined, { style: "currency", currency }).format(n);
}
export function pct(v) { return v == null ? "—" : `${Math.round(v)}%`; }
export function mib(v) { return v == null ? "—" : v >= 1024 ? `${(v / 1024).toFixed(1)} GiB` : `${v} MiB`; }
// The server's `money`/`quantity` template filters in the browser: two decimals, grouped by thousands, so a live
// update reads like the figure the page was rendered with.
const TWO = new Intl.NumberFormat("en-US", { minimumFractionDigits: 2, maximumFractionDigits: 2 });
export function amount(v) {
  if (v == null || v === "") return "—";
  const n = Number(v);
  return Number.isFinite(n) ? TWO.format(n) : "—";
}
