// The offer shown under a booking refused for lack of GPUs: wait for that model, count and window (POST
// /api/v1/waitlist/), or for that slice (MIG instances of a profile, a share of one GPU), either to be told when
// it frees up or to have it booked at once.
export function waitlistOffer(api, h, request) {
  const slice = request.mig_profile ? { mig_profile: request.mig_profile }
    : request.gpu_share != null ? { gpu_share: request.gpu_share } : {};
  const what = request.mig_profile ? `${request.mig_profile} instances`
    : request.gpu_share != null ? "this share" : "these GPUs";
  const auto = h("input", { type: "checkbox", id: "waitlist-auto" });
  const status = h("span", { class: "muted", id: "waitlist-status" }, "");
  const button = h("button", { type: "button", class: "small", id: "waitlist-join" }, `Wait for ${what}`);
  button.addEventListener("click", async () => {
    button.disabled = true;
    try {
      const r = await api("/api/v1/waitlist/", {
        method: "POST",
        body: { team: request.team, gpu_model: request.gpu_model, gpu_count: request.gpu_count || 1, ...slice, start: request.start, end: request.end, note: request.note || "", auto_book: auto.checked },
      });
      status.textContent = ` On the waitlist (#${r.id}): ${auto.checked ? "booked as soon as it frees up" : "you will be told when it frees up"}.`;
    } catch (err) {
      status.textContent = ` ${err.message}`;
      button.disabled = false;
    }
  });
  return h("p", { class: "waitlist-offer" }, button, " ", h("label", {}, auto, " book at once when free"), status);
}
