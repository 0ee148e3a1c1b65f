// The Orthoplex dashboard: sign-in, jobs, job page, submit, cluster. A single page under /ui/.

import { ApiError, ConnectionLost, api, fieldErrors, on, session, whoami } from "./api.js";
import { lineChart, stackedBar } from "./charts.js";
import { STATES, TERMINAL, colour, fmtNum, fmtSecs, fmtTime, h } from "./dom.js";

const POLL_MS = 2000;
const main = document.getElementById("main");
const conn = document.getElementById("conn");
let view = null; // {stop()} of the current view
let loginMessage = "";

// ------------------------------------------------------------------ routing
function route() {
  if (view) view.stop();
  view = null;
  const path = location.pathname.replace(/\/+$/, "") || "/ui";
  const nav = document.getElementById("nav");
  if (!session.token()) {
    nav.hidden = true;
    view = loginView();
    return;
  }
  nav.hidden = false;
  const admin = session.role() === "admin";
  document.getElementById("nav-cluster").hidden = !admin;
  document.getElementById("nav-submit").hidden = admin;
  document.getElementById("who").textContent = admin ? "admin" : "tenant";
  for (const a of nav.querySelectorAll("a")) {
    a.toggleAttribute("aria-current", a.getAttribute("href").replace(/\/+$/, "") === path);
  }
  let m;
  if ((m = path.match(/^\/ui\/jobs\/([^/]+)$/))) view = jobView(m[1]);
  else if (path === "/ui/submit") view = submitView();
  else if (path === "/ui/cluster") view = admin ? clusterView() : message("The cluster view is for the admin token.");
  else if (path === "/ui") view = jobsView();
  else view = message(`No page at ${path}.`, "not-found");
  main.focus({ preventScroll: true });
}

export function go(path) {
  history.pushState({}, "", path);
  route();
}

document.addEventListener("click", (e) => {
  const a = e.target.closest("a[data-link]");
  if (!a || e.ctrlKey || e.metaKey || e.shiftKey || e.button !== 0) return;
  e.preventDefault();
  go(a.getAttribute("href"));
});
window.addEventListener("popstate", route);
document.getElementById("logout").addEventListener("click", () => { session.clear(); loginMessage = ""; go("/ui/"); });

on("unauthorized", (detail) => {
  session.clear();
  loginMessage = `Signed out: ${detail || "the token is no longer valid"}. Sign in again.`;
  route();
});
on("connection", (ok) => {
  conn.hidden = ok;
  conn.textContent = ok ? "" : "Connection to the API lost; retrying…";
});

function message(text, testid = "message") {
  main.replaceChildren(h("p", { class: "notice", "data-testid": testid, role: "alert" }, text));
  return { stop() {} };
}

/** Run `fn` now and every POLL_MS until stopped; errors other than 401 are shown and retried. */
function poller(fn) {
  let stopped = false, timer = null;
  const ctl = new AbortController();
  const tick = async () => {
    try { await fn(ctl.signal); } catch (e) {
      if (e.name === "AbortError" || stopped) return;
      if (!(e instanceof ConnectionLost)) console.warn(e);
      if (e instanceof ApiError && e.status === 404) return; // the view shows it; stop polling
    }
    if (!stopped) timer = setTimeout(tick, POLL_MS);
  };
  tick();
  return { stop() { stopped = true; clearTimeout(timer); ctl.abort(); }, poke() { clearTimeout(timer); if (!stopped) tick(); } };
}

// ------------------------------------------------------------------ sign in
function loginView() {
  const input = h("input", { id: "token", type: "password", autocomplete: "off", required: true,
    "data-testid": "token-input", "aria-describedby": "login-error" });
  const err = h("p", { id: "login-error", class: "error", role: "alert", "data-testid": "login-error",
    hidden: !loginMessage }, loginMessage);
  const button = h("button", { type: "submit", "data-testid": "login" }, "Sign in");
  const form = h("form", { class: "card login", "aria-labelledby": "login-title" },
    h("h1", { id: "login-title" }, "Sign in"),
    h("label", { for: "token" }, "API token (a tenant token or the admin token)"), input, err, button,
    h("p", { class: "muted" }, "The token stays in this tab's session storage and is sent only to this server."));
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const token = input.value.trim();
    err.hidden = true;
    if (!token) { err.textContent = "Paste a token first."; err.hidden = false; return; }
    button.disabled = true;
    try {
      const role = await whoami(token);
      session.set(token, role);
      loginMessage = "";
      route();
    } catch (ex) {
      err.textContent = ex instanceof ApiError && ex.status === 401
        ? `This token was not accepted: ${ex.message}.`
        : ex instanceof ConnectionLost ? "The API does not answer; try again." : `Sign-in failed: ${ex.message}`;
      err.hidden = false;
      input.focus();
    } finally { button.disabled = false; }
  });
  main.replaceChildren(form);
  input.focus();
  return { stop() {} };
}

