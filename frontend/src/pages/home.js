// Home page: a small bar chart of the user's teams' daily cost this month (the server's figures, json_script
// "home-spend-data"), stacked by team; the user's jobs and next reservations and the fleet card, live.
import { chart, color, num } from "../lib/charts.js";
import { usable } from "../lib/fleet_text.js";
import { followedParts } from "../lib/refresh.js";

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

// "My jobs" and "My next reservations" follow changes: a job of the user's teams changing state (/ws/jobs/), a
// booking of theirs made, moved or ended (/ws/bookings/); the page fetches itself again and swaps in both lists.
const lists = document.getElementById("home-jobs");
if (lists) {
  const refresh = followedParts(["#home-jobs", "#home-reservations"], {
    onSwapped: () => { document.body.dataset.homeRefreshed = String(Number(document.body.dataset.homeRefreshed || 0) + 1); },
  });
  const listen = (path, watching, relevant) => {
    let seen = false;
    window.Portal.liveSocket(path, (msg) => {
      if (msg.type === watching) {
        document.body.dataset[`live${watching.split(".")[0]}`] = "1"; // tests wait on it
        if (!seen) { seen = true; return; }
      } else if (!relevant(msg)) {
        return;
      }
      refresh();
    });
  };
  listen("/ws/jobs/", "jobs.watching", (msg) => msg.type === "jobs.changed");
  listen("/ws/bookings/", "bookings.watching", (msg) => msg.type === "bookings.changed" && msg.mine && msg.kind !== "job");
}

// The fleet card follows the fleet's live snapshots (/ws/fleet/), counted as the Fleet page counts them: a GPU is
// free when it is usable (healthy, node online, figures fresh) and nothing holds it or any of its parts. The socket
// is open only while the tab is shown: a home page left in a background tab costs no snapshot a second.
const fleetCard = document.getElementById("home-fleet");
if (fleetCard) {
  const freeEl = document.getElementById("home-gpus-free");
  const detailEl = document.getElementById("home-fleet-detail");
  const onFleet = (msg) => {
    if (msg.type !== "fleet" || !Array.isArray(msg.gpus)) return;
    let free = 0;
    let inService = 0;
    const nodeStatus = new Map((msg.nodes || []).map((n) => [n.name, n.status]));
    for (const g of msg.gpus) {
      if (!nodeStatus.has(g.node)) nodeStatus.set(g.node, g.node_status);
      if (g.status === "ok" && g.node_status === "online") inService++;
      if (usable(g) && !g.holder) free++;
    }
    const online = [...nodeStatus.values()].filter((s) => s === "online").length;
    const big = `${free} / ${msg.gpus.length}`;
    const detail = `GPUs free now; ${inService} in service on ${online} of ${nodeStatus.size} nodes online`;
    if (freeEl.textContent !== big) freeEl.textContent = big;
    if (detailEl.textContent !== detail) detailEl.textContent = detail;
    fleetCard.dataset.liveSeq = String(msg.seq ?? ""); // tests wait on it
  };
  let socket = null;
  const follow = () => {
    if (document.hidden) { if (socket) { socket.close(); socket = null; } }
    else if (!socket) socket = window.Portal.liveSocket("/ws/fleet/", onFleet);
  };
  document.addEventListener("visibilitychange", follow);
  follow();
}
