// edgerun fleet dashboard. Plain JS, no build step. Every string that came from a device
// (ids, reasons, alert messages, events) is hostile: it is only ever set as textContent,
// never parsed as HTML. The API token lives in this tab's sessionStorage and goes out only
// as an Authorization header (docs/dashboard.md explains why that also stops CSRF).
"use strict";

const TOKEN_KEY = "edgerun-api-token";
const FLEET_POLL_MS = 2000;
const DEVICE_POLL_MS = 3000;

let timer = null;
let serverSkew = 0;  // coordinator clock - browser clock (s), from the Date header
const charts = {};

// -- small helpers ------------------------------------------------------------------------

function $(sel) { return document.querySelector(sel); }

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function num(x) { return typeof x === "number" && isFinite(x) ? x : null; }

function fmt(x, digits) {
  const n = num(x);
  return n === null ? "–" : n.toFixed(digits);
}

function get(obj, ...path) {
  let node = obj;
  for (const k of path) {
    if (node === null || typeof node !== "object") return undefined;
    node = node[k];
  }
  return node;
}

function nowServer() { return Date.now() / 1000 + serverSkew; }

function ago(t) {
  const n = num(t);
  if (!n) return "never";
  const s = Math.max(0, nowServer() - n);
  if (s < 90) return `${s.toFixed(0)} s ago`;
  if (s < 5400) return `${(s / 60).toFixed(0)} min ago`;
  if (s < 129600) return `${(s / 3600).toFixed(1)} h ago`;
  return `${(s / 86400).toFixed(1)} d ago`;
}

function clock(t) {
  const n = num(t);
  return n === null ? "–" : new Date(n * 1000).toLocaleString();
}

// -- API ------------------------------------------------------------------------------------

class Unauthorized extends Error {}

async function api(path, body) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (!token) throw new Unauthorized("no token");
  const init = { headers: { "Authorization": `Bearer ${token}` }, cache: "no-store" };
  if (body !== undefined) {
    init.method = "POST";
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let resp;
  try {
    resp = await fetch(path, init);
  } catch (e) {
    setConn(false, "coordinator unreachable");
    throw e;
  }
  const date = Date.parse(resp.headers.get("Date") || "");
  if (isFinite(date)) serverSkew = date / 1000 - Date.now() / 1000;
  if (resp.status === 401) throw new Unauthorized("token refused");
  let data = null;
  try { data = await resp.json(); } catch (e) { data = { error: `HTTP ${resp.status}` }; }
  setConn(true, "connected");
  if (!resp.ok) {
    const err = new Error((data && data.error) || `HTTP ${resp.status}`);
    err.status = resp.status;
    throw err;
  }
  return data;
}

function setConn(ok, text) {
  const c = $("#conn");
  c.textContent = text;
  c.classList.toggle("bad", !ok);
}

function showLogin(message) {
  sessionStorage.removeItem(TOKEN_KEY);
  stopPolling();
  for (const id of ["#fleet-view", "#device-view"]) $(id).hidden = true;
  $("#login").hidden = false;
  $("#forget").hidden = true;
  $("#login-error").textContent = message || "";
  setConn(false, "not connected");
}

// -- fleet page -------------------------------------------------------------------------------

function statusBadge(status) {
  const s = String(status || "unknown");
  return el("span", s, `status status-${s.replace(/[^a-z]/g, "")}`);
}

function fleetRow(d) {
  const h = d.health || {};
  const tr = el("tr");
  tr.dataset.device = d.device;
  const name = el("td", null, "device");
  const link = el("a", d.device);
  link.href = `#/device/${encodeURIComponent(d.device)}`;
  name.appendChild(link);
  tr.appendChild(name);
  const st = el("td", null, "status-cell");
  st.appendChild(statusBadge(d.status));
  tr.appendChild(st);
  const rung = num(h.rung);
  tr.appendChild(el("td", rung === null ? "–" : `${rung}/${num(h.rungs) ?? "?"}`, "num rung"));
  tr.appendChild(el("td", fmt(h.accuracy, 3), "num accuracy"));
  tr.appendChild(el("td", fmt(get(h, "pipeline", "rate_hz"), 1), "num rate"));
  const temp = num(h.temp_c), trip = num(h.passive_trip_c);
  const tc = el("td", `${fmt(temp, 1)} / ${fmt(trip, 0)}`, "num temp");
  if (temp !== null && trip !== null && temp >= trip - 5) tc.classList.add("hot");
  tr.appendChild(tc);
  const bat = num(h.battery_frac);
  tr.appendChild(el("td", bat === null ? "–" : `${(bat * 100).toFixed(0)} %`, "num battery"));
  tr.appendChild(el("td", fmt(get(h, "backlog", "results_held"), 0), "num backlog"));
  const al = el("td", null, "alerts");
  for (const [code, msg] of d.alerts || []) {
    const a = el("span", code, "alert");
    a.title = msg;
    al.appendChild(a);
  }
  tr.appendChild(al);
  tr.appendChild(el("td", ago(d.last_seen), "last-seen"));
  return tr;
}