// ------------------------------------------------------------------ jobs
function stateBadge(state) { return h("span", { class: `state state-${state}`, "data-testid": "job-state" }, state); }

function jobsView() {
  const admin = session.role() === "admin";
  const filter = h("select", { id: "state-filter", "data-testid": "state-filter" },
    h("option", { value: "" }, "all states"), STATES.map((st) => h("option", { value: st }, st)));
  const tbody = h("tbody");
  const more = h("button", { type: "button", "data-testid": "more-jobs", hidden: true }, "Show more");
  const count = h("span", { class: "muted", "data-testid": "job-count" });
  const table = h("table", { class: "jobs", "data-testid": "jobs-table" },
    h("caption", { class: "sr-only" }, "Jobs, newest first"),
    h("thead", {}, h("tr", {}, [admin ? "Tenant" : null, "Job", "State", "Progress", "GPUs", "Layout", "Tokens/s", "Last event"]
      .filter(Boolean).map((t) => h("th", { scope: "col" }, t)))), tbody);
  main.replaceChildren(h("section", { "aria-labelledby": "jobs-title" },
    h("div", { class: "bar-head" }, h("h1", { id: "jobs-title" }, admin ? "All jobs" : "Jobs"),
      h("label", { for: "state-filter" }, "State "), filter, count),
    h("div", { class: "scroll" }, table), more));
  let pages = 1, next = null;
  const load = async (signal) => {
    const items = [];
    let cursor = null;
    for (let i = 0; i < pages; i++) {
      const q = new URLSearchParams({ limit: "50" });
      if (filter.value) q.set("state", filter.value);
      if (cursor) q.set("cursor", cursor);
      const page = await api("GET", `/v1/dashboard/jobs?${q}`, { signal });
      items.push(...page.items);
      cursor = page.next_cursor;
      if (!cursor) break;
    }
    next = cursor;
    more.hidden = !next;
    count.textContent = `${items.length}${next ? "+" : ""} job${items.length === 1 ? "" : "s"}`;
    const focused = document.activeElement?.closest?.("tr")?.dataset?.jobId;
    tbody.replaceChildren(...items.map((j) => jobRow(j, admin)));
    if (!items.length) tbody.append(h("tr", {}, h("td", { colspan: 8, class: "muted", "data-testid": "no-jobs" }, "No jobs.")));
    if (focused) tbody.querySelector(`tr[data-job-id="${focused}"] a`)?.focus();
  };
  const p = poller(load);
  filter.addEventListener("change", () => { pages = 1; p.poke(); });
  more.addEventListener("click", () => { pages += 1; p.poke(); });
  return p;
}

function jobRow(j, admin) {
  const href = `/ui/jobs/${j.id}`;
  const tr = h("tr", { "data-testid": "job-row", "data-job-id": j.id, "data-state": j.state, class: "clickable" },
    admin ? h("td", {}, j.tenant) : null,
    h("td", {}, h("a", { href, "data-link": true, "data-testid": "job-link" }, j.name), h("span", { class: "muted" }, ` #${j.id}`)),
    h("td", {}, stateBadge(j.state)),
    h("td", {}, h("progress", { max: j.steps || 1, value: j.step || 0, "aria-label": `step ${j.step} of ${j.steps}` }),
      ` ${j.step} / ${j.steps}`),
    h("td", {}, `${j.gpus} (${j.min_gpus}–${j.max_gpus})`),
    h("td", { class: "mono" }, j.layout || "—"),
    h("td", {}, fmtNum(j.tokens_per_s)),
    h("td", {}, j.last_event ? `${j.last_event.type}${j.last_event.reason ? `: ${j.last_event.reason}` : ""}` : "—"));
  tr.addEventListener("click", (e) => { if (!e.target.closest("a")) go(href); });
  return tr;
}

// ------------------------------------------------------------------ job page
function jobView(rawId) {
  if (!/^[1-9][0-9]{0,9}$/.test(rawId)) return message(`"${rawId}" is not a job id.`, "not-found");
  const id = rawId;
  const admin = session.role() === "admin";
  main.replaceChildren(h("p", { class: "muted" }, `Loading job ${id}…`));
  let explained = false, built = null;
  const load = async (signal) => {
    let d, curve;
    try {
      [d, curve] = await Promise.all([
        api("GET", `/v1/dashboard/jobs/${id}`, { signal }),
        api("GET", `/v1/dashboard/jobs/${id}/curve?max_points=1500`, { signal }),
      ]);
    } catch (e) {
      if (e instanceof ApiError && e.status === 404) {
        main.replaceChildren(h("section", {}, h("h1", {}, `Job ${id}`),
          h("p", { class: "notice", role: "alert", "data-testid": "not-found" },
            `Job ${id} was not found: it does not exist, was deleted, or belongs to another tenant.`),
          h("a", { href: "/ui/", "data-link": true }, "Back to the jobs")));
        built = null;
      }
      throw e;
    }
    if (!built) built = buildJobPage(d, admin);
    fillJobPage(built, d, curve);
    if (!explained) { explained = true; loadExplain(id, built, signal); }
    if (TERMINAL.has(d.job.state)) built.live.textContent = "ended";
  };
  return poller(load);
}

