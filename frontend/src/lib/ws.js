// A websocket that reconnects with backoff and hands parsed JSON messages to a callback.
const REFUSED = new Set([4401, 4403, 4404]);

export function liveSocket(path, onMessage, { onState = () => {} } = {}) {
  let ws = null;
  let delay = 500;
  let closed = false;
  function connect() {
    const proto = location.protocol === "https:" ? "wss:" : "ws:";
    ws = new WebSocket(`${proto}//${location.host}${path}`);
    ws.onopen = () => { delay = 500; onState("open"); };
    ws.onmessage = (ev) => { try { onMessage(JSON.parse(ev.data)); } catch (e) { console.error(e); } };
    ws.onclose = (ev) => {
      // Refused, or access ended while open (signed out, token revoked, no longer in the team): retrying cannot
      // help until the page is loaded again (a sign-in page, or what the user may now see).
      if (REFUSED.has(ev.code)) { closed = true; onState("refused"); return; }
      onState("closed");
      if (!closed) setTimeout(connect, delay);
      delay = Math.min(delay * 2, 10000);
    };
  }
  connect();
  return { close() { closed = true; if (ws) ws.close(); } };
}