async function refreshFleet() {
  const [rows, alerts] = await Promise.all([api("/api/v1/fleet"), api("/api/v1/alerts")]);
  const body = $("#fleet-table tbody");
  body.replaceChildren(...rows.map(fleetRow));
  const online = rows.filter((d) => d.status === "online").length;
  // the coordinator's store stalled or failing: devices are not stored or acked meanwhile
  const store = alerts.store && alerts.store.state !== "ok"
    ? `; store ${alerts.store.state} for ${Math.round(alerts.store.for_s)} s: ${alerts.store.cause}` : "";
  $("#fleet-count").textContent = `${rows.length} devices, ${online} online${store}`;
  renderAlerts(alerts);
}

// An active alert, or one clearing: gone from the device's view but not yet for
// coordinator.alert_clear_s, when the coordinator records it cleared (unless it comes back
// first: then it stays the same alert). Without this row it would be neither here nor in
// the transitions for that long.
function alertRow(a, state) {
  const tr = el("tr", null, state === "clearing" ? "clearing" : null);
  tr.dataset.device = a.device;
  tr.dataset.alert = a.alert;
  tr.dataset.state = state;
  const settles = num(a.settles_at);
  const shown = state === "clearing" && settles !== null
    ? `clearing (settles in ${Math.max(0, settles - nowServer()).toFixed(0)} s)` : state;
  tr.append(el("td", a.device), el("td", a.alert), el("td", a.since ? ago(a.since) : "before start"),
            el("td", shown, "state"), el("td", a.message, "msg"));
  return tr;
}

function renderAlerts(alerts) {
  const active = $("#alerts-active tbody");
  active.replaceChildren(...(alerts.active || []).map((a) => alertRow(a, "active")),
                         ...(alerts.clearing || []).map((a) => alertRow(a, "clearing")));
  const recent = $("#alerts-recent tbody");
  recent.replaceChildren(...(alerts.recent || []).slice(0, 50).map((a) => {
    const tr = el("tr");
    tr.dataset.device = a.device;
    tr.dataset.alert = a.alert;
    tr.append(el("td", clock(a.t)), el("td", a.device), el("td", a.alert),
              el("td", a.state), el("td", a.message, "msg"));
    return tr;
  }));
  const w = alerts.webhook;
  $("#webhook-stats").textContent = w
    ? `webhook ${w.url}: ${w.sent} sent, ${w.retries} retries, ${w.failed} failed, ` +
      `${w.dropped} dropped, ${w.queue} queued${w.last_error ? `; last error: ${w.last_error}` : ""}`
    : "no webhook configured (coordinator.webhook_url)";
}

// -- device page ------------------------------------------------------------------------------

let currentDevice = null;
let historyFor = "";
let historyAt = 0;  // when the timeline was last fetched (ms)

// Time ticks as HH:MM (:SS below two hours), with the date once the window spans days (uPlot's default puts the
// date under the first tick, which overlaps on a narrow chart).
function timeTicks(u, vals) {
  const span = u.scales.x.max - u.scales.x.min;
  return vals.map((v) => {
    const d = new Date(v * 1000);
    const hm = d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit",
                                          ...(span < 7200 ? { second: "2-digit" } : {}) });
    return span > 86400 ? `${d.getMonth() + 1}/${d.getDate()} ${hm}` : hm;
  });
}

function chartOpts(el, series, axes, scales) {
  const width = Math.max(320, el.clientWidth || 540);
  return {
    width, height: 200, series: [{}, ...series],
    axes: [{ values: timeTicks, space: 60 }, ...axes],
    scales: { x: { time: true }, ...(scales || {}) },
    legend: { live: false },
    cursor: { drag: { x: true, y: false } },
  };
}

const stepped = uPlot.paths.stepped({ align: 1 });  // a rung holds until the next one