function buildJobPage(d, admin) {
  const j = d.job;
  const b = {
    title: h("h1", { "data-testid": "job-title" }),
    state: h("span"), progress: h("span", { "data-testid": "job-step" }), live: h("span", { class: "muted" }),
    cancel: h("button", { type: "button", class: "danger", "data-testid": "cancel-job", hidden: admin }, "Cancel job…"),
    charts: h("div", { class: "charts" }),
    kpis: h("dl", { class: "kpis" }),
    events: h("tbody"), eventsNote: h("p", { class: "muted" }),
    ledger: h("tbody"), grid: h("div", { class: "grid", "data-testid": "rank-grid" }),
    explain: h("div", { "data-testid": "plan-explain" }, h("p", { class: "muted" }, "Asking the planner…")),
    dialog: null, cancelMsg: h("p", { role: "status", "data-testid": "cancel-status" }),
  };
  const confirm = h("button", { type: "button", class: "danger", "data-testid": "confirm-cancel" }, "Yes, cancel it");
  const keep = h("button", { type: "button", "data-testid": "keep-job" }, "Keep running");
  b.dialog = h("dialog", { "aria-labelledby": "cancel-title", "data-testid": "cancel-dialog" },
    h("h2", { id: "cancel-title" }, `Cancel job ${j.id} (${j.name})?`),
    h("p", {}, "A running job is stopped by the controller; its last checkpoint stays."), h("div", { class: "row" }, keep, confirm));
  b.cancel.addEventListener("click", () => b.dialog.showModal());
  keep.addEventListener("click", () => b.dialog.close());
  confirm.addEventListener("click", async () => {
    confirm.disabled = true;
    try {
      const job = await api("POST", `/v1/jobs/${j.id}/cancel`);
      b.cancelMsg.textContent = job.cancel_requested && !TERMINAL.has(job.state)
        ? "Cancel requested; the controller is stopping the job." : `Job ${job.state.toLowerCase()}.`;
    } catch (e) {
      b.cancelMsg.textContent = `Cancel refused: ${e.message}`;
    } finally { confirm.disabled = false; b.dialog.close(); }
  });
  const ledgerTable = h("table", { "data-testid": "recovery-ledger" },
    h("caption", { class: "sr-only" }, "Recoveries"),
    h("thead", {}, h("tr", {}, ["When", "Cause", "Failed at", "Layout before → after", "Phases", "Total"].map((t) => h("th", { scope: "col" }, t)))),
    b.ledger);
  main.replaceChildren(h("article", { "aria-labelledby": "job-title", class: "job" },
    h("div", { class: "bar-head" }, b.title, b.state, b.progress, b.live, b.cancel), b.cancelMsg,
    h("section", { "aria-label": "Curves" }, h("h2", {}, "Training"), b.kpis, b.charts),
    h("section", { "aria-labelledby": "ledger-title" }, h("h2", { id: "ledger-title" }, "Recoveries"),
      h("div", { class: "scroll" }, ledgerTable),
      h("p", { class: "legend" }, ["detect", "plan", "place", "start", "load", "first step"].map((p, i) => h("span", { class: `key seg-${i}` }, p)))),
    h("section", { "aria-labelledby": "grid-title" }, h("h2", { id: "grid-title" }, "Rank grid of the plan in force"), b.grid),
    h("section", { "aria-labelledby": "explain-title" }, h("h2", { id: "explain-title" }, "Why this plan"), b.explain),
    h("section", { "aria-labelledby": "events-title" }, h("h2", { id: "events-title" }, "Events"), b.eventsNote,
      h("div", { class: "scroll" }, h("table", { "data-testid": "events" },
        h("thead", {}, h("tr", {}, ["Time", "Type", "Source", "What happened"].map((t) => h("th", { scope: "col" }, t)))), b.events))),
    b.dialog));
  return b;
}

function eventText(ev) {
  const p = ev.payload || {};
  if (ev.type === "transition") return `${p.from} → ${p.to}${p.reason ? `: ${p.reason}` : ""}`;
  if (ev.type === "replan") return `${p.decision}: ${p.old_short} → ${p.new_short} (${fmtNum(p.old_tokens_per_s)} → ${fmtNum(p.new_tokens_per_s)} tok/s predicted)${p.reason ? `. ${p.reason}` : ""}`;
  if (ev.type === "decision") return `${p.kind}${p.gpus ? ` ${p.gpus} GPUs` : ""}: ${p.reason || ""}`;
  return p.reason || p.msg || Object.entries(p).filter(([k, v]) => typeof v !== "object" && k !== "seq" && k !== "ts")
    .slice(0, 5).map(([k, v]) => `${k}=${v}`).join(" ");
}

