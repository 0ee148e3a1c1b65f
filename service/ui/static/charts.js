// SVG line charts with markers on the step axis (no library, no network).

import { fmtNum, s } from "./dom.js";

const W = 640, H = 240, PAD = { l: 52, r: 12, t: 12, b: 30 };

function ticks(lo, hi, n) {
  if (!(hi > lo)) return [lo];
  const raw = (hi - lo) / n, mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((m) => m >= raw) || raw;
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + 1e-12; v += step) out.push(v);
  return out;
}

/**
 * series: [{name, cls, points: [[x, y], ...]}]; markers: [{x, kind, label}].
 * Returns an <svg> (role img, labelled by `title`).
 */
export function lineChart({ title, series, markers = [], xlabel = "step", testid, attrs = {} }) {
  const all = series.flatMap((se) => se.points).filter((p) => p[1] !== null && Number.isFinite(p[1]));
  const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": title, class: "chart",
    "data-testid": testid, ...attrs });
  svg.append(s("title", {}, title));
  if (!all.length) {
    svg.append(s("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "empty" }, "no data yet"));
    return svg;
  }
  let x0 = Math.min(...all.map((p) => p[0])), x1 = Math.max(...all.map((p) => p[0]));
  let y0 = Math.min(...all.map((p) => p[1])), y1 = Math.max(...all.map((p) => p[1]));
  if (x1 === x0) x1 = x0 + 1;
  if (y1 === y0) { y0 -= 0.5; y1 += 0.5; }
  const pad = (y1 - y0) * 0.05; y0 -= pad; y1 += pad;
  const X = (x) => PAD.l + ((x - x0) / (x1 - x0)) * (W - PAD.l - PAD.r);
  const Y = (y) => H - PAD.b - ((y - y0) / (y1 - y0)) * (H - PAD.t - PAD.b);
  const axes = s("g", { class: "axes" });
  for (const v of ticks(y0, y1, 4)) {
    axes.append(s("line", { x1: PAD.l, x2: W - PAD.r, y1: Y(v), y2: Y(v), class: "grid" }),
      s("text", { x: PAD.l - 6, y: Y(v) + 4, "text-anchor": "end" }, fmtNum(v)));
  }
  for (const v of ticks(x0, x1, 6)) {
    axes.append(s("text", { x: X(v), y: H - PAD.b + 16, "text-anchor": "middle" }, fmtNum(v)));
  }
  axes.append(s("text", { x: W - PAD.r, y: H - 2, "text-anchor": "end", class: "axis-label" }, xlabel));
  svg.append(axes);
  for (const m0 of markers) {
    const m = { ...m0, x: Math.min(x1, Math.max(x0, m0.x)) }; // on the axis even when before the first point
    svg.append(s("g", { class: `marker marker-${m.kind}`, "data-testid": "chart-marker", "data-kind": m.kind },
      s("line", { x1: X(m.x), x2: X(m.x), y1: PAD.t, y2: H - PAD.b }),
      s("title", {}, `step ${m0.x}: ${m.label}`)));
  }
  for (const se of series) {
    const pts = se.points.filter((p) => p[1] !== null && Number.isFinite(p[1]));
    if (!pts.length) continue;
    const d = pts.map((p, i) => `${i ? "L" : "M"}${X(p[0]).toFixed(1)},${Y(p[1]).toFixed(1)}`).join("");
    svg.append(s("path", { d, class: `line ${se.cls || ""}`, "data-series": se.name },
      s("title", {}, se.name)));
  }
  return svg;
}

/** A horizontal stacked bar: parts [{name, value}] (a recovery's phases, a step's time). */
export function stackedBar(parts, { label, unit = "s" } = {}) {
  const total = parts.reduce((a, p) => a + Math.max(0, p.value || 0), 0) || 1;
  const svg = s("svg", { viewBox: "0 0 300 18", class: "bar", role: "img", "aria-label": label,
    preserveAspectRatio: "none" });
  let x = 0;
  parts.forEach((p, i) => {
    const w = (Math.max(0, p.value || 0) / total) * 300;
    svg.append(s("rect", { x, y: 0, width: w, height: 18, class: `seg seg-${i % 8}`, "data-phase": p.name },
      s("title", {}, `${p.name}: ${fmtNum(p.value)} ${unit}`)));
    x += w;
  });
  return svg;
}
