// Jobs list: filters apply as soon as they change. The rows follow the jobs as they change state: the list socket
// (/ws/jobs/) says that a job of the user's teams changed, and the page fetches itself again and swaps in the new
// rows and pager (lib/refresh.js).
import { followedParts } from "../lib/refresh.js";

document.addEventListener("DOMContentLoaded", () => {
  const form = document.getElementById("job-filters");
  const table = document.getElementById("jobs-table");
  if (!form || !table) return;
  form.querySelectorAll("select, input[type=checkbox]").forEach((el) => el.addEventListener("change", () => form.submit()));
  // The pager sits in a wrapper that is always there, so a list that grows a second page gets one.
  const refresh = followedParts(["#jobs-table tbody", "#jobs-pager"], {
    onSwapped: () => { table.dataset.refreshed = String(Number(table.dataset.refreshed || 0) + 1); }, // tests wait on it
  });
  let seen = false;
  window.Portal.liveSocket("/ws/jobs/", (msg) => {
    if (msg.type === "jobs.watching") {
      table.dataset.live = "1"; // changes reach this page from now on (tests wait on it)
      if (!seen) { seen = true; return; } // on a reconnect: changes may have been missed while away
    } else if (msg.type !== "jobs.changed") {
      return;
    }
    refresh();
  });
});