function fillJobPage(b, d, curve) {
  const j = d.job;
  b.title.textContent = `${j.name} #${j.id}`;
  b.state.replaceChildren(stateBadge(j.state));
  b.progress.textContent = `step ${d.step} / ${j.spec.steps}`;
  b.progress.dataset.step = d.step;
  b.live.textContent = TERMINAL.has(j.state) ? "" : "live";
  b.cancel.hidden = session.role() === "admin" || TERMINAL.has(j.state);
  // curves: one loss line per epoch (a step re-run by a later attempt shows as its own line)
  const byEpoch = new Map();
  for (const p of curve.points) {
    if (!byEpoch.has(p.epoch)) byEpoch.set(p.epoch, []);
    byEpoch.get(p.epoch).push(p);
  }
  const lossSeries = [...byEpoch].map(([a, pts], i) => ({ name: `loss, epoch ${a}`, cls: `s${i % 6}`, points: pts.map((p) => [p.step, p.loss]) }));
  if (curve.val_loss) lossSeries.push({ name: "val_loss", cls: "val", points: curve.val_loss.map((p) => [p.step, p.loss]) });
  const drawn = curve.points.filter((p) => p.loss !== null).length;
  const markers = d.markers.map((m) => ({ x: m.step, kind: m.kind, label: m.label }));
  const loss = lineChart({ title: `Loss by step (${drawn} points${curve.width > 1 ? `, buckets of ${curve.width} steps` : ""})`,
    series: lossSeries, markers, testid: "loss-chart", attrs: { "data-points": drawn, "data-total-points": curve.total_points } });
  const tput = lineChart({ title: "Tokens/s by step", testid: "throughput-chart",
    series: [...byEpoch].map(([a, pts], i) => ({ name: `tokens/s, epoch ${a}`, cls: `s${i % 6}`, points: pts.map((p) => [p.step, p.tokens_per_s]) })),
    markers });
  b.charts.replaceChildren(h("figure", {}, loss, h("figcaption", {}, "Loss; vertical marks: plan changes (blue) and recoveries (red)")),
    h("figure", {}, tput, h("figcaption", {}, "Throughput (tokens/s)")));
  const last = curve.points[curve.points.length - 1];
  b.kpis.replaceChildren(
    h("dt", {}, "Loss"), h("dd", {}, fmtNum(j.final_loss ?? last?.loss)),
    h("dt", {}, "Tokens/s"), h("dd", {}, fmtNum(d.tokens_per_s)),
    h("dt", {}, "MFU (planner)"), h("dd", { "data-testid": "mfu" }, b.mfu || "—"),
    h("dt", {}, "GPUs"), h("dd", {}, `${j.gpus_allocated} (${j.min_gpus}–${j.max_gpus})`),
    h("dt", {}, "Attempt"), h("dd", {}, j.attempt),
    h("dt", {}, "Recovery"), h("dd", { "data-testid": "recovery-choice", "data-policy": j.recovery?.policy || "" },
      j.recovery ? recoveryText(j.recovery) : "chosen when the job starts"),
    h("dt", {}, "Reason"), h("dd", {}, j.reason));
  // events, newest first
  b.eventsNote.textContent = d.events_truncated ? "Showing the newest 500 events (step events are on the curve)." : "Step events are on the curve.";
  b.events.replaceChildren(...d.events.slice().reverse().map((ev) => h("tr", { "data-testid": "event-row", "data-type": ev.type },
    h("td", {}, fmtTime(ev.ts)), h("td", {}, h("span", { class: `etype etype-${ev.type}` }, ev.type)),
    h("td", { class: "muted" }, ev.source), h("td", {}, eventText(ev)))));
  // recovery ledger
  b.ledger.replaceChildren(...(d.ledger.length ? d.ledger.map((r) => h("tr", { "data-testid": "recovery-row", "data-cause": r.cause },
    h("td", {}, fmtTime(r.ts)), h("td", {}, r.cause, r.reason ? h("div", { class: "muted small" }, r.reason) : null),
    h("td", {}, r.failed_at_step ?? "—", r.resumed_from_step !== null && r.resumed_from_step !== undefined ? h("div", { class: "muted small" }, `resumed from ${r.resumed_from_step}`) : null),
    h("td", { class: "mono", "data-testid": "recovery-layouts" }, `${r.before || "?"} → ${r.after || "?"}`, r.decision ? h("div", { class: "muted small" }, r.decision) : null),
    h("td", { "data-testid": "recovery-phases" }, stackedBar(Object.entries(r.phases).map(([name, value]) => ({ name, value })), { label: `phases of the recovery: ${Object.entries(r.phases).map(([k, v]) => `${k} ${v.toFixed(2)}s`).join(", ")}` })),
    h("td", {}, fmtSecs(r.total_s)))) : [h("tr", {}, h("td", { colspan: 6, class: "muted" }, "No recoveries."))]));
  // rank grid
  const g = d.grid;
  if (!g) { b.grid.replaceChildren(h("p", { class: "muted" }, "No ranks placed yet.")); return; }
  const nodes = g.nodes.map((n, i) => {
    const cells = g.cells.filter((c) => c.node === n.node);
    return h("div", { class: `node node-${n.status.replace(" ", "-")}`, "data-testid": "rank-node", "data-node": n.node, "data-status": n.status },
      h("div", { class: "node-head" }, h("strong", {}, `node ${i + 1}`), h("span", { class: "mono muted", title: n.node }, ` ${n.node.slice(0, 8)}`),
        n.status !== "in use" ? h("span", { class: "lost" }, ` ${n.status}`) : null),
      h("div", { class: "cells" }, cells.map((c) => h("div", { class: "cell", tabindex: 0, "data-testid": "rank-cell", "data-node": c.node,
        "data-rank": c.rank, "data-tp": c.tp, "data-pp": c.pp, "data-cp": c.cp, "data-dp": c.dp,
        style: `--pp:${c.pp}`, "aria-label": `rank ${c.rank}: tp ${c.tp}, pp ${c.pp}, cp ${c.cp}, dp ${c.dp}` },
      h("b", {}, `r${c.rank}`), h("span", {}, `tp${c.tp} pp${c.pp}`), h("span", {}, `cp${c.cp} dp${c.dp}`)))));
  });
  b.grid.replaceChildren(h("p", { class: "mono" }, `${g.short} on ${g.world_size} GPUs`), ...nodes);
}