const CHARTS = {
  temp: {
    el: "#chart-temp",
    cols: (h) => [h.temp_c, h.passive_trip_c],
    series: [
      { label: "die °C", stroke: "#d9480f", width: 2 },
      { label: "passive trip °C", stroke: "#b3261e", dash: [6, 4] },
    ],
    axes: [{ label: "°C" }],
  },
  rung: {
    el: "#chart-rung",
    cols: (h) => [h.rung, h.rungs],
    series: [
      { label: "rung", stroke: "#1f5fbf", width: 2, paths: stepped },
      { label: "rungs", stroke: "#999", dash: [4, 4] },
    ],
    axes: [{ label: "rung", incrs: [1, 2, 5, 10] }],
  },
  latency: {
    el: "#chart-latency",
    cols: (h) => [h.p95_ms, h.target_ms],
    series: [
      { label: "p95 ms", stroke: "#6741d9", width: 2 },
      { label: "target ms", stroke: "#b3261e", dash: [6, 4] },
    ],
    axes: [{ label: "ms" }],
  },
  power: {
    el: "#chart-power",
    cols: (h) => [h.power_w, h.rung_energy_mj],
    series: [
      { label: "power W", stroke: "#2b8a3e", width: 2, scale: "W" },
      { label: "energy/inference mJ", stroke: "#e67700", scale: "mJ" },
    ],
    axes: [{ label: "W", scale: "W" }, { label: "mJ", scale: "mJ", side: 1, grid: { show: false } }],
  },
  battery: {
    el: "#chart-battery",
    cols: (h) => [h.battery_frac.map((x) => (num(x) === null ? null : x * 100)), h.harvest_w],
    series: [
      { label: "battery %", stroke: "#0b7285", width: 2, scale: "%" },
      { label: "harvest W", stroke: "#f08c00", scale: "W" },
    ],
    axes: [{ label: "%", scale: "%" }, { label: "W", scale: "W", side: 1, grid: { show: false } }],
    scales: { "%": { range: [0, 100] } },
  },
};

function drawHistory(h) {
  for (const [name, spec] of Object.entries(CHARTS)) {
    const data = [h.t, ...spec.cols(h)];
    // a device without (say) a battery reports null there: say so instead of empty axes
    const empty = h.t.length > 0 && data.slice(1).every((col) => col.every((x) => num(x) === null));
    $(spec.el).parentElement.classList.toggle("no-data", empty);
    if (charts[name]) {
      charts[name].setData(data);
    } else {
      const host = $(spec.el);
      charts[name] = new uPlot(chartOpts(host, spec.series, spec.axes, spec.scales), data, host);
    }
  }
  $("#history-note").textContent = h.t.length
    ? `${h.t.length} points, one per ${h.bucket_s.toFixed(0)} s (temperature and latency: ` +
      "the highest in each, rung: the lowest)"
    : "no health from this device in this window";
}

function clearCharts() {
  for (const name of Object.keys(charts)) {
    charts[name].destroy();
    delete charts[name];
  }
}

function eventDetail(ev) {
  const skip = new Set(["v", "t", "type", "severity"]);
  return Object.entries(ev).filter(([k]) => !skip.has(k))
    .map(([k, v]) => `${k}=${typeof v === "object" ? JSON.stringify(v) : v}`).join(" ");
}

// The daemon's bytes written a day, its card's (every writer, the journal included) and,
// with [storage] rated_tbw, the card's life at the card's rate (else the daemon's);
// runtime/device/wear.py computes them all, nothing is estimated here.
function bytesText(perDay) {
  const mb = perDay / 1e6;
  return mb >= 1000 ? `${(mb / 1000).toFixed(1)} GB` : `${mb.toFixed(mb < 10 ? 2 : 0)} MB`;
}

function storageText(health) {
  const perDay = num(get(health, "storage", "write_bytes_per_day"));
  if (perDay === null) return "";
  const card = num(get(health, "storage", "card_write_bytes_per_day"));
  const life = num(get(health, "storage", "life_days"));
  const lasts = life === null ? "" : life >= 730 ? `, card lasts ~${(life / 365).toFixed(0)} years`
    : `, card lasts ~${life.toFixed(0)} days`;
  const onCard = card === null ? "" : ` (card ${bytesText(card)}/day)`;
  return `; writes ${bytesText(perDay)}/day${onCard}${lasts}`;
}

