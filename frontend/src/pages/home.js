// Home page: a small bar chart of the user's teams' daily cost this month (the server's figures, json_script
// "home-spend-data"), stacked by team.
import { chart, color, num } from "../lib/charts.js";

const data = JSON.parse(document.getElementById("home-spend-data")?.textContent || "null");
const canvas = document.getElementById("home-spend-chart");
if (data && canvas && data.series.length) {
  const money = (v) => window.Portal.money(v);
  chart(canvas, {
    type: "bar",
    data: {
      labels: data.days.map((d) => d.slice(8)),
      datasets: data.series.map((s, i) => ({ label: s.team, data: s.values.map(num), backgroundColor: color(i) })),
    },
    options: {
      plugins: { legend: { display: data.series.length > 1 }, tooltip: { callbacks: { label: (c) => `${c.dataset.label}: ${money(c.raw)}` } } },
      scales: { x: { stacked: true, title: { display: true, text: "day" } }, y: { stacked: true, beginAtZero: true, ticks: { callback: (v) => money(v) } } },
    },
  });
}
