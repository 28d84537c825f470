// Job form: the reservation select lists the reservations of every team the user is in, grouped by team; only the
// chosen team's can be picked (a job runs in a reservation of the team it is submitted for).
const team = document.getElementById("id_team");
const reservation = document.getElementById("id_reservation");

function sync() {
  if (!team || !reservation) return;
  for (const group of reservation.querySelectorAll("optgroup")) group.disabled = group.label !== team.value;
  const chosen = reservation.selectedOptions[0];
  if (chosen && chosen.parentElement.tagName === "OPTGROUP" && chosen.parentElement.disabled) reservation.value = "";
}
team?.addEventListener("change", sync);
sync();

// The GPU model and the part stay consistent: a part only some models give (a MIG profile, a share of a GPU split
// so) picks one of them when another model is chosen, and a model that does not give the chosen part sets the
// part back to whole GPUs. "any model" takes any part. The server refuses a mismatch all the same (400).
const model = document.getElementById("id_gpu_model");
const part = document.getElementById("id_part");
const modelsEl = document.getElementById("job-part-models");
const partModels = modelsEl ? JSON.parse(modelsEl.textContent) : {};

function gives(partValue, modelName) {
  const models = partModels[partValue];
  return !partValue || !modelName || !models || models.includes(modelName);
}

function markParts() {  // a part's models as its tooltip
  if (!model || !part) return;
  for (const option of part.options) {
    const models = partModels[option.value];
    option.title = models ? `on ${models.join(", ")}` : "";
  }
}

part?.addEventListener("change", () => {
  if (!model || gives(part.value, model.value)) return;
  const offered = [...model.options].map((o) => o.value);
  const other = (partModels[part.value] || []).find((name) => offered.includes(name));
  model.value = other || "";
  markParts();
});
model?.addEventListener("change", () => {
  if (part && !gives(part.value, model.value)) part.value = "";
  markParts();
});
markParts();
