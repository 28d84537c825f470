// Pages rendered by the server that follow changes: fetch the page again and swap in the parts that show them (the
// server scopes and filters what they hold). Changes that come together are one fetch, at most one every `gapMs`;
// a hidden tab fetches when it is shown again.
export function followedParts(selectors, { gapMs = 2000, onSwapped = () => {} } = {}) {
  let timer = null;
  let last = 0;
  async function refresh() {
    timer = null;
    if (document.hidden) { document.addEventListener("visibilitychange", soon, { once: true }); return; }
    last = Date.now();
    try {
      const resp = await fetch(location.href, { headers: { Accept: "text/html" }, credentials: "same-origin" });
      if (!resp.ok) return;
      const doc = new DOMParser().parseFromString(await resp.text(), "text/html");
      for (const sel of selectors) {
        const fresh = doc.querySelector(sel);
        const here = document.querySelector(sel);
        if (fresh && here) here.replaceWith(fresh);
        else if (here) here.remove();
      }
      onSwapped();
    } catch (e) { /* the portal away for a moment: the next change or reconnect fetches again */ }
  }
  function soon() {
    if (!timer) timer = setTimeout(refresh, Math.max(300, last + gapMs - Date.now()));
  }
  return soon;
}
