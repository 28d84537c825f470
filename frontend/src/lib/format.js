export function money(value, currency = document.body.dataset.currency || "EUR") {
  const n = typeof value === "string" ? Number(value) : value;
  return new Intl.NumberFormat(undefined, { style: "currency", currency }).format(n);
}
export function pct(v) { return v == null ? "—" : `${Math.round(v)}%`; }
export function mib(v) { return v == null ? "—" : v >= 1024 ? `${(v / 1024).toFixed(1)} GiB` : `${v} MiB`; }
