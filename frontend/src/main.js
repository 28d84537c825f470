// Shared behaviour for every page. Page-specific code lives in src/pages/<page>.js.
import { api, ApiError, csrfToken } from "./lib/api.js";
import { liveSocket } from "./lib/ws.js";
import { money, pct, mib, amount, duration } from "./lib/format.js";
import { idleBanner } from "./lib/idle_banner.js";

window.Portal = { api, ApiError, csrfToken, liveSocket, money, pct, mib, amount, duration };

// Behaviour the templates ask for by attribute: the Content-Security-Policy allows no inline handlers.
document.addEventListener("submit", (event) => {
  const form = event.target;
  if (!(form instanceof HTMLFormElement)) return;
  if (form.hasAttribute("data-no-submit") || (form.dataset.confirm && !window.confirm(form.dataset.confirm))) {
    event.preventDefault();
  }
});
document.addEventListener("click", (event) => {
  if (event.target instanceof Element && event.target.closest("[data-print]")) window.print();
});

document.addEventListener("DOMContentLoaded", () => {
  idleBanner(liveSocket);
  // Meters: the width comes from data-width (a percentage); a style attribute would need inline styles allowed.
  for (const bar of document.querySelectorAll("[data-width]")) bar.style.width = `${Number(bar.dataset.width) || 0}%`;
  // Copy buttons for values shown once (new tokens).
  const token = document.getElementById("new-token");
  if (token && navigator.clipboard) {
    const btn = document.createElement("button");
    btn.textContent = "Copy";
    btn.className = "small";
    btn.addEventListener("click", () => navigator.clipboard.writeText(token.textContent.trim()));
    token.after(btn);
  }
});
