// Chart.js, bundled (no CDN), with the pieces the Costs pages use and a shared palette.
import { Chart, registerables } from "chart.js";

Chart.register(...registerables);

export const PALETTE = ["#2f6fed", "#1f9d55", "#d68a00", "#8e44ad", "#d64545", "#16a2b8", "#6b7385", "#c2185b", "#5d8c00", "#ff7f50"];

export function color(i, alpha = 1) {
  const hex = PALETTE[i % PALETTE.length];
  if (alpha === 1) return hex;
  const n = parseInt(hex.slice(1), 16);
  return `rgba(${(n >> 16) & 255}, ${(n >> 8) & 255}, ${n & 255}, ${alpha})`;
}

export function chart(canvas, config) {
  if (!canvas) return null;
  const c = new Chart(canvas, { ...config, options: { responsive: true, maintainAspectRatio: false, animation: false, ...(config.options || {}) } });
  canvas.dataset.rendered = "1";
  return c;
}

export const num = (v) => (v == null ? null : Number(v));
export { Chart };
