// The offer shown under a booking refused for lack of GPUs: wait for that model, count and window (POST
// /api/v1/waitlist/), either to be told when GPUs free up or to have them booked at once.
export function waitlistOffer(api, h, request) {
  const auto = h("input", { type: "checkbox", id: "waitlist-auto" });
  const status = h("span", { class: "muted", id: "waitlist-status" }, "");
  const button = h("button", { type: "button", class: "small", id: "waitlist-join" }, "Wait for these GPUs");
  button.addEventListener("click", async () => {
    button.disabled = true;
    try {
      const r = await api("/api/v1/waitlist/", {
        method: "POST",
        body: { team: request.team, gpu_model: request.gpu_model, gpu_count: request.gpu_count, start: request.start, end: request.end, note: request.note || "", auto_book: auto.checked },
      });
      status.textContent = ` On the waitlist (#${r.id}): ${auto.checked ? "booked as soon as GPUs free up" : "you will be told when GPUs free up"}.`;
    } catch (err) {
      status.textContent = ` ${err.message}`;
      button.disabled = false;
    }
  });
  return h("p", { class: "waitlist-offer" }, button, " ", h("label", {}, auto, " book at once when free"), status);
}
