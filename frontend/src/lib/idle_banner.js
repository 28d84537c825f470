// The idle banner on every page: listens on the user's teams' sockets for idle warnings and reclaims of the
// user's own reservations and jobs, and for bookings a GPU layout change moved or ended, and shows them at the top
// of the page as they come.
export function idleBanner(liveSocket) {
  const banner = document.getElementById("idle-banner");
  if (!banner) return;
  const me = Number(banner.dataset.user);
  const teams = (banner.dataset.teams || "").split(",").filter(Boolean);
  function show(msg) {
    // idle.*: this page's own warnings and reclaims; layout.*: a GPU's MIG layout changed under a booking.
    if (msg.type !== "team.notification" || !msg.event || !/^(idle|layout)\./.test(msg.event)) return;
    if (msg.user_id !== me) return;
    const key = `${msg.kind}-${msg.id}`;
    let p = banner.querySelector(`[data-key="${key}"]`);
    if (!p) {
      p = document.createElement("p");
      p.className = "idle-warning";
      p.dataset.key = key;
      banner.appendChild(p);
    }
    if (msg.event.startsWith("layout.")) {
      const what = msg.event === "layout.moved" ? "was moved" : "was ended";
      p.textContent = `Your ${msg.kind} #${msg.id} ${what}: ${msg.message}`;
    } else if (msg.event === "idle.warning") {
      const at = new Date(msg.reclaim_at).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
      p.textContent = `⚠ Your ${msg.kind} #${msg.id} has been idle for ${msg.idle_minutes} min${msg.loaded ? " (memory held)" : ""}: it will be reclaimed at ${at} unless its GPUs are used.`;
    } else {
      p.textContent = `Your ${msg.kind} #${msg.id} was reclaimed: ${msg.reason === "unused" ? "its GPUs were not used" : "it was idle"}.`;
    }
    banner.hidden = false;
    // A page listing reservations (Book) reloads them: the portal moved or ended one of them.
    if (msg.kind === "reservation" && msg.event !== "idle.warning") {
      window.dispatchEvent(new CustomEvent("portal:reservation-changed", { detail: { id: msg.id, event: msg.event } }));
    }
  }
  for (const slug of teams) liveSocket(`/ws/teams/${slug}/`, show);
}