function recoveryText(r) {
  const what = r.policy === "replica_groups" ? `replica groups: ${r.groups} of ${r.group_gpus} GPU${r.group_gpus === 1 ? "" : "s"}`
    : r.policy === "replan" ? "re-plan" : "restart from storage";
  const snaps = r.snapshots ? `snapshots every ${r.snapshot_every} step${r.snapshot_every === 1 ? "" : "s"}` : "no snapshots";
  return `${what}; ${snaps}; ${r.warm_ranks} warm rank${r.warm_ranks === 1 ? "" : "s"} per node. Why: ${r.reason}`;
}

async function loadExplain(id, b, signal) {
  let e;
  try { e = await api("GET", `/v1/dashboard/jobs/${id}/explain`, { signal }); } catch (ex) {
    b.explain.replaceChildren(h("p", { class: "muted" }, `The planner could not be asked: ${ex.message}`));
    return;
  }
  if (!e.available) { b.explain.replaceChildren(h("p", { class: "muted" }, `No explanation: ${e.reason}`)); return; }
  const best = e.plans[0], est = best.estimate;
  b.mfu = `${(est.mfu * 100).toFixed(1)} %`;
  const mfu = document.querySelector('[data-testid="mfu"]');
  if (mfu) mfu.textContent = b.mfu;
  const short = (l) => `tp${l.tp}·pp${l.pp}·cp${l.cp}·dp${l.dp}${l.vpp > 1 ? `·vpp${l.vpp}` : ""} mb${l.micro_batch} z${l.zero} ${l.schedule}`;
  const tb = Object.entries(est.time_breakdown_s).filter(([, v]) => v > 0);
  const mb = Object.entries(est.memory_breakdown_gb).filter(([, v]) => v > 0);
  b.explain.replaceChildren(
    h("p", {}, `On ${e.gpus} GPUs the planner ranks `, h("span", { class: "mono" }, short(best.layout)),
      ` first of ${e.searched} candidates: ${fmtNum(est.step_time_s * 1000)} ms per step, ${fmtNum(est.tokens_per_s)} tokens/s, `,
      `${fmtNum(est.memory_gb_per_gpu)} GB per GPU, bubble ${(est.bubble_fraction * 100).toFixed(1)} % of the step.`),
    h("div", { class: "two" },
      h("div", {}, h("h3", {}, "Step time by component"), stackedBar(tb.map(([name, value]) => ({ name, value })), { label: "step time by component" }),
        h("ul", { class: "legend-list" }, tb.map(([k, v], i) => h("li", {}, h("span", { class: `key seg-${i % 8}` }), `${k}: ${fmtNum(v * 1000)} ms`)))),
      h("div", {}, h("h3", {}, "Memory per GPU by component"), stackedBar(mb.map(([name, value]) => ({ name, value })), { label: "memory by component", unit: "GB" }),
        h("ul", { class: "legend-list" }, mb.map(([k, v], i) => h("li", {}, h("span", { class: `key seg-${i % 8}` }), `${k}: ${fmtNum(v)} GB`))))),
    h("h3", {}, "Alternatives it beat"),
    h("div", { class: "scroll" }, h("table", { "data-testid": "alternatives" },
      h("thead", {}, h("tr", {}, ["Layout", "Step time", "Tokens/s", "GB/GPU", "Bubble", "vs best"].map((t) => h("th", { scope: "col" }, t)))),
      h("tbody", {}, e.plans.map((p, i) => h("tr", {}, h("td", { class: "mono" }, short(p.layout)),
        h("td", {}, `${fmtNum(p.estimate.step_time_s * 1000)} ms`), h("td", {}, fmtNum(p.estimate.tokens_per_s)),
        h("td", {}, fmtNum(p.estimate.memory_gb_per_gpu)), h("td", {}, `${(p.estimate.bubble_fraction * 100).toFixed(1)} %`),
        h("td", {}, i === 0 ? "chosen" : `${((p.estimate.step_time_s / est.step_time_s - 1) * 100).toFixed(1)} % slower`))),
      e.rejected.slice(0, 5).map((r) => h("tr", { class: "muted" }, h("td", { class: "mono" }, short(r.layout)), h("td", { colspan: 5 }, `rejected: ${r.reason}`)))))),
    goodputNote(e, best),
    e.in_force ? h("p", { class: "muted" }, `Layout in force: ${e.in_force}.`) : null,
    e.recovery ? h("p", { "data-testid": "explain-recovery" }, `Recovery on this plan: ${recoveryText(e.recovery)}`) : null);
}

