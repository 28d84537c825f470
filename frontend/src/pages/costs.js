// Costs report page: cost by team stacked by GPU model, daily cost, idle cost by team, utilization heatmap.
// The data is the server's (json_script "costs-data"), so the charts show exactly the report's figures.
import "../css/costs.css";
import { chart, color, num } from "../lib/charts.js";

const data = JSON.parse(document.getElementById("costs-data")?.textContent || "null");
const money = (v) => window.Portal.money(v, data?.currency);
const moneyTicks = { callback: (v) => money(v) };

function teamModelChart() {
  const d = data.cost_by_team_model;
  chart(document.getElementById("chart-team-model"), {
    type: "bar",
    data: { labels: d.teams, datasets: d.series.map((s, i) => ({ label: s.gpu_model, data: s.values.map(num), backgroundColor: color(i) })) },
    options: { scales: { x: { stacked: true }, y: { stacked: true, ticks: moneyTicks } }, plugins: { tooltip: { callbacks: { label: (c) => `${c.dataset.label}: ${money(c.raw)}` } } } },
  });
}

function dailyChart() {
  const d = data.daily;
  chart(document.getElementById("chart-daily"), {
    type: "bar",
    data: { labels: d.days.map((s) => s.slice(8)), datasets: d.series.map((s, i) => ({ label: s.team, data: s.values.map(num), backgroundColor: color(i) })) },
    options: { scales: { x: { stacked: true, title: { display: true, text: "day" } }, y: { stacked: true, ticks: moneyTicks } } },
  });
}

function idleChart() {
  const d = data.idle_by_team;
  chart(document.getElementById("chart-idle"), {
    type: "bar",
    data: {
      labels: d.teams,
      datasets: [
        { label: "idle", data: d.idle.map(num), backgroundColor: color(4) },
        { label: "in use", data: d.busy.map(num), backgroundColor: color(1, 0.5) },
      ],
    },
    options: { indexAxis: "y", scales: { x: { stacked: true, ticks: moneyTicks }, y: { stacked: true } } },
  });
}

// Utilization 0..1 → white-ish (idle) to deep green (busy); red tint under 10% to make idle time stand out.
function cellColor(u) {
  if (u == null) return "";
  if (u < 0.1) return `rgba(214, 69, 69, ${0.25 + (0.1 - u) * 4})`;
  return `rgba(31, 157, 85, ${0.15 + 0.85 * u})`;
}

function heatmap() {
  const el = document.getElementById("heatmap");
  const d = data.heatmap;
  if (!el) return;
  if (!d.gpus.length) { el.innerHTML = '<p class="muted">No telemetry for allocated GPUs this month.</p>'; return; }
  const table = document.createElement("table");
  const head = table.createTHead().insertRow();
  head.appendChild(document.createElement("th"));
  d.days.forEach((day) => { const th = document.createElement("th"); th.textContent = String(Number(day.slice(8))); head.appendChild(th); });
  const body = table.createTBody();
  d.gpus.forEach((name, r) => {
    const row = body.insertRow();
    const th = document.createElement("th");
    th.textContent = name;
    row.appendChild(th);
    d.values[r].forEach((u, c) => {
      const td = row.insertCell();
      td.className = "heat-cell";
      if (u != null) { td.style.background = cellColor(u); td.title = `${name} · ${d.days[c]} · ${Math.round(u * 100)}% utilized`; td.dataset.util = u; }
      else td.title = `${name} · ${d.days[c]} · not allocated`;
    });
  });
  el.replaceChildren(table);
  const legend = document.createElement("div");
  legend.className = "heatmap-legend";
  // Swatches coloured through the CSSOM: markup with style attributes would need inline styles allowed.
  for (const [colour, label] of [[cellColor(0), "idle"], [cellColor(0.3), "30%"], [cellColor(1), "100%"], ["#eef0f4", "not allocated"]]) {
    const swatch = document.createElement("span");
    swatch.style.background = colour;
    legend.append(swatch, ` ${label} `);
  }
  el.appendChild(legend);
  el.dataset.rendered = "1";
}

if (data) {
  teamModelChart();
  dailyChart();
  idleChart();
  heatmap();
}