async function refreshDevice() {
  const id = currentDevice;
  const path = `/api/v1/devices/${encodeURIComponent(id)}`;
  const windowS = $("#window").value;
  // The timeline changes once per bucket (window / 600): a 7-day view is fetched every
  // 17 minutes, not every poll, so an open tab costs the store little.
  const key = `${id}/${windowS}`;
  const due = historyFor !== key || Date.now() - historyAt >= Math.max(DEVICE_POLL_MS, windowS / 0.6);
  const [d, h] = await Promise.all([
    api(path), due ? api(`${path}/history?window_s=${windowS}`) : Promise.resolve(null)]);
  if (id !== currentDevice) return;
  const health = d.health || {};
  $("#dev-name").textContent = d.device;
  $("#dev-status").replaceChildren(statusBadge(d.status));
  $("#dev-status").dataset.status = d.status;
  $("#dev-summary").textContent =
    `model ${d.model || "–"}, running ${d.choice || "–"}; rung ${health.rung ?? "–"}/` +
    `${health.rungs ?? "–"}; ${fmt(health.temp_c, 1)} °C (trip ${fmt(health.passive_trip_c, 0)}); ` +
    `${fmt(get(health, "pipeline", "rate_hz"), 1)}/s; results stored ${d.results_stored}; ` +
    `last seen ${ago(d.last_seen)}` + (d.reason ? `; ${d.reason}` : "") + storageText(health);
  const alerts = $("#dev-alerts");
  alerts.replaceChildren(...(d.alerts || []).map(([code, msg]) => {
    const p = el("p");
    p.append(el("span", code, "alert"), el("span", ` ${msg}`));
    return p;
  }));
  if (h !== null) {
    if (historyFor !== key) { clearCharts(); historyFor = key; }
    historyAt = Date.now();
    drawHistory(h);
  }
  $("#events tbody").replaceChildren(...(d.events || []).map((ev) => {
    const tr = el("tr");
    tr.append(el("td", clock(ev.t)), el("td", ev.type), el("td", ev.severity || ""),
              el("td", eventDetail(ev), "msg"));
    return tr;
  }));
}

function commandArgs(cmd) {
  if (cmd === "set_rate") return { fps: Number($("#arg-fps").value) };
  if (cmd === "set_latency_target") return { ms: Number($("#arg-ms").value) };
  return {};
}

async function sendCommand(button) {
  const cmd = button.dataset.cmd;
  const out = $("#cmd-result");
  const buttons = document.querySelectorAll("button[data-cmd]");
  buttons.forEach((b) => { b.disabled = true; });
  out.className = "cmd-result";
  out.textContent = `${cmd}: sent, waiting for the device…`;
  try {
    const reply = await api(`/api/v1/devices/${encodeURIComponent(currentDevice)}/commands`,
                            { cmd, args: commandArgs(cmd), wait_s: 10 });
    out.className = `cmd-result ${reply.ok ? "ok" : "bad"}`;
    out.dataset.status = reply.status;
    out.textContent = `${cmd}: ${reply.status}` + (reply.reason ? ` — ${reply.reason}` : "") +
      (reply.verified ? " (reply signed by the device)" : "");
  } catch (e) {
    if (e instanceof Unauthorized) return showLogin(e.message);
    out.className = "cmd-result bad";
    // 400: the coordinator refused it before signing, by the schema every device holds
    out.dataset.status = e.status === 400 ? "refused" : "error";
    out.textContent = e.status === 400 ? `${cmd}: refused by the coordinator — ${e.message}`
      : `${cmd}: ${e.message}`;
  } finally {
    buttons.forEach((b) => { b.disabled = false; });
  }
}

// -- routing and polling ----------------------------------------------------------------------

function stopPolling() {
  if (timer !== null) clearTimeout(timer);
  timer = null;
}

function poll(fn, every) {
  stopPolling();
  const tick = async () => {
    try {
      await fn();
    } catch (e) {
      if (e instanceof Unauthorized) return showLogin(e.message);
      if (e.status === 404) setConn(true, e.message);
      else setConn(false, e.message || "error");
    }
    timer = setTimeout(tick, every);
  };
  tick();
}

function route() {
  if (!sessionStorage.getItem(TOKEN_KEY)) return showLogin("");
  $("#login").hidden = true;
  $("#forget").hidden = false;
  const m = location.hash.match(/^#\/device\/(.+)$/);
  if (m) {
    currentDevice = decodeURIComponent(m[1]);
    $("#fleet-view").hidden = true;
    $("#device-view").hidden = false;
    $("#cmd-result").textContent = "";
    clearCharts();
    historyFor = "";
    poll(refreshDevice, DEVICE_POLL_MS);
  } else {
    currentDevice = null;
    clearCharts();
    $("#device-view").hidden = true;
    $("#fleet-view").hidden = false;
    poll(refreshFleet, FLEET_POLL_MS);
  }
}

$("#login-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const token = $("#token").value.trim();
  if (!token) return;
  sessionStorage.setItem(TOKEN_KEY, token);
  $("#token").value = "";
  route();
});
$("#forget").addEventListener("click", () => showLogin("token forgotten"));
$("#window").addEventListener("change", () => { if (currentDevice) route(); });
document.querySelectorAll("button[data-cmd]").forEach((b) => {
  b.addEventListener("click", () => sendCommand(b));
});
window.addEventListener("hashchange", route);
route();
