// Jobs list: filters apply as soon as they change; the list refreshes while jobs are active.
document.addEventListener("DOMContentLoaded", () => {
  const form = document.getElementById("job-filters");
  if (!form) return;
  form.querySelectorAll("select, input[type=checkbox]").forEach((el) => el.addEventListener("change", () => form.submit()));
  const active = document.querySelectorAll(".state-queued, .state-starting, .state-running").length;
  if (active) setTimeout(() => { if (!document.hidden) location.reload(); }, 10000);
});
