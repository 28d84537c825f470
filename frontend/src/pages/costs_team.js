// A team's cost page: burn-down chart (cumulative cost against the budget, projected to month end) and live
// month-to-date figures from /ws/teams/{slug}/.
import "../css/costs.css";
import { chart, color, num } from "../lib/charts.js";

const d = JSON.parse(document.getElementById("burn-data").textContent);
const money = (v) => window.Portal.money(v, d.currency);
const labels = d.days.map((s) => s.slice(8));
const flat = (v) => labels.map(() => num(v));

const datasets = [
  { label: "cumulative cost", data: d.cumulative.map(num), borderColor: color(0), backgroundColor: color(0, 0.15), fill: true, pointRadius: 0, tension: 0.1 },
  { label: "projection", data: d.projection.map(num), borderColor: color(0), borderDash: [6, 4], pointRadius: 0 },
];
if (d.budget_soft) datasets.push({ label: "budget", data: flat(d.budget_soft), borderColor: color(2), pointRadius: 0 });
if (d.budget_hard) datasets.push({ label: "hard limit", data: flat(d.budget_hard), borderColor: color(4), pointRadius: 0 });

const burn = chart(document.getElementById("chart-burn"), {
  type: "line",
  data: { labels, datasets },
  options: { scales: { y: { beginAtZero: true, ticks: { callback: (v) => money(v) } }, x: { title: { display: true, text: "day of month" } } }, interaction: { mode: "index", intersect: false } },
});

const set = (id, v) => { const el = document.getElementById(id); if (el && v != null) el.textContent = v; };
const state = document.getElementById("live-state");
const slug = document.getElementById("team-live").dataset.team;
const today = new Date().toISOString().slice(0, 10);

window.Portal.liveSocket(`/ws/teams/${slug}/`, (msg) => {
  if (msg.type === "team.usage") {
    const { amount } = window.Portal;
    set("live-cost", amount(msg.cost));
    set("live-hours", amount(msg.gpu_hours));
    set("live-unbilled", amount(msg.accrued_unbilled_cost));
    set("live-running", msg.running_gpu_share ?? msg.running_gpus);
    set("live-rate", amount(msg.running_hourly_cost));
    set("live-projected", amount(msg.projected_month_cost));
    const i = d.days.indexOf(today);
    if (burn && i >= 0 && msg.month === d.month) {
      burn.data.datasets[0].data[i] = num(msg.cost);
      burn.update("none");
    }
  } else if (msg.type === "team.notification") {
    const list = document.querySelector(".costs-notes") || document.getElementById("team-live").insertAdjacentElement("beforebegin", Object.assign(document.createElement("ul"), { className: "costs-notes" }));
    const li = document.createElement("li");
    li.className = `note-${msg.level}`;
    li.textContent = `${msg.title} — ${msg.body}`;
    list.prepend(li);
  }
}, { onState: (s) => { state.textContent = s === "open" ? "live" : s === "refused" ? "not live: reload the page" : "reconnecting…"; state.classList.toggle("live", s === "open"); } });
