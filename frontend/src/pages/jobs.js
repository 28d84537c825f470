// Jobs list: filters apply as soon as they change. The rows follow the jobs as they change state: the list socket
// (/ws/jobs/) says that a job of the user's teams changed, and the page fetches itself again and swaps in the new
// rows (the server filters and scopes them); changes that come together are one fetch, at most one every 2 s.
document.addEventListener("DOMContentLoaded", () => {
  const form = document.getElementById("job-filters");
  const table = document.getElementById("jobs-table");
  if (!form || !table) return;
  form.querySelectorAll("select, input[type=checkbox]").forEach((el) => el.addEventListener("change", () => form.submit()));

  let timer = null;
  let seen = false;
  let last = 0;
  async function refresh() {
    timer = null;
    if (document.hidden) { document.addEventListener("visibilitychange", refreshSoon, { once: true }); return; }
    last = Date.now();
    try {
      const resp = await fetch(location.href, { headers: { Accept: "text/html" }, credentials: "same-origin" });
      if (!resp.ok) return;
      const doc = new DOMParser().parseFromString(await resp.text(), "text/html");
      const rows = doc.querySelector("#jobs-table tbody");
      if (rows) table.tBodies[0].replaceWith(rows);
      const pager = doc.querySelector(".pager");
      const here = document.querySelector(".pager");
      if (pager && here) here.replaceWith(pager);
      else if (pager) table.after(pager);
      else if (here) here.remove();
      table.dataset.refreshed = String(Number(table.dataset.refreshed || 0) + 1); // tests wait on it
    } catch (e) { /* the portal away for a moment: the next change or reconnect fetches again */ }
  }
  function refreshSoon() {
    if (!timer) timer = setTimeout(refresh, Math.max(300, last + 2000 - Date.now()));
  }
  window.Portal.liveSocket("/ws/jobs/", (msg) => {
    if (msg.type === "jobs.watching") {
      table.dataset.live = "1"; // changes reach this page from now on (tests wait on it)
      if (!seen) { seen = true; return; } // on a reconnect: changes may have been missed while away
    } else if (msg.type !== "jobs.changed") {
      return;
    }
    refreshSoon();
  });
});
