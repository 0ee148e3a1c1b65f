// Small DOM helpers: elements are built, never parsed from strings (no innerHTML with data).

const SVG_NS = "http://www.w3.org/2000/svg";

function build(el, attrs, children) {
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
    else if (k === "text") el.textContent = v;
    else if (k === "style") el.style.cssText = v; // CSSOM: allowed by the page's CSP (a style attribute is not)
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

/** h("tr", {"data-testid": "job-row"}, h("td", {}, "x")) */
export function h(tag, attrs, ...children) { return build(document.createElement(tag), attrs, children); }
export function s(tag, attrs, ...children) { return build(document.createElementNS(SVG_NS, tag), attrs, children); }

export function fmtNum(v, digits = 3) {
  if (v === null || v === undefined || Number.isNaN(v)) return "—";
  if (Math.abs(v) >= 1e6) return `${(v / 1e6).toFixed(1)}M`;
  if (Math.abs(v) >= 1e4) return `${(v / 1e3).toFixed(1)}k`;
  if (Math.abs(v) >= 1e3) return String(Math.round(v));
  if (v !== 0 && Math.abs(v) < 1e-3) return Number(v).toExponential(1);
  const t = Number(v).toPrecision(digits);
  return t.includes(".") ? t.replace(/\.?0+$/, "") : t;
}

export function fmtTime(ts) {
  if (!ts) return "—";
  const d = new Date(ts);
  return Number.isNaN(d.getTime()) ? String(ts) : d.toLocaleTimeString([], { hour12: false });
}

export function fmtSecs(v) { return v === null || v === undefined ? "—" : `${Number(v).toFixed(2)} s`; }

export const TERMINAL = new Set(["SUCCEEDED", "FAILED", "CANCELLED"]);
export const STATES = ["PENDING", "ADMITTED", "RUNNING", "RECOVERING", "PREEMPTED", "SUCCEEDED", "FAILED", "CANCELLED"];

/** A stable colour per key (tenant, job). */
export function colour(key) {
  let x = 0;
  for (const ch of String(key)) x = (x * 31 + ch.charCodeAt(0)) >>> 0;
  return `hsl(${x % 360} 60% 45%)`;
}
