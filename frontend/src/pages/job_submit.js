import { linkModelAndPart } from "../lib/parts.js";

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

// The GPU model and the part stay consistent (lib/parts.js); "any model" takes any part. The server refuses a
// mismatch all the same (400).
const modelsEl = document.getElementById("job-part-models");
linkModelAndPart(
  document.getElementById("id_gpu_model"),
  document.getElementById("id_part"),
  modelsEl ? JSON.parse(modelsEl.textContent) : {},
);
