// Job page: live logs and state over /ws/jobs/{id}/ (REST fills the gaps), the GPUs' live utilization from
// /api/v1/gpus/, and the cost so far ticking from the job's start time and hourly price.
const TERMINAL = new Set(["succeeded", "failed", "cancelled", "lost"]);

function init() {
  const root = document.getElementById("job-page");
  if (!root) return;
  const { api, liveSocket, money } = window.Portal;
  const jobId = root.dataset.job;
  const logs = document.getElementById("job-logs");
  const status = document.getElementById("log-status");
  const stateBadge = document.getElementById("job-state");
  let lastSeq = 0;
  let state = root.dataset.state;
  let started = root.dataset.started ? new Date(root.dataset.started) : null;
  let ended = root.dataset.ended ? new Date(root.dataset.ended) : null;
  const hourly = Number(root.dataset.hourlyPrice || "0");
  let fetching = null;
  let socketState = "connecting";

  // A finished job's socket stays open for the last lines an agent may still send; "live" would say it runs.
  function drawStatus() {
    if (socketState !== "open") status.textContent = { connecting: "connecting…", refused: "not live: reload the page" }[socketState] || "reconnecting…";
    else status.textContent = TERMINAL.has(state) ? "ended" : "live";
    status.title = TERMINAL.has(state) ? "The job has ended; lines it wrote last still appear here" : "";
  }

  function lineSpan(l) {
    const span = document.createElement("span");
    span.className = l.stream;
    span.dataset.seq = l.seq;
    span.textContent = l.line + "\n";
    return span;
  }

  // A line older than the newest shown arrived late (its batch was delayed or sent again after a broker
  // outage): it goes into its place, once.
  function insertLate(l) {
    if (logs.querySelector(`span[data-seq="${l.seq}"]`)) return;
    const after = Array.from(logs.children).find((el) => Number(el.dataset.seq) > l.seq);
    logs.insertBefore(lineSpan(l), after || null);
  }

  function append(lines) {
    const atBottom = logs.scrollTop + logs.clientHeight >= logs.scrollHeight - 20;
    const frag = document.createDocumentFragment();
    for (const l of lines) {
      if (l.seq <= lastSeq) {
        insertLate(l);
        continue;
      }
      lastSeq = l.seq;
      frag.appendChild(lineSpan(l));
    }
    logs.appendChild(frag);
    if (atBottom) logs.scrollTop = logs.scrollHeight;
  }

  async function catchUp() {
    if (fetching) return fetching;
    fetching = (async () => {
      try {
        for (let i = 0; i < 50; i++) {
          const body = await api(`/api/v1/jobs/${jobId}/logs/?after=${lastSeq}&limit=2000`);
          append(body.lines);
          // Lines after a missing one are held back while it may still arrive: ask again shortly.
          if (body.waiting) setTimeout(catchUp, 2000);
          if (!body.more) break;
        }
      } catch (e) {
        status.textContent = `could not load logs: ${e.message}`;
      } finally {
        fetching = null;
      }
    })();
    return fetching;
  }

  function setState(msg) {
    state = msg.state;
    root.dataset.state = state;
    stateBadge.textContent = state;
    stateBadge.className = `badge state-${state}`;
    drawStatus();
    const reason = document.getElementById("job-reason");
    if (reason) reason.textContent = (msg.reason || "—") + (msg.exit_code != null ? ` (exit ${msg.exit_code})` : "");
    const message = document.getElementById("job-message");
    if (message) message.textContent = msg.message || msg.pending_message || "—";
    const node = document.getElementById("job-node");
    if (node && msg.node) node.textContent = msg.node;
    if (msg.started_at) started = new Date(msg.started_at);
    if (msg.ended_at) ended = new Date(msg.ended_at);
    if (TERMINAL.has(state)) {
      const form = document.getElementById("cancel-form");
      if (form) form.remove();
      const costLabel = document.getElementById("job-cost-label");
      if (costLabel) costLabel.textContent = "Cost";
    }
    const timeline = document.getElementById("job-timeline");
    const last = timeline && timeline.lastElementChild;
    if (timeline && (!last || !last.textContent.includes(state))) {
      const li = document.createElement("li");
      li.innerHTML = `<time></time> — <strong></strong>`;
      li.querySelector("time").textContent = new Date(msg.ts).toLocaleString();
      li.querySelector("strong").textContent = state + (msg.reason ? ` (${msg.reason})` : "");
      timeline.appendChild(li);
    }
  }

  liveSocket(`/ws/jobs/${jobId}/`, (msg) => {
    if (msg.type === "state") {
      if (msg.state !== state || msg.ended_at) setState(msg);
      if (msg.log_seq != null && msg.log_seq > lastSeq) catchUp();
    } else if (msg.type === "logs") {
      const first = msg.lines.length ? msg.lines[0].seq : lastSeq + 1;
      if (first > lastSeq + 1) catchUp().then(() => append(msg.lines));
      else append(msg.lines);
    }
  }, {
    onState: (s) => {
      socketState = s === "open" || s === "refused" ? s : "closed";
      drawStatus();
      if (s === "open") catchUp();
    },
  });

  // Cost and runtime so far, every second.
  const cost = document.getElementById("job-cost");
  const runtime = document.getElementById("job-runtime");
  setInterval(() => {
    if (!started) return;
    const end = ended || new Date();
    const seconds = Math.max(0, (end - started) / 1000);
    if (runtime) runtime.textContent = window.Portal.duration(seconds);
    if (cost) cost.textContent = money((seconds / 3600) * hourly);
  }, 1000);

  // The GPUs' live utilization.
  const uuids = (root.dataset.gpus || "").split(",").filter(Boolean);
  async function refreshGpus() {
    if (!uuids.length || TERMINAL.has(state)) return;
    try {
      // Only its GPUs: a fleet may have more GPUs than one page of the list holds.
      const q = new URLSearchParams({ uuid: uuids.join(","), limit: String(uuids.length) });
      const body = await api(`/api/v1/gpus/?${q}`);
      const rows = body.results || body;
      for (const g of rows) {
        if (!uuids.includes(g.uuid)) continue;
        for (const tr of document.querySelectorAll(`#job-gpus tr[data-uuid="${CSS.escape(g.uuid)}"]`)) {
          // A part shows its GPU's utilization (NVML has none per part) and, for a MIG instance, its own memory;
          // a share's memory is its job's own, in the memory panel below.
          tr.querySelector(".util").textContent = window.Portal.pct(g.utilization);
          let mem = g.memory_used_mib;
          if (tr.dataset.part) {
            const instance = (g.mig_devices || []).find((d) => d.uuid === tr.dataset.part);
            mem = instance ? instance.memory_used_mib : null;
          }
          tr.querySelector(".mem").textContent = window.Portal.mib(mem);
        }
      }
    } catch (e) { /* the fleet API may be away for a moment; try again next tick */ }
  }
  refreshGpus();
  setInterval(refreshGpus, 2000);
}

document.addEventListener("DOMContentLoaded", init);
