// Efficiency page: used / idle / reclaimed GPU-hours per team (stacked bars) and idle cost per user, from the
// figures the server put in the page (apps/efficiency/views.py).
import { chart, color } from "../lib/charts.js";

const el = document.getElementById("efficiency-data");
if (el) {
  const data = JSON.parse(el.textContent);
  const n = (v) => Number(v);
  chart(document.getElementById("chart-efficiency-teams"), {
    type: "bar",
    data: {
      labels: data.teams.map((t) => t.team),
      datasets: [
        { label: "used GPU-hours", data: data.teams.map((t) => n(t.used)), backgroundColor: color(1) },
        { label: "idle GPU-hours", data: data.teams.map((t) => n(t.idle)), backgroundColor: color(4, 0.7) },
        { label: "reclaimed GPU-hours", data: data.teams.map((t) => n(t.reclaimed)), backgroundColor: color(0, 0.6) },
      ],
    },
    options: { scales: { x: { stacked: true }, y: { stacked: true, title: { display: true, text: "GPU-hours" } } } },
  });
  chart(document.getElementById("chart-efficiency-users"), {
    type: "bar",
    data: {
      labels: data.users.map((u) => u.label),
      datasets: [{ label: `idle cost (${document.body.dataset.currency || ""})`, data: data.users.map((u) => n(u.idle_cost)), backgroundColor: color(4, 0.7) }],
    },
    options: { indexAxis: "y" },
  });
}
