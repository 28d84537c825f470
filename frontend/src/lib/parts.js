// The model and the part of a GPU on the Book page and the job form stay consistent. `parts` is the server's
// `bookable_parts` ({value, label, models}): which models give each MIG profile and each share.

export function partModels(parts) {
  return Object.fromEntries((parts || []).map((p) => [p.value, p.models || []]));
}

// Does `model` give `part`? Whole GPUs ("") and "any model" ("") always do.
export function gives(models, part, model) {
  return !part || !model || !models[part] || models[part].includes(model);
}

// Wire a model select and a part select: a part the chosen model does not give picks a model among the select's
// options that gives it ("any model" when there is no such option and the select offers it); a model that does
// not give the chosen part sets the part back to whole GPUs; each part's tooltip names its models.
// Returns the function that re-applies the rule after the model select's options or value change from code.
export function linkModelAndPart(modelSelect, partSelect, models) {
  if (!modelSelect || !partSelect) return () => {};
  for (const option of partSelect.options) {
    if (models[option.value]) option.title = `on ${models[option.value].join(", ")}`;
  }
  const syncPart = () => {
    if (!gives(models, partSelect.value, modelSelect.value)) partSelect.value = "";
  };
  partSelect.addEventListener("change", () => {
    if (gives(models, partSelect.value, modelSelect.value)) return;
    const offered = [...modelSelect.options].map((o) => o.value);
    const other = models[partSelect.value].find((name) => offered.includes(name));
    if (other) modelSelect.value = other;
    else if (offered.includes("")) modelSelect.value = "";
  });
  modelSelect.addEventListener("change", syncPart);
  return syncPart;
}

// A reservation's GPUs in words: "node/index" for a whole GPU, "node/index · 1g.10gb" for a MIG instance,
// "node/index · 0.5 of it" for shares of one GPU (the API gives a booking's shares of a GPU as one entry).
export function gpusText(gpus) {
  return (gpus || [])
    .map((g) => {
      const where = `${g.node}/${g.index}`;
      if (g.profile) return `${where} · ${g.profile}`;
      if (g.share != null && g.share < 1) return `${where} · ${Number(g.share.toFixed(4))} of it`;
      return where;
    })
    .join(", ");
}
