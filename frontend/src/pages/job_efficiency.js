// Job page, efficiency panel: GPU memory (MiB) and utilization (%) per minute over the job's life, with the peak,
// from the data the server put in the page (apps/efficiency/templates/efficiency/_job_panel.html).
import { chart, color } from "../lib/charts.js";

function readJson(id) {
  const el = document.getElementById(id);
  return el ? JSON.parse(el.textContent) : null;
}

function timeLabel(series) {
  // A job of more than a day (or one read from the hourly rollups once its minutes were pruned) needs the date too.
  const span = series.length ? new Date(series[series.length - 1].t) - new Date(series[0].t) : 0;
  const long = span > 20 * 3600 * 1000;
  return (iso) => {
    const d = new Date(iso);
    return long
      ? d.toLocaleString([], { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit" })
      : d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
  };
}

function usageChart() {
  const data = readJson("job-efficiency-data");
  if (!data || !data.series.length) return;
  const label = timeLabel(data.series);
  const labels = data.series.map((p) => label(p.t));
  const datasets = [
    { label: "memory (MiB)", data: data.series.map((p) => p.mem), borderColor: color(3), backgroundColor: color(3, 0.15), fill: true, yAxisID: "y", pointRadius: 0 },
    { label: "utilization (%)", data: data.series.map((p) => p.util), borderColor: color(0), yAxisID: "y1", pointRadius: 0 },
  ];
  if (data.peak != null) {
    datasets.push({ label: `peak ${data.peak} MiB`, data: data.series.map(() => data.peak), borderColor: color(4), borderDash: [5, 4], yAxisID: "y", pointRadius: 0 });
  }
  chart(document.getElementById("chart-job-gpu"), {
    type: "line",
    data: { labels, datasets },
    options: {
      scales: {
        y: { min: 0, suggestedMax: data.total || undefined, title: { display: true, text: "MiB" } },
        y1: { min: 0, max: 100, position: "right", grid: { drawOnChartArea: false }, title: { display: true, text: "%" } },
      },
    },
  });
}

function advisorChart() {
  const data = readJson("job-advisor-data");
  if (!data || !data.runs) return;
  const sizes = [...new Set(data.runs.map((r) => r.batch_size))].sort((a, b) => a - b);
  const precisions = [...new Set(data.runs.map((r) => r.precision))];
  const datasets = [];
  precisions.forEach((p, i) => {
    const by = Object.fromEntries(data.runs.filter((r) => r.precision === p && r.ok).map((r) => [r.batch_size, r]));
    datasets.push({ label: `${p} samples/s`, data: sizes.map((s) => (by[s] ? by[s].samples_per_s : null)), borderColor: color(i), yAxisID: "y", spanGaps: false });
    datasets.push({ label: `${p} peak MiB`, data: sizes.map((s) => (by[s] ? by[s].peak_mib : null)), borderColor: color(i, 0.5), borderDash: [5, 4], yAxisID: "y1", spanGaps: false });
  });
  chart(document.getElementById("chart-job-advisor"), {
    type: "line",
    data: { labels: sizes.map(String), datasets },
    options: {
      scales: {
        x: { title: { display: true, text: "batch size" } },
        y: { min: 0, title: { display: true, text: "samples/s" } },
        y1: { min: 0, position: "right", grid: { drawOnChartArea: false }, title: { display: true, text: "peak MiB" } },
      },
    },
  });
}

usageChart();
advisorChart();
