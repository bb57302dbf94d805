// The infer dashboard: polls the gateway's JSON (/infer/routes, /infer/series, /infer/cost,
// /infer/keys, /infer/requests, and /infer/backends where /infer/dashboard says it exists) and draws it. Every number shown carries data-k="<panel>.<name>.<field>"
// so tests can compare it with the JSON. ?window=15m&refresh=5 preset the controls.
"use strict";

const $ = id => document.getElementById(id);
const params = new URLSearchParams(location.search);
const state = {key: sessionStorage.getItem("infer-key") || "", timer: null, routes: []};

const fmt = {
  pct: v => v === null || v === undefined ? "—" : (100 * v).toFixed(1) + "%",
  ms: v => v === null || v === undefined ? "—" : v.toFixed(1),
  rate: v => v === null || v === undefined ? "—" : v.toFixed(3),
  usd: v => v === null || v === undefined ? "—" : v.toFixed(6),
  mtok: v => v === null || v === undefined ? "—" : v.toFixed(4),
  int: v => v === null || v === undefined ? "—" : String(v),
};

class Unauthorized extends Error {}
class Forbidden extends Error {}

// A view this key may not read (the cost report needs an operator key): null instead of a failed refresh.
async function getOptional(path) {
  try {
    return await getJSON(path);
  } catch (error) {
    if (error instanceof Forbidden) return null;
    throw error;
  }
}

async function getJSON(path) {
  const headers = state.key ? {Authorization: "Bearer " + state.key} : {};
  const answer = await fetch(path, {headers, cache: "no-store"});
  if (answer.status === 401) throw new Unauthorized((await answer.json()).error?.message || "API key needed");
  if (answer.status === 403) throw new Forbidden(`${path}: this key may not read it`);
  if (!answer.ok) throw new Error(`${path}: HTTP ${answer.status}`);
  return answer.json();
}

function cell(text, key, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (key) td.dataset.k = key;
  if (cls) td.className = cls;
  return td;
}

function pill(text, key) {
  const td = cell("", key);
  const span = Object.assign(document.createElement("span"), {className: "pill " + text, textContent: text});
  td.append(span);
  return td;
}

function row(cells) {
  const tr = document.createElement("tr");
  tr.append(...cells);
  return tr;
}

function setOptions(select, values, keepFirst) {
  const current = select.value;
  const first = keepFirst ? [select.options[0]] : [];
  select.replaceChildren(...first, ...values.map(v => Object.assign(document.createElement("option"), {value: v, textContent: v})));
  if ([...select.options].some(o => o.value === current)) select.value = current;
}

// -- routes ---------------------------------------------------------------------------------------

function routeTile(route, windowTotals) {
  const tile = document.createElement("div");
  tile.className = "tile";
  tile.dataset.route = route.name;
  const k = f => `route.${route.name}.${f}`;
  const target = route.slo.target;
  const att = route.attainment;
  const cls = att === null ? "" : att >= target ? "good" : att >= target - 0.1 ? "warn" : "bad";
  const slo = ["ttft_ms", "tpot_ms", "e2e_ms"].filter(p => route.slo[p] !== null)
    .map(p => `${p.replace("_ms", "").toUpperCase()} ≤ ${route.slo[p]} ms`).join(", ") || "no latency SLO";
  tile.innerHTML = `<h4><span>${escapeHtml(route.name)}</span><small class="muted">${escapeHtml(route.strategy)}</small></h4>
    <div class="muted">${escapeHtml(slo)} · target ${fmt.pct(target)} · window ${route.slo.window_s} s</div>
    <div><span class="big ${cls}" data-k="${k("attainment")}">${fmt.pct(att)}</span> <span class="muted">attainment</span></div>
    <div class="meter"><i></i><b></b></div>
    <dl>
      <dt>goodput (req/s)</dt><dd data-k="${k("goodput_rps")}">${fmt.rate(route.goodput_rps)}</dd>
      <dt>requests</dt><dd data-k="${k("requests")}">${route.requests}</dd>
      <dt>good</dt><dd data-k="${k("good")}">${route.good}</dd>
      <dt>shed</dt><dd data-k="${k("shed")}">${route.shed}</dd>
      <dt>errors</dt><dd data-k="${k("errors")}">${route.errors}</dd>
      <dt>TTFT p95 (ms)</dt><dd data-k="${k("ttft_p95")}">${fmt.ms(route.ttft.p95)}</dd>
      <dt>attainment, selected window</dt><dd data-k="${k("window_attainment")}">${fmt.pct(windowTotals?.attainment ?? null)}</dd>
      <dt>requests, selected window</dt><dd data-k="${k("window_requests")}">${windowTotals ? windowTotals.requests : "—"}</dd>
    </dl>`;
  const bar = tile.querySelector(".meter > i");
  bar.style.width = `${att === null ? 0 : 100 * att}%`;
  bar.style.background = `var(--${cls || "good"})`;
  tile.querySelector(".meter > b").style.left = `${100 * target}%`;
  return tile;
}

