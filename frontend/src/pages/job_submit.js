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
