// The Fleet page's overview map: one canvas, one cell per GPU, a node's GPUs kept together on a line where they fit.
// A cell's colour is its utilization (pale idle, saturated busy); grey is down, red lost; a dark corner mark says
// the GPU is taken. Hovering names the GPU; clicking hands it to `onPick` (the page scrolls its table there).
import { holderText, pctText, usable } from "./fleet_text.js";

const CELL = 10; // px
const GAP = 2;
const NODE_GAP = 6; // extra space between two nodes' cells

const css = getComputedStyle(document.documentElement);
const cssVar = (name, fallback) => css.getPropertyValue(name).trim() || fallback;
const C_DOWN = cssVar("--fleet-down", "#d5d9e2");
const C_HELD = cssVar("--fleet-held", "#141a26");
const C_LOST = cssVar("--bad", "#d64545");
// Utilization colour ramp, precomputed once.
const RAMP = Array.from({ length: 101 }, (_, u) => {
  const t = u / 100;
  const mix = (a, b) => Math.round(a + (b - a) * t);
  return `rgb(${mix(222, 22)}, ${mix(233, 78)}, ${mix(252, 214)})`;
});

export function overviewMap(canvas, { dpr, onPick }) {
  const ctx = canvas.getContext("2d");
  let cells = []; // [{g, x, y}] in snapshot order
  let width = 0;

  // Place every node's GPUs for a canvas `w` px wide; returns the number of cells.
  function layout(w, nodeOrder, nodes) {
    width = w;
    cells = [];
    let x = 0;
    let y = 0;
    for (const name of nodeOrder) {
      const gs = nodes.get(name).gpus;
      if (!gs.length) continue;
      const need = gs.length * (CELL + GAP);
      if (x > 0 && x + need > w && need <= w) {
        x = 0;
        y += CELL + GAP;
      }
      for (const g of gs) {
        if (x + CELL > w) {
          x = 0;
          y += CELL + GAP;
        }
        cells.push({ g, x, y });
        x += CELL + GAP;
      }
      x += NODE_GAP;
    }
    const h = cells.length ? y + CELL : CELL;
    canvas.style.height = `${h}px`;
    canvas.width = Math.max(1, Math.floor(w * dpr));
    canvas.height = Math.max(1, Math.floor(h * dpr));
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    return cells.length;
  }

  // `dimmed(g)`: true for a GPU the filters leave out, drawn faint.
  function draw(dimmed) {
    ctx.clearRect(0, 0, width, canvas.height / dpr);
    for (const c of cells) {
      const g = c.g;
      ctx.globalAlpha = dimmed(g) ? 0.15 : 1;
      if (g.status === "lost") ctx.fillStyle = C_LOST;
      else if (!usable(g)) ctx.fillStyle = C_DOWN;
      else ctx.fillStyle = RAMP[Math.max(0, Math.min(100, Math.round(g.util || 0)))];
      ctx.fillRect(c.x, c.y, CELL, CELL);
      if (g.holder) {
        ctx.fillStyle = C_HELD;
        ctx.fillRect(c.x + CELL - 4, c.y, 4, 4);
      }
    }
    ctx.globalAlpha = 1;
  }

  function cellAt(ev) {
    const rect = canvas.getBoundingClientRect();
    const x = ev.clientX - rect.left;
    const y = ev.clientY - rect.top;
    return cells.find((c) => x >= c.x && x < c.x + CELL && y >= c.y && y < c.y + CELL);
  }

  canvas.addEventListener("mousemove", (ev) => {
    const c = cellAt(ev);
    canvas.title = c ? `${c.g.node} / ${c.g.index} · ${c.g.model} · ${pctText(c.g.util)} · ${holderText(c.g)}` : "";
  });
  canvas.addEventListener("click", (ev) => {
    const c = cellAt(ev);
    if (c) onPick(c.g);
  });

  // Where a GPU's cell is, in canvas px (the browser test clicks it).
  const cellOf = (uuid) => cells.find((c) => c.g.uuid === uuid);

  return { layout, draw, cellOf, width: () => width };
}