function escapeHtml(text) {
  return String(text).replace(/[&<>"']/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
}

// One row per route member (the route's view: breaker, queued, predictions), merged with the
// backend's own health and load from /infer/backends where the server has it; backends that serve
// no route get a row of their own. Absent fields show "—".
function renderBackends(routes, monitor) {
  const health = new Map((monitor || []).map(b => [b.name, b]));
  const rows = routes.flatMap(route => route.backends.map(b => backendRow(route.name, b, health.get(b.name) || {})));
  const members = new Set(routes.flatMap(r => r.backends.map(b => b.name)));
  for (const b of monitor || []) if (!members.has(b.name)) rows.push(backendRow("—", {name: b.name}, b));
  const body = $("backends").tBodies[0];
  body.replaceChildren(...rows);
  if (!body.rows.length) body.append(row([cell("no routes configured (routes: in the config file)")]));
}

function backendRow(routeName, b, h) {
  const k = f => `backend.${routeName}.${b.name}.${f}`;
  const up = h.up ?? b.up ?? null;
  const num = v => v === null || v === undefined ? "—" : String(+(+v).toFixed(2));
  return row([cell(routeName), cell(b.name, k("name")), pill(up === null ? "unknown" : up ? "up" : "down", k("up")),
    pill(b.breaker ?? "—", k("breaker")), cell(fmt.int(b.in_flight ?? h.in_flight), k("in_flight")),
    cell(fmt.int(b.queued), k("queued")), cell(num(h.requests_running), k("running")),
    cell(num(h.requests_waiting ?? b.reported_waiting), k("waiting")), cell(fmt.pct(h.kv_cache_usage ?? null), k("kv_cache")),
    cell(fmt.pct(b.cache_hit_ratio ?? null), k("cache_hit_ratio")),
    cell(fmt.ms(b.predicted_ttft_ms), k("predicted_ttft_ms")), cell(fmt.ms(b.ttft?.p50 ?? null), k("ttft_p50")),
    cell(fmt.pct(b.prediction_error ?? null), k("prediction_error")),
    cell(fmt.ms(b.predicted_tpot_ms), k("predicted_tpot_ms")), cell(fmt.ms(b.tpot?.p50 ?? null), k("tpot_p50")),
    cell(fmt.pct(b.tpot_prediction_error ?? null), k("tpot_prediction_error"))]);
}

// -- latency and traffic --------------------------------------------------------------------------

function renderSeries(series, route) {
  const buckets = series.buckets;
  const line = (metric, q) => buckets.map(b => [b.t + series.step_s / 2, b[metric][q]]);
  const slo = route ? route.slo : {};
  for (const [metric, sloField] of [["ttft", "ttft_ms"], ["tpot", "tpot_ms"], ["e2e", "e2e_ms"]]) {
    InferCharts.lineChart($("chart-" + metric), {
      series: ["p50", "p95", "p99"].map(q => ({name: q, points: line(metric, q)})),
      hlines: slo[sloField] ? [{name: "SLO", value: slo[sloField]}] : [], unit: "ms"});
  }
  InferCharts.lineChart($("chart-traffic"), {unit: "/s", series: [
    {name: "requests", points: buckets.map(b => [b.t + series.step_s / 2, b.requests_per_s])},
    {name: "shed", points: buckets.map(b => [b.t + series.step_s / 2, b.shed_per_s])},
    {name: "errors", points: buckets.map(b => [b.t + series.step_s / 2, b.errors_per_s])},
    {name: "goodput", points: buckets.map(b => [b.t + series.step_s / 2, b.goodput_rps]), dash: true}]});
}

function renderSpend(series) {
  let total = 0;
  const points = series.buckets.map(b => [b.t + series.step_s, total += b.spend_usd]);
  InferCharts.lineChart($("chart-spend"), {series: [{name: "spend $", points}], unit: "$"});
  $("chart-spend").dataset.total = total;
}

// -- cost, keys, requests -------------------------------------------------------------------------

function renderCost(cost) {
  if (cost === null) {
    $("cost").tBodies[0].replaceChildren(row([cell("the cost report covers every key: sign in with an operator key (INFER_API_KEYS)")]));
    InferCharts.barChart($("chart-price"), {keys: ["input $/Mtok", "output $/Mtok"], format: fmt.mtok, groups: []});
    return;
  }
  const groups = cost.groups;
  $("cost").tBodies[0].replaceChildren(...groups.map(g => {
    const k = f => `cost.${g.key}.${f}`;
    return row([cell(g.key, k("key")), cell(fmt.int(g.requests), k("requests")), cell(fmt.int(g.input_tokens), k("input_tokens")),
      cell(fmt.int(g.cached_input_tokens), k("cached_input_tokens")),
      cell(fmt.int(g.output_tokens), k("output_tokens")), cell(fmt.mtok(g.usd_per_mtok_input), k("usd_per_mtok_input")),
      cell(fmt.mtok(g.usd_per_mtok_output), k("usd_per_mtok_output")), cell(fmt.usd(g.cached_input_cost_usd), k("cached_input_cost_usd")),
      cell(fmt.usd(g.total_cost_usd), k("total_cost_usd"))]);
  }));
  const priced = groups.filter(g => g.priced_requests > 0);
  InferCharts.barChart($("chart-price"), {keys: ["input $/Mtok", "output $/Mtok"], format: fmt.mtok,
    groups: priced.map(g => ({name: g.key, values: [g.usd_per_mtok_input, g.usd_per_mtok_output]}))});
}

function renderKeys(keys) {
  const body = $("keys").tBodies[0];
  body.replaceChildren(...keys.keys.map(key => {
    const k = f => `key.${key.name}.${f}`;
    const meter = cell("");
    if (key.budget_used !== null) {
      meter.innerHTML = `<div class="meter budget"><i></i></div>`;
      const bar = meter.querySelector("i");
      bar.style.width = `${Math.min(100, 100 * key.budget_used)}%`;
      if (key.budget_used > 0.9) bar.style.background = "var(--bad)";
    }
    return row([cell(key.name + (key.revoked ? " (revoked)" : ""), k("name")), cell(fmt.usd(key.budget_usd), k("budget_usd")),
      cell(fmt.usd(key.spent_usd), k("spent_usd")), cell(fmt.usd(key.reserved_usd), k("reserved_usd")),
      cell(fmt.pct(key.budget_used), k("budget_used")), meter, cell(fmt.int(key.requests), k("requests")),
      cell(fmt.usd(key.spend_usd), k("spend_usd"))]);
  }));
  if (!body.rows.length) body.append(row([cell("no API keys (infer keys create NAME)")]));
}

function renderRequests(page) {
  const body = $("requests").tBodies[0];
  body.replaceChildren(...page.requests.map(r => {
    const k = f => `request.${r.id}.${f}`;
    const tr = row([cell(new Date(r.at * 1000).toLocaleTimeString(), k("time")), cell(r.route_name || r.route, k("route")),
      cell(r.backend, k("backend")), pill(r.status, k("status")), cell(fmt.int(r.input_tokens), k("input_tokens")),
      cell(fmt.int(r.cached_input_tokens), k("cached_input_tokens")),
      cell(fmt.int(r.output_tokens), k("output_tokens")), cell(fmt.ms(r.ttft_ms), k("ttft_ms")), cell(fmt.ms(r.tpot_ms), k("tpot_ms")),
      cell(fmt.usd(r.total_cost_usd), k("total_cost_usd")),
      cell(r.slo_met === null ? "—" : r.slo_met ? "met" : "missed " + (r.slo_missed || ""), k("slo"))]);
    tr.dataset.id = r.id;
    if (r.error) tr.title = r.error;
    return tr;
  }));
}

// -- the refresh loop -----------------------------------------------------------------------------

function query(extra) {
  const q = new URLSearchParams({since: $("window").value, ...extra});
  for (const [name, value] of [...q]) if (value === "") q.delete(name);
  return q.toString();
}

async function refresh() {
  try {
    const routes = (await getJSON("/infer/routes")).routes;
    state.routes = routes;
    setOptions($("series-route"), ["(all requests)", ...routes.map(r => r.name)], false);
    const chosen = routes.find(r => r.name === $("series-route").value) || null;
    const filters = {route: $("f-route").value, backend: $("f-backend").value, status: $("f-status").value,
                     limit: $("f-limit").value};
    state.views = state.views || (await getJSON("/infer/dashboard")).views;
    const [all, cost, keys, recent, monitor] = await Promise.all([
      getJSON("/infer/series?" + query({by: "route"})),
      getOptional("/infer/cost?" + query({by: "backend"})),
      getJSON("/infer/keys?" + query()),
      getJSON("/infer/requests?" + query(filters)),
      state.views.backends ? getJSON("/infer/backends") : null]);
    const perRoute = routes.map(r => all.routes[r.name]);  // every configured route, rows or not
    $("routes").replaceChildren(...routes.map((r, i) => routeTile(r, perRoute[i].totals)));
    if (!routes.length) $("routes").textContent = "no routes configured (routes: in the config file)";
    renderBackends(routes, monitor?.backends);
    renderSeries(chosen ? perRoute[routes.indexOf(chosen)] : all, chosen);
    renderSpend(all);
    renderCost(cost);
    renderKeys(keys);
    renderRequests(recent);
    setOptions($("f-route"), [...new Set([...routes.map(r => r.name), ...recent.requests.map(r => r.route_name || r.route)])], true);
    setOptions($("f-backend"), [...new Set([...routes.flatMap(r => r.backends.map(b => b.name)), ...(cost?.groups || []).map(g => g.key)])], true);
    $("key-form").hidden = true;
    $("main").hidden = false;
    $("status").textContent = "updated " + new Date().toLocaleTimeString();
    document.body.dataset.loaded = String(Date.now());
  } catch (error) {
    if (error instanceof Unauthorized) {
      $("key-form").hidden = false;
      $("key-error").textContent = state.key ? error.message : "";
      $("main").hidden = true;
    }
    $("status").textContent = "update failed: " + error.message;
  }
}

function schedule() {
  clearInterval(state.timer);
  const every = Number($("refresh").value);
  if (every > 0) state.timer = setInterval(refresh, every * 1000);
}

function init() {
  if (params.get("window")) $("window").value = params.get("window");
  if (params.get("refresh") !== null) $("refresh").value = params.get("refresh");
  for (const id of ["window", "series-route", "f-route", "f-backend", "f-status", "f-limit"]) $(id).addEventListener("change", refresh);
  $("refresh").addEventListener("change", schedule);
  $("refresh-now").addEventListener("click", refresh);
  $("key-form").addEventListener("submit", event => {
    event.preventDefault();
    state.key = $("key").value.trim();
    sessionStorage.setItem("infer-key", state.key);
    refresh();
  });
  refresh();
  schedule();
}

document.addEventListener("DOMContentLoaded", init);