// the plan's expected goodput and recovery choice (jobs with duration_days; docs/goodput.md)
function goodputNote(e, best) {
  const r = best.recovery;
  if (!e.goodput || !r) return null;
  const groups = r.policy === "replica_group" ? ` × ${r.groups} groups` : "";
  const every = r.snapshot_every ? `snapshot every ${r.snapshot_every} steps` : `checkpoint every ${r.checkpoint_every_steps} steps`;
  return h("p", { "data-testid": "goodput" },
    `Expected ETTR ${(best.ettr * 100).toFixed(2)} % over ${e.goodput.duration_days} days (${e.goodput.failure_rates.name} failure rates): `,
    `${fmtNum(best.effective_tokens_per_s)} effective tokens/s. Recovery: `, h("span", { class: "mono" }, `${r.policy}${groups}`),
    `, ${every}, ${r.warm_spares} warm spares. ${r.reason}.`);
}

// ------------------------------------------------------------------ submit
const FIELDS = [
  ["name", "Name", "text", "my-run", "1–128 of A-Z a-z 0-9 . _ -"],
  ["model", "Model", "select", "tiny", "an engine preset"],
  ["steps", "Steps", "number", "100", ""],
  ["global_batch", "Global batch", "number", "8", "sequences per step"],
  ["min_gpus", "Min GPUs", "number", "2", "starts only when all can be reserved"],
  ["max_gpus", "Max GPUs", "number", "4", "the scheduler may grow it up to here"],
  ["priority", "Priority", "number", "0", "-100..100, within the tenant"],
  ["layout_hint.tp", "TP hint", "number", "", "optional"],
  ["layout_hint.pp", "PP hint", "number", "", "optional"],
  ["recovery.policy", "Recovery", "select", "auto", "auto: replica groups when the plan holds two or more full replicas in memory, else re-plan from memory"],
  ["recovery.groups", "Replica groups", "number", "", "optional, with replica_groups"],
  ["recovery.snapshots.enabled", "Memory snapshots", "select", "default", "default: on (off with restart)"],
  ["recovery.snapshots.every", "Snapshot cadence", "number", "", "a snapshot after every N-th step; optional, default 1"],
  ["recovery.warm_ranks", "Warm ranks per node", "number", "", "optional; default 1, 0 turns them off"],
];
const CHOICES = {
  model: ["tiny", "small", "llama-1b", "llama3-1b", "llama2-7b", "llama3-8b", "llama2-13b", "llama2-70b", "llama3-70b", "llama3-405b"],
  "recovery.policy": ["auto", "replica_groups", "replan", "restart"],
  "recovery.snapshots.enabled": ["default", "true", "false"],
};

