// The API client of the dashboard: same origin, bearer token from sessionStorage (never in a URL).

const KEY = "orthoplex.token";
const ROLE = "orthoplex.role";

export class ApiError extends Error {
  constructor(status, detail) {
    super(typeof detail === "string" ? detail : `HTTP ${status}`);
    this.status = status;
    this.detail = detail;
  }
}

/** The connection to the API failed (server down, network dropped). */
export class ConnectionLost extends Error {}

export const session = {
  token: () => sessionStorage.getItem(KEY),
  role: () => sessionStorage.getItem(ROLE),
  set(token, role) { sessionStorage.setItem(KEY, token); sessionStorage.setItem(ROLE, role); },
  clear() { sessionStorage.removeItem(KEY); sessionStorage.removeItem(ROLE); },
};

const listeners = { unauthorized: [], connection: [] };
export function on(name, fn) { listeners[name].push(fn); }
function emit(name, arg) { for (const fn of listeners[name]) fn(arg); }

/** One request; throws ApiError (HTTP error), ConnectionLost (no answer). */
export async function api(method, path, { body, token, signal } = {}) {
  const headers = { Accept: "application/json" };
  const tok = token ?? session.token();
  if (tok) headers.Authorization = `Bearer ${tok}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let r;
  try {
    r = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body),
      signal, cache: "no-store" });
  } catch (e) {
    if (e.name === "AbortError") throw e;
    emit("connection", false);
    throw new ConnectionLost(String(e));
  }
  emit("connection", true);
  let data = null;
  const text = await r.text();
  if (text) {
    try { data = JSON.parse(text); } catch { data = { detail: text.slice(0, 200) }; }
  }
  if (!r.ok) {
    if (r.status === 401 && token === undefined) emit("unauthorized", data?.detail);
    throw new ApiError(r.status, data?.detail ?? `HTTP ${r.status}`);
  }
  return data;
}

/** Which role a token has: "admin", "tenant", or throws ApiError(401). */
export async function whoami(token) {
  await api("GET", "/v1/dashboard/jobs?limit=1", { token });
  try {
    await api("GET", "/v1/dashboard/tenants", { token });
    return "admin";
  } catch (e) {
    if (e instanceof ApiError && e.status === 403) return "tenant";
    throw e;
  }
}

/** FastAPI's 422 detail as {field: message}; field = the loc after "body", joined with ".". */
export function fieldErrors(detail) {
  const out = {};
  if (!Array.isArray(detail)) return out;
  for (const d of detail) {
    const loc = (d.loc || []).filter((p, i) => !(i === 0 && (p === "body" || p === "query")));
    const key = loc.length ? loc.join(".") : "body";
    out[key] = out[key] ? `${out[key]}; ${d.msg}` : d.msg;
  }
  return out;
}