function submitView() {
  if (session.role() === "admin") return message("Jobs are submitted with a tenant token.");
  const inputs = {}, errors = {};
  const rows = FIELDS.map(([key, label, type, dflt, help]) => {
    const id = `f-${key.replaceAll(".", "-")}`;
    const input = type === "select"
      ? h("select", { id, name: key }, CHOICES[key].map((p) => h("option", { value: p, selected: p === dflt }, p)))
      : h("input", { id, name: key, type, value: dflt, "aria-describedby": `${id}-help ${id}-err`, ...(type === "number" ? { step: 1 } : {}) });
    inputs[key] = input;
    errors[key] = h("span", { id: `${id}-err`, class: "error", "data-testid": "field-error", "data-field": key, hidden: true });
    return h("div", { class: "field" }, h("label", { for: id }, label), input, h("span", { id: `${id}-help`, class: "muted small" }, help), errors[key]);
  });
  const general = h("p", { class: "error", role: "alert", "data-testid": "form-error", hidden: true });
  const preview = h("div", { "data-testid": "plan-preview", "aria-live": "polite" });
  const previewBtn = h("button", { type: "button", "data-testid": "preview-plan" }, "Preview plan");
  const submitBtn = h("button", { type: "submit", class: "primary", "data-testid": "submit-job" }, "Submit job");
  const form = h("form", { class: "card", "aria-labelledby": "submit-title", novalidate: true },
    h("h1", { id: "submit-title" }, "Submit a job"), h("div", { class: "fields" }, rows), general,
    h("div", { class: "row" }, previewBtn, submitBtn), preview);
  main.replaceChildren(form);

  const spec = () => {
    const out = {};
    for (const [key, , type] of FIELDS) {
      const raw = inputs[key].value.trim();
      if (raw === "" || raw === "default") continue;
      const v = type === "number" ? (Number.isFinite(Number(raw)) ? Number(raw) : raw)
        : raw === "true" ? true : raw === "false" ? false : raw;
      const path = key.split(".");
      let at = out;
      for (const part of path.slice(0, -1)) at = at[part] = at[part] || {};
      at[path[path.length - 1]] = v;
    }
    return out;
  };
  const showErrors = (ex) => {
    for (const k of Object.keys(errors)) { errors[k].hidden = true; inputs[k].removeAttribute("aria-invalid"); }
    general.hidden = true;
    if (!ex) return;
    const fe = ex instanceof ApiError && ex.status === 422 ? fieldErrors(ex.detail) : {};
    const rest = [];
    for (const [k, msg] of Object.entries(fe)) {
      const key = errors[k] ? k : Object.keys(errors).find((f) => k.startsWith(`${f}.`) || f.startsWith(`${k}.`));
      if (key) { errors[key].textContent = `${k}: ${msg}`; errors[key].hidden = false; inputs[key].setAttribute("aria-invalid", "true"); }
      else rest.push(`${k}: ${msg}`);
    }
    if (rest.length || !Object.keys(fe).length) { general.textContent = rest.length ? rest.join("; ") : ex.message; general.hidden = false; }
    const first = Object.keys(errors).find((k) => !errors[k].hidden);
    if (first) inputs[first].focus();
  };
  previewBtn.addEventListener("click", async () => {
    previewBtn.disabled = true;
    preview.replaceChildren(h("p", { class: "muted" }, "Planning…"));
    try {
      const r = await api("POST", "/v1/plans?top_k=3", { body: spec() });
      showErrors(null);
      preview.replaceChildren(h("h2", {}, `Plan preview: ${r.gpus} GPUs, ${r.searched} layouts searched`),
        h("table", {}, h("thead", {}, h("tr", {}, ["#", "Layout", "Step time", "Tokens/s", "GB/GPU", "MFU"].map((t) => h("th", { scope: "col" }, t)))),
          h("tbody", {}, r.plans.map((p, i) => h("tr", { "data-testid": "preview-plan-row" }, h("td", {}, i + 1),
            h("td", { class: "mono" }, `tp${p.layout.tp}·pp${p.layout.pp}·cp${p.layout.cp}·dp${p.layout.dp}`),
            h("td", {}, `${fmtNum(p.estimate.step_time_s * 1000)} ms`), h("td", {}, fmtNum(p.estimate.tokens_per_s)),
            h("td", {}, fmtNum(p.estimate.memory_gb_per_gpu)), h("td", {}, `${(p.estimate.mfu * 100).toFixed(1)} %`))))),
        r.recovery ? h("p", { "data-testid": "preview-recovery" }, `Recovery: ${recoveryText(r.recovery)}`) : null);
    } catch (ex) { preview.replaceChildren(); showErrors(ex); } finally { previewBtn.disabled = false; }
  });
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    submitBtn.disabled = true;
    try {
      const job = await api("POST", "/v1/jobs", { body: spec() });
      go(`/ui/jobs/${job.id}`);
    } catch (ex) { showErrors(ex); } finally { submitBtn.disabled = false; }
  });
  inputs.name.focus();
  return { stop() {} };
}

// ------------------------------------------------------------------ cluster (admin)
function clusterView() {
  const nodesEl = h("div", { class: "nodes" }), tenantsEl = h("tbody"), decisionsEl = h("tbody"), note = h("p", { class: "muted" });
  main.replaceChildren(h("section", { "aria-labelledby": "cluster-title" }, h("h1", { id: "cluster-title" }, "Cluster"), note, nodesEl),
    h("section", { "aria-labelledby": "tenants-title" }, h("h2", { id: "tenants-title" }, "Tenants"),
      h("div", { class: "scroll" }, h("table", { "data-testid": "tenants" }, h("thead", {}, h("tr", {}, ["Tenant", "Quota", "In use", "Borrowed", "Weight", "Jobs"].map((t) => h("th", { scope: "col" }, t)))), tenantsEl))),
    h("section", { "aria-labelledby": "decisions-title" }, h("h2", { id: "decisions-title" }, "Scheduler decisions"),
      h("div", { class: "scroll" }, h("table", { "data-testid": "decisions" }, h("thead", {}, h("tr", {}, ["Time", "Tenant", "Job", "Decision", "Reason"].map((t) => h("th", { scope: "col" }, t)))), decisionsEl))));
  return poller(async (signal) => {
    const [c, t, dec] = await Promise.all([api("GET", "/v1/cluster", { signal }), api("GET", "/v1/dashboard/tenants", { signal }),
      api("GET", "/v1/dashboard/decisions?limit=30", { signal })]);
    const tenantName = new Map(t.items.map((x) => [x.id, x.name]));
    const jobTenant = new Map(c.jobs.map((j) => [String(j.id), j]));
    note.textContent = (c.available ? `${c.alive_nodes} nodes alive, ${c.used_gpus} of ${c.total_gpus} GPUs in use, ${c.free_gpus} free.`
      : `Ray could not be asked: ${c.reason}`) + (c.ray_address ? ` Ray at ${c.ray_address}.` : "");
    note.dataset.rayInsecure = String(Boolean(c.ray_insecure));
    if (c.ray_insecure) note.append(h("strong", { class: "warn", "data-testid": "ray-insecure" },
      " ORTHOPLEX_ALLOW_INSECURE_RAY is set: this Ray cluster may answer without a token; anyone who reaches it runs code as the service."));
    nodesEl.replaceChildren(...c.nodes.map((n, i) => {
      const gpus = [];
      for (const a of n.allocations || []) {
        const job = jobTenant.get(String(a.job_id));
        const tenant = job ? tenantName.get(job.tenant_id) : null;
        for (let k = 0; k < a.gpus; k++) gpus.push({ job: a.job_id, name: job?.name, tenant });
      }
      while (gpus.length < n.gpus_total) gpus.push(null);
      const drain = (c.drains || []).find((d) => d.node_id === n.node_id);
      return h("div", { class: `cnode ${n.alive ? "" : "dead"} ${drain ? "draining" : ""}`, "data-testid": "cluster-node", "data-node": n.node_id,
        "data-alive": String(n.alive), "data-drain": drain ? drain.state : "" },
        h("div", { class: "node-head" }, h("strong", {}, `${n.is_head ? "head" : `node ${i}`}`), h("span", { class: "mono muted" }, ` ${n.node_id.slice(0, 8)} ${n.address}`),
          n.alive ? null : h("span", { class: "lost" }, " dead"),
          drain ? h("span", { class: "drain", "data-testid": "node-drain", title: `drained by the admin: no new work; jobs move off by ${fmtTime(drain.deadline_at)}` },
            ` ${drain.state}${drain.state === "draining" ? ` (${drain.gpus_held} GPUs to move, deadline ${fmtTime(drain.deadline_at)})` : ""}`) : null),
        h("div", { class: "gpus" }, gpus.map((g, k) => h("span", { class: `gpu ${g ? "used" : "free"}`, "data-testid": "gpu", "data-job-id": g?.job, "data-tenant": g?.tenant,
          style: g ? `background:${colour(g.tenant ?? g.job)};border-color:${colour(`job${g.job}`)}` : null,
          title: g ? `GPU ${k}: job ${g.job}${g.name ? ` ${g.name}` : ""}${g.tenant ? `, tenant ${g.tenant}` : ""}` : `GPU ${k}: free` }, g ? `j${g.job}` : ""))),
        h("div", { class: "muted small" }, `${n.gpus_used} / ${n.gpus_total} GPUs used`));
    }));
    tenantsEl.replaceChildren(...t.items.map((x) => h("tr", { "data-testid": "tenant-row", "data-tenant": x.name },
      h("td", {}, h("span", { class: "key", style: `background:${colour(x.name)}` }), ` ${x.name}`), h("td", {}, x.gpu_quota),
      h("td", {}, x.gpus_used), h("td", {}, x.gpus_borrowed), h("td", {}, x.weight),
      h("td", {}, Object.entries(x.jobs).map(([k, v]) => `${k} ${v}`).join(", ") || "—"))));
    decisionsEl.replaceChildren(...dec.items.map((x) => h("tr", { "data-testid": "decision-row" }, h("td", {}, fmtTime(x.ts)), h("td", {}, x.tenant),
      h("td", {}, h("a", { href: `/ui/jobs/${x.job_id}`, "data-link": true }, `${x.job} #${x.job_id}`)),
      h("td", {}, `${x.kind}${x.gpus ? ` ${x.gpus} GPUs` : ""} (${x.outcome})`), h("td", {}, x.reason))));
  });
}

route();
