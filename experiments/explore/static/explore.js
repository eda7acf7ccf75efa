/* ferry explore: move a knob, re-run the simulation on the server, redraw the ferry.
 *
 * The page asks /api/options once for its controls, words and metrics, then /api/run for every change of settings
 * (the page URL's query string is the run's). It keeps the last two runs and draws them on one shared time axis:
 * the previous run's timeline (before), the current one (after) and the current run's seats (the ferry), with the
 * metrics of both. Every string from the server goes in through textContent, never as markup.
 */
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
const KINDS = ["waiting", "prefill", "prefill_chunk", "decode", "stalled", "held"];
const MARGIN = { left: 66, right: 14 }; // the same for every chart, so their time axes line up
const STRIP = 14; // px: the GPU-idle strip above a timeline
const AXIS = 30; // px: the time axis below a chart
const DEBOUNCE_MS = 200; // typing waits this long for a pause before it runs

const page = {
  lang: "en",
  options: null, // the /api/options answer
  words: {},
  controls: new Map(), // setting key -> {spec, input, wrapper, shown}
  runs: [], // the last two runs drawn, oldest first
  view: null, // [start_ms, end_ms] on screen; null: all of both runs
  inFlight: null, // the AbortController of the run being fetched
  lastQuery: null, // the query last asked for (so the same one is not asked twice)
  debounce: 0,
  frame: 0,
  drag: null,
};

/* ---------- small helpers ---------- */

const $ = (id) => document.getElementById(id);
const clamp = (v, lo, hi) => Math.min(hi, Math.max(lo, v));
const word = (key) => (page.words[key] != null ? String(page.words[key]) : key.replace(/_/g, " "));
const fill = (template, values) => template.replace(/\{(\w+)\}/g, (m, k) => (k in values ? String(values[k]) : m));
/* "seat 3", "request 7": the server's numbered word (seat_n, request_n, iteration_n), else the word and the value */
const named = (key, v) => (page.words[`${key}_n`] ? fill(word(`${key}_n`), { n: v, id: v }) : `${word(key)} ${v}`);

function html(tag, attrs = {}, text = null) {
  const node = document.createElement(tag);
  for (const k in attrs) node.setAttribute(k, attrs[k]);
  if (text != null) node.textContent = text;
  return node;
}

function svg(tag, attrs, parent) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const k in attrs) node.setAttribute(k, attrs[k]);
  if (parent) parent.appendChild(node);
  return node;
}

const formats = new Map(); // digits -> Intl.NumberFormat (one per call is slow with thousands of boxes)
function number(v, digits) {
  if (!formats.has(digits)) {
    const opts = { minimumFractionDigits: digits, maximumFractionDigits: digits };
    formats.set(digits, new Intl.NumberFormat(page.lang === "ko" ? "ko-KR" : "en-US", opts));
  }
  return formats.get(digits).format(v);
}

const ms = (v) => number(v, Math.abs(v) >= 100 ? 0 : 1);

/* ---------- start: options, controls, first run ---------- */

async function start() {
  const params = new URLSearchParams(location.search);
  page.lang = params.get("lang") || "en";
  document.documentElement.lang = page.lang;
  try {
    const res = await fetch(`/api/options?lang=${encodeURIComponent(page.lang)}`);
    const body = await res.json().catch(() => null);
    if (!res.ok || !body || !body.controls) {
      throw new Error(body && body.error ? body.error.message : `/api/options: ${res.status} ${res.statusText}`);
    }
    page.options = body;
  } catch (err) {
    $("error-general").textContent = String(err.message || err);
    document.body.dataset.error = "general";
    return;
  }
  page.words = page.options.words || {};
  // Hangul (the Korean page, and the language switch on the English one) from the server's own font: loaded before
  // any text is laid out, since text drawn while it was still loading can keep its empty boxes
  await Promise.all(["400", "700"].map((w) => document.fonts.load(`${w} 13px "ferry Hangul"`, "한국어"))).catch(() => {});
  buildFrame();
  buildControls(params);
  buildLegend();
  buildMetricsTable();
  wireCharts();
  window.addEventListener("resize", scheduleDraw);
  run();
}

/* the page's fixed words: heading, buttons, column heads */
function buildFrame() {
  const title = page.options.title || "ferry explore";
  document.title = title;
  const text = {
    heading: title, busy: word("busy"), "reset-zoom": word("reset_zoom"), link: word("link"),
    "zoom-hint": page.words.zoom_hint || "", "title-metrics": word("metrics"), "col-metric": page.words.metric || "",
    "col-before": word("before"), "col-after": word("after"), "col-change": page.words.change || "±",
    point: page.options.point || "", "lang-switch": page.lang === "ko" ? "English" : "한국어",
  };
  for (const id in text) $(id).textContent = text[id];
  $("point").hidden = !page.options.point;
  $("lang-switch").hidden = false;
  $("reset-zoom").addEventListener("click", () => setView(null));
  $("link").addEventListener("click", showLink);
}

/* one fieldset per group, one labelled control per setting (its element id is the setting key) */
function buildControls(params) {
  const specs = page.options.controls;
  const byKey = new Map(specs.map((c) => [c.key, c]));
  const groups = (page.options.groups || []).slice();
  const grouped = new Set(groups.flatMap((g) => g.keys));
  const rest = specs.filter((c) => !grouped.has(c.key)).map((c) => c.key);
  if (rest.length) groups.push({ label: "", keys: rest });
  for (const group of groups) {
    const set = html("fieldset");
    if (group.label) set.appendChild(html("legend", {}, group.label));
    for (const key of group.keys.filter((k) => byKey.has(k))) {
      set.appendChild(makeControl(byKey.get(key), params.has(key) ? params.get(key) : page.options.defaults[key]));
    }
    $("controls").appendChild(set);
  }
  $("controls").addEventListener("submit", (ev) => ev.preventDefault());
  markUnused();
}

function makeControl(spec, value) {
  const wrapper = html("div", { class: `control ${spec.kind}`, id: `control-${spec.key}` });
  const label = html("label", { for: spec.key });
  const input = makeInput(spec);
  if (spec.kind === "checkbox") {
    label.append(input, document.createTextNode(spec.label || spec.key));
    wrapper.appendChild(label);
  } else {
    const row = html("div", { class: "row" });
    label.textContent = spec.label || spec.key;
    row.appendChild(input);
    if (spec.kind === "range") row.appendChild(html("output", { class: "value", id: `value-${spec.key}` }));
    if (spec.unit) row.appendChild(html("span", { class: "unit" }, spec.unit));
    wrapper.append(label, row);
  }
  if (spec.help) wrapper.appendChild(html("div", { class: "help", id: `help-${spec.key}` }, spec.help));
  wrapper.appendChild(html("div", { class: "error", id: `error-${spec.key}`, role: "alert" }));
  input.setAttribute("aria-describedby", `${spec.help ? `help-${spec.key} ` : ""}error-${spec.key}`);
  page.controls.set(spec.key, { spec, input, wrapper, shown: wrapper.querySelector("output") });
  writeValue(spec.key, value);
  // typing (or holding a slider) waits for a pause; a finished change (select, checkbox, release) runs at once
  if (spec.kind !== "select" && spec.kind !== "checkbox") input.addEventListener("input", () => changed(false));
  input.addEventListener("change", () => changed(true));
  return wrapper;
}

function makeInput(spec) {
  const attrs = { id: spec.key, name: spec.key };
  if (spec.kind === "select") {
    const select = html("select", attrs);
    for (const c of spec.choices || []) select.appendChild(html("option", { value: String(c.value) }, c.label));
    return select;
  }
  for (const k of ["min", "max", "step"]) if (spec[k] != null) attrs[k] = String(spec[k]);
  attrs.type = { checkbox: "checkbox", number: "number", range: "range" }[spec.kind] || "text";
  return html("input", attrs);
}

function writeValue(key, value) {
  const { spec, input } = page.controls.get(key);
  if (spec.kind === "checkbox") {
    input.checked = ["true", "1", "on", "yes"].includes(String(value).toLowerCase());
    return;
  }
  const text = value == null ? "" : String(value);
  if (spec.kind === "select" && ![...input.options].some((o) => o.value === text)) {
    input.appendChild(html("option", { value: text }, text)); // not a choice (from the URL): the server says why
  }
  if (spec.kind === "range" && input.max !== "" && Number(text) > Number(input.max)) input.max = text;
  input.value = text;
  showRange(key);
}

/* a slider's value, written beside it */
function showRange(key) {
  const { input, shown } = page.controls.get(key);
  if (shown) shown.textContent = input.value;
}

function readValue(key) {
  const { spec, input } = page.controls.get(key);
  return spec.kind === "checkbox" ? String(input.checked) : input.value;
}

function isDefault(key, value) {
  const d = page.options.defaults[key];
  if (d == null) return value === "";
  if (typeof d === "number") return value.trim() !== "" && Number(value) === d;
  return String(d) === value;
}

/* what decides which controls count: the policy, and where the requests come from */
function current() {
  const pick = (key) => (page.controls.has(key) ? readValue(key) : String(page.options.defaults[key]));
  return { policy: pick("policy"), workload: pick("workload") };
}

const isUsed = (spec, now) =>
  (!spec.read_by || spec.read_by.includes(now.policy)) && (!spec.when_workload || spec.when_workload === now.workload);

/* a control the current policy (or workload) does not read is disabled, dimmed and not sent */
function markUnused() {
  const now = current();
  for (const { spec, input, wrapper } of page.controls.values()) {
    const unused = !isUsed(spec, now);
    input.disabled = unused;
    wrapper.classList.toggle("unused", unused);
    input.classList.toggle("unused", unused);
  }
}

/* the settings that differ from the defaults (and lang unless English), in control order */
function buildQuery() {
  const query = new URLSearchParams();
  const now = current();
  for (const [key, { spec }] of page.controls) {
    const value = readValue(key);
    if (isUsed(spec, now) && !isDefault(key, value)) query.set(key, value);
  }
  if (page.lang !== "en") query.set("lang", page.lang);
  return query.toString().replace(/%3A/gi, ":").replace(/%2C/gi, ","); // legal in a query, and easier to read
}

/* ---------- running: one fetch at a time, the newest wins ---------- */

function changed(now) {
  markUnused();
  for (const key of page.controls.keys()) showRange(key);
  updateUrl(buildQuery());
  clearTimeout(page.debounce);
  if (now) run();
  else page.debounce = setTimeout(run, DEBOUNCE_MS);
}

function updateUrl(query) {
  history.replaceState(null, "", query ? `${location.pathname}?${query}` : location.pathname);
  if (!$("link-url").hidden) $("link-url").value = location.href;
  const other = new URLSearchParams(query);
  if (page.lang === "ko") other.delete("lang");
  else other.set("lang", "ko");
  $("lang-switch").setAttribute("href", `${location.pathname}?${other}`);
}

async function run() {
  clearTimeout(page.debounce);
  const query = buildQuery();
  updateUrl(query);
  if (query === page.lastQuery) return;
  if (page.inFlight) page.inFlight.abort();
  const ctl = new AbortController();
  page.inFlight = ctl;
  page.lastQuery = query;
  document.body.dataset.busy = "1";
  try {
    const res = await fetch(`/api/run?${query}`, { signal: ctl.signal });
    const body = await res.json().catch(() => null);
    if (ctl !== page.inFlight) return;
    if (res.ok && body && Array.isArray(body.spans)) accept(body);
    else if (body && body.error) failed(body.error.field, body.error.message);
    else failed(null, `/api/run: ${res.status} ${res.statusText}`);
  } catch (err) {
    if (err.name !== "AbortError" && ctl === page.inFlight) failed(null, `/api/run: ${err.message || err}`);
  } finally {
    if (ctl === page.inFlight) {
      page.inFlight = null;
      document.body.dataset.busy = "0";
    }
  }
}

/* a run came back: it becomes "after", the one drawn before it "before" */
function accept(result) {
  clearErrors();
  page.runs = [...page.runs.slice(-1), result];
  drawCharts();
  drawMetrics();
  drawChanges();
  drawNotes();
  document.body.dataset.busy = "0";
  document.body.dataset.runs = String(Number(document.body.dataset.runs || 0) + 1);
}

/* the server said no (422) or did not answer: say so beside the control, keep the last drawing */
function failed(field, message) {
  clearErrors();
  page.lastQuery = null; // the same settings may be asked for again
  const entry = field ? page.controls.get(field) : null;
  $(entry ? `error-${field}` : "error-general").textContent = message || "error";
  if (entry) {
    entry.input.setAttribute("aria-invalid", "true");
    entry.wrapper.classList.add("has-error");
  }
  document.body.dataset.error = field || "general";
}

function clearErrors() {
  $("error-general").textContent = "";
  for (const [key, { input, wrapper }] of page.controls) {
    $(`error-${key}`).textContent = "";
    input.removeAttribute("aria-invalid");
    wrapper.classList.remove("has-error");
  }
  delete document.body.dataset.error;
}

/* show the page's address (its query holds the settings) and copy it where the browser allows */
function showLink() {
  const box = $("link-url");
  box.hidden = false;
  box.value = location.href;
  box.select();
  if (!navigator.clipboard || !page.words.copied) return;
  navigator.clipboard.writeText(location.href).then(() => {
    $("link").textContent = word("copied");
    setTimeout(() => { $("link").textContent = word("link"); }, 1500);
  }, () => {});
}

/* ---------- the shared time axis: zoom and pan ---------- */

/* all the time both runs cover */
function fullDomain() {
  let end = 0;
  for (const r of page.runs) {
    end = Math.max(end, r.end_ms || 0);
    for (const s of r.spans) end = Math.max(end, s.end_ms);
    for (const q of r.requests) end = Math.max(end, q.arrival_ms || 0);
  }
  return [0, end > 0 ? end * 1.01 : 1];
}

/* x: ms on screen -> px in a chart `width` wide */
function scaleFor(width) {
  const [x0, x1] = page.view || fullDomain();
  const plot = Math.max(10, width - MARGIN.left - MARGIN.right);
  const px = (t) => MARGIN.left + ((t - x0) / (x1 - x0)) * plot;
  return { x0, x1, left: MARGIN.left, right: MARGIN.left + plot, plot, px };
}

function setView(view) {
  if (view) {
    const [f0, f1] = fullDomain();
    const span = clamp(view[1] - view[0], (f1 - f0) / 5000, f1 - f0);
    const start = clamp(view[0], f0, f1 - span);
    view = span >= f1 - f0 ? null : [start, start + span];
  }
  page.view = view;
  scheduleDraw();
}

function scheduleDraw() {
  if (!page.frame) page.frame = requestAnimationFrame(() => { page.frame = 0; drawCharts(); });
}

/* on every chart: the wheel zooms around the pointer, a drag pans, hovering a box shows the tooltip */
function wireCharts() {
  const on = { wheel: onWheel, pointerdown: onDragStart, pointermove: onPointerMove, pointerup: onDragEnd,
    pointercancel: onDragEnd, pointerleave: hideTip };
  for (const id of ["timeline-before", "timeline", "seats"]) {
    for (const name in on) $(id).addEventListener(name, on[name], { passive: name !== "wheel" });
  }
}

function onWheel(ev) {
  if (!page.runs.length) return;
  ev.preventDefault();
  const rect = ev.currentTarget.getBoundingClientRect();
  const x = scaleFor(rect.width);
  const frac = clamp((ev.clientX - rect.left - x.left) / x.plot, 0, 1);
  const at = x.x0 + frac * (x.x1 - x.x0);
  const span = (x.x1 - x.x0) * Math.exp(ev.deltaY * (ev.deltaMode === 1 ? 16 : 1) * 0.0015);
  setView([at - frac * span, at + (1 - frac) * span]);
}

function onDragStart(ev) {
  if (ev.button !== 0 || !page.runs.length) return;
  const x = scaleFor(ev.currentTarget.getBoundingClientRect().width);
  page.drag = { from: ev.clientX, view: [x.x0, x.x1], msPerPx: (x.x1 - x.x0) / x.plot, moved: false };
  ev.currentTarget.setPointerCapture(ev.pointerId);
}

function onPointerMove(ev) {
  const drag = page.drag;
  if (!drag) return showTip(ev);
  const dx = ev.clientX - drag.from;
  if (!drag.moved && Math.abs(dx) < 3) return;
  drag.moved = true;
  ev.currentTarget.classList.add("dragging");
  hideTip();
  setView([drag.view[0] - dx * drag.msPerPx, drag.view[1] - dx * drag.msPerPx]);
}

function onDragEnd(ev) {
  page.drag = null;
  ev.currentTarget.classList.remove("dragging");
}

/* ---------- tooltip: what the box under the pointer is ---------- */

function showTip(ev) {
  const box = ev.target.closest && ev.target.closest("[data-request]");
  if (!box) return hideTip();
  const d = box.dataset;
  const tip = $("tooltip");
  tip.replaceChildren(html("div", { class: "tip-head" }, named("request", d.request)));
  const row = (text) => tip.appendChild(html("div", { class: "tip-row" }, text));
  if (d.phase === "rejected") {
    row(`${word("rejected")}: ${d.reason || ""}`);
    row(`${word("arrival")}: ${ms(Number(d.start))} ms`);
  } else {
    row(word(d.phase));
    if (Number(d.iteration) > 0) row(named("iteration", d.iteration));
    if (Number(d.tokens) > 0) row(`${word("tokens")}: ${d.tokens}`);
    if (d.seat !== "") row(named("seat", d.seat));
    const start = Number(d.start), end = Number(d.end);
    row(`${ms(start)} – ${ms(end)} ms (${ms(end - start)} ms)`);
  }
  tip.hidden = false;
  const w = tip.offsetWidth, h = tip.offsetHeight;
  tip.style.left = `${Math.min(ev.clientX + 14, window.innerWidth - w - 6)}px`;
  tip.style.top = `${ev.clientY + h + 20 > window.innerHeight ? ev.clientY - h - 10 : ev.clientY + 16}px`;
}

const hideTip = () => { $("tooltip").hidden = true; };

/* ---------- the charts ---------- */

/* before (if any) and after timelines, then the ferry, all on the same time axis */
function drawCharts() {
  if (!page.runs.length) return;
  hideTip(); // the box it described is redrawn
  const after = page.runs[page.runs.length - 1];
  const before = page.runs.length > 1 ? page.runs[0] : null;
  $("panel-before").hidden = !before;
  if (before) {
    titled("title-before", `${word("before")}: ${before.title || ""}`, word("timeline"));
    drawTimeline($("timeline-before"), before, { height: 170, maxRow: 10, small: true });
  }
  titled("title-after", `${word("after")}: ${after.title || ""}`, word("timeline"));
  drawTimeline($("timeline"), after, { height: 380, maxRow: 18, small: false });
  titled("title-seats", word("seats"), "");
  drawSeats($("seats"), after);
}

function titled(id, title, sub) {
  $(id).replaceChildren(document.createTextNode(title));
  if (sub) $(id).appendChild(html("span", { class: "sub" }, sub));
}

/* an empty chart `height` px tall, as wide as its box, with a clip path for what lies inside the axes */
function startChart(chart, height) {
  const width = Math.max(320, Math.floor(chart.getBoundingClientRect().width || chart.parentNode.clientWidth));
  const x = scaleFor(width);
  chart.replaceChildren();
  chart.setAttribute("viewBox", `0 0 ${width} ${height}`);
  chart.setAttribute("height", String(height));
  const clipId = `clip-${chart.id}`;
  const clip = svg("clipPath", { id: clipId }, svg("defs", {}, chart));
  svg("rect", { x: x.left, y: 0, width: x.plot, height }, clip);
  return { x, clip: `url(#${clipId})` };
}

/* the rows of a timeline: the drawn requests, in the order the server sent them */
function timelineRows(result) {
  const drawn = result.drawn ? result.drawn.requests : result.requests.length;
  const rows = result.requests.slice(0, drawn).map((q) => q.id);
  const known = new Set(rows);
  return rows.concat([...new Set(result.spans.map((s) => s.request))].filter((r) => !known.has(r)));
}

/* a timeline: the GPU-idle strip, one row per request with its spans, arrivals and rejections, the time axis */
function drawTimeline(chart, result, o) {
  const rows = timelineRows(result);
  const rowH = clamp(o.height / Math.max(rows.length, 1), o.small ? 0.6 : 1.2, o.maxRow);
  const top = STRIP + 4, bottom = top + rows.length * rowH;
  const { x, clip } = startChart(chart, bottom + AXIS);
  chart.setAttribute("aria-label", `${word("timeline")}: ${result.title || ""}`);
  drawIdle(chart, result, x, clip);
  drawRows(chart, x, rows.map(String), rowH, top, o.small);
  drawGrid(chart, result, x, top, bottom, clip);
  const index = new Map(rows.map((r, i) => [r, i]));
  const boxes = svg("g", { "clip-path": clip }, chart);
  const inset = rowH >= 5 ? rowH * 0.12 : 0;
  for (const s of result.spans) {
    const i = index.get(s.request);
    if (i !== undefined) drawBox(boxes, s, x, top + i * rowH + inset, rowH - 2 * inset, "box");
  }
  drawArrivals(svg("g", {}, chart), result, index, x, top, rowH); // unclipped: a cross at 0 ms shows whole
  drawAxis(chart, x, bottom);
}

/* the strip above a timeline: where the GPU sat idle */
function drawIdle(chart, result, x, clip) {
  svg("rect", { class: "idle-strip", x: x.left, y: 2, width: x.plot, height: STRIP - 2 }, chart);
  svg("text", { class: "idle-label", x: x.left - 6, y: STRIP - 2, "text-anchor": "end" }, chart)
    .textContent = word("gpu_idle");
  const g = svg("g", { "clip-path": clip }, chart);
  for (const [a, b] of result.idle || []) {
    if (b < x.x0 || a > x.x1) continue;
    const w = Math.max(0.5, x.px(b) - x.px(a));
    const r = svg("rect", { class: "idle", x: x.px(a), y: 2, width: w, height: STRIP - 2 }, g);
    svg("title", {}, r).textContent = `${word("gpu_idle")}: ${ms(a)} – ${ms(b)} ms`;
  }
}

/* light bands on alternate rows and a label left of each row (of every k-th when rows are thin) */
function drawRows(chart, x, labels, rowH, top, small) {
  const every = Math.ceil((small ? 9 : 11) / rowH);
  labels.forEach((text, i) => {
    const y = top + i * rowH;
    if (rowH >= 6 && i % 2 === 1) svg("rect", { class: "row-band", x: x.left, y, width: x.plot, height: rowH }, chart);
    if (i % every !== 0) return;
    const attrs = { class: "row-label", x: x.left - 6, y: y + Math.min(rowH, 11) / 2 + 3.5, "text-anchor": "end" };
    svg("text", attrs, chart).textContent = text.length > 10 ? `${text.slice(0, 9)}…` : text;
  });
}

/* faint vertical lines: at the time ticks, and where iterations start (unless they are too dense to see) */
function drawGrid(chart, result, x, top, bottom, clip) {
  const g = svg("g", { "clip-path": clip }, chart);
  const line = (cls, t) => svg("line", { class: cls, x1: x.px(t), x2: x.px(t), y1: top, y2: bottom }, g);
  for (const t of ticks(x)) line("grid", t);
  const seen = (result.iterations || []).filter((it) => it.end_ms >= x.x0 && it.start_ms <= x.x1);
  if (seen.length && x.plot / seen.length >= 4) for (const it of seen) line("iter-line", it.start_ms);
}

/* one span: a rect with its data, and a <title> for screen readers */
function drawBox(parent, s, x, y, h, cls) {
  if (s.end_ms < x.x0 || s.start_ms > x.x1) return;
  const a = clamp(x.px(s.start_ms), x.left - 5, x.right + 5);
  const b = clamp(x.px(s.end_ms), x.left - 5, x.right + 5);
  const rect = svg("rect", {
    class: `${cls} kind-${s.kind}`, x: a, y, width: b - a > 2.5 ? b - a - 0.6 : Math.max(b - a, 0.6),
    height: Math.max(h, 0.5), "data-request": s.request, "data-iteration": s.iteration, "data-phase": s.kind,
    "data-tokens": s.tokens, "data-start": s.start_ms, "data-end": s.end_ms, "data-seat": s.seat == null ? "" : s.seat,
  }, parent); // wide neighbours keep a hairline gap between them
  const it = s.iteration > 0 ? `, ${named("iteration", s.iteration)}` : "";
  const tok = s.tokens > 0 ? `, ${s.tokens} ${word("tokens")}` : "";
  svg("title", {}, rect).textContent =
    `${named("request", s.request)}: ${word(s.kind)}${it}${tok}, ${ms(s.start_ms)} – ${ms(s.end_ms)} ms`;
}

/* a tick where each request arrived; a cross for a rejected one, its reason in the hover */
function drawArrivals(parent, result, index, x, top, rowH) {
  for (const q of result.requests) {
    const i = index.get(q.id);
    if (i === undefined || q.arrival_ms < x.x0 || q.arrival_ms > x.x1) continue;
    const px = x.px(q.arrival_ms), y = top + i * rowH;
    if (q.status !== "rejected") {
      if (rowH >= 3) svg("line", { class: "arrival", x1: px, x2: px, y1: y, y2: y + rowH }, parent);
      continue;
    }
    const r = clamp(rowH / 2 - 1, 2, 5), cy = y + rowH / 2;
    const g = svg("g", {
      "data-request": q.id, "data-phase": "rejected", "data-reason": q.reason || "", "data-iteration": 0,
      "data-tokens": 0, "data-start": q.arrival_ms, "data-end": q.arrival_ms, "data-seat": "",
    }, parent);
    svg("rect", { class: "rejected-hit", x: px - r - 2, y: cy - r - 2, width: 2 * r + 4, height: 2 * r + 4 }, g);
    const d = `M${px - r},${cy - r}L${px + r},${cy + r}M${px - r},${cy + r}L${px + r},${cy - r}`;
    svg("path", { class: "rejected-mark", d }, g);
    svg("title", {}, g).textContent = `${named("request", q.id)}: ${word("rejected")} (${q.reason || ""})`;
  }
}

/* the time axis along the bottom of a chart, ticks in ms */
function drawAxis(chart, x, y) {
  const g = svg("g", { class: "axis" }, chart);
  svg("line", { x1: x.left, x2: x.right, y1: y + 0.5, y2: y + 0.5 }, g);
  const all = ticks(x);
  const digits = all.length > 1 ? clamp(-Math.floor(Math.log10(all[1] - all[0])), 0, 3) : 0;
  for (const t of all) {
    svg("line", { x1: x.px(t), x2: x.px(t), y1: y, y2: y + 4 }, g);
    svg("text", { x: x.px(t), y: y + 15, "text-anchor": "middle" }, g).textContent = number(t, digits);
  }
  svg("text", { x: x.right, y: y + 28, "text-anchor": "end" }, g).textContent = word("time_ms");
}

/* round times on screen, about one per 90 px */
function ticks(x) {
  const raw = (x.x1 - x.x0) / Math.max(x.plot / 90, 1);
  const mag = 10 ** Math.floor(Math.log10(raw));
  const r = raw / mag;
  const step = (r < 1.5 ? 1 : r < 3 ? 2 : r < 7 ? 5 : 10) * mag;
  const out = [];
  for (let k = Math.ceil(x.x0 / step); k * step <= x.x1 + step * 1e-9; k++) out.push(Number((k * step).toFixed(10)));
  return out;
}

/* the ferry: a row per seat with the spans of whoever sat in it, their ids inside, the dock queue below */
function drawSeats(chart, result) {
  const used = result.spans.reduce((m, s) => (s.seat == null ? m : Math.max(m, s.seat)), -1);
  const seats = Math.max(result.seats || 0, used + 1, 1);
  const shown = seats <= 64 ? seats : Math.max(used + 1, 1); // hundreds of seats: only those anyone sat in
  if (shown < seats) $("title-seats").appendChild(html("span", { class: "sub" }, `0 – ${shown - 1} / ${seats}`));
  const rowH = clamp(300 / shown, 3, 26), dockH = 42;
  const top = 6, bottom = top + shown * rowH;
  const { x, clip } = startChart(chart, bottom + dockH + 8 + AXIS);
  chart.setAttribute("aria-label", word("seats"));
  drawRows(chart, x, Array.from({ length: shown }, (_, i) => named("seat", i)), rowH, top, false);
  drawGrid(chart, result, x, top, bottom, clip);
  const boxes = svg("g", { "clip-path": clip }, chart);
  const inset = rowH >= 6 ? rowH * 0.1 : 0;
  for (const s of result.spans) {
    if (s.seat == null || s.seat >= shown) continue;
    drawBox(boxes, s, x, top + s.seat * rowH + inset, rowH - 2 * inset, "seat-box");
  }
  if (rowH >= 11) drawPassengers(boxes, result, x, top, rowH);
  drawDock(chart, result, x, bottom + 8, dockH, clip);
  drawAxis(chart, x, bottom + dockH + 8);
}

/* each passenger's id over the stretch they held a seat, where it fits: white on dark prefill, dark elsewhere */
function drawPassengers(parent, result, x, top, rowH) {
  const stays = new Map();
  for (const s of result.spans) {
    if (s.seat == null) continue;
    const key = `${s.seat}/${s.request}`;
    if (!stays.has(key)) stays.set(key, { seat: s.seat, id: String(s.request), spans: [] });
    stays.get(key).spans.push(s);
  }
  for (const st of stays.values()) {
    const a = Math.max(x.px(Math.min(...st.spans.map((s) => s.start_ms))), x.left);
    const b = Math.min(x.px(Math.max(...st.spans.map((s) => s.end_ms))), x.right);
    if (b - a < st.id.length * 6.5 + 6) continue;
    const mid = x.x0 + (((a + b) / 2 - x.left) / x.plot) * (x.x1 - x.x0);
    const under = st.spans.find((s) => s.start_ms <= mid && mid <= s.end_ms);
    const cls = under && under.kind === "prefill" ? "seat-text" : "seat-text dark";
    const y = top + st.seat * rowH + rowH / 2 + 3.5;
    svg("text", { class: cls, x: (a + b) / 2, y, "text-anchor": "middle" }, parent).textContent = st.id;
  }
}

/* the dock queue: how many drawn requests wait at each moment, as a step area */
function drawDock(chart, result, x, y, h, clip) {
  const events = [];
  for (const s of result.spans) {
    if (s.kind === "waiting" && s.end_ms > s.start_ms) events.push([s.start_ms, 1], [s.end_ms, -1]);
  }
  events.sort((p, q) => p[0] - q[0] || p[1] - q[1]);
  let n = 0;
  const steps = events.map(([t, step]) => [t, (n += step)]);
  const peak = Math.max(0, ...steps.map((p) => p[1]));
  const label = (text, dy) => {
    svg("text", { class: "row-label", x: x.left - 6, y: y + dy, "text-anchor": "end" }, chart).textContent = text;
  };
  label(word("dock"), 10);
  label(`≤ ${peak}`, h);
  svg("line", { class: "grid", x1: x.left, x2: x.right, y1: y + h, y2: y + h }, chart);
  if (!peak) return;
  const yOf = (v) => y + h - (v / peak) * (h - 2);
  const d = `M${x.px(0)},${yOf(0)}${steps.map(([t, v]) => `H${x.px(t)}V${yOf(v)}`).join("")}H${x.px(x.x1)}V${yOf(0)}Z`;
  const area = svg("path", { class: "dock", d, "clip-path": clip }, chart);
  svg("title", {}, area).textContent = `${word("dock")}: ${word("queue")} ≤ ${peak}`;
}

/* the legend: a swatch per kind of span, the GPU-idle shade, the arrival tick and the rejection cross */
function buildLegend() {
  const item = (cls, text, mark = "") => {
    const span = html("span", { class: "item" });
    span.append(html("span", { class: `swatch ${cls}` }, mark), document.createTextNode(text));
    $("legend").appendChild(span);
  };
  for (const kind of KINDS) item(`kind-${kind}`, word(kind));
  item("gpu-idle", word("gpu_idle"));
  item("arrival-mark", word("arrival"));
  item("rejected-swatch", word("rejected"), "×");
}

/* ---------- metrics, what changed, notes ---------- */

/* the metrics of the options, and completed/rejected counts unless the server sends those */
function metricSpecs() {
  const specs = (page.options.metrics || []).slice();
  const have = new Set(specs.map((m) => m.key));
  for (const [key, better] of [["completed", "higher"], ["rejected", "lower"]]) {
    if (!have.has(key)) specs.push({ key, label: word(key), better, digits: 0, count: true });
  }
  return specs;
}

function buildMetricsTable() {
  for (const m of metricSpecs()) {
    const tr = html("tr", { class: m.count ? "count" : "" });
    tr.append(
      html("td", { class: "name" }, m.label || m.key),
      html("td", { class: "before", id: `before-${m.key}`, "data-value": "" }),
      html("td", { class: "after", id: `metric-${m.key}`, "data-value": "" }),
      html("td", { class: "change", id: `change-${m.key}`, "data-value": "" }),
    );
    $("metrics").tBodies[0].appendChild(tr);
  }
}

function metricValue(result, m) {
  if (!result) return null;
  const v = result.metrics ? result.metrics[m.key] : undefined;
  if (typeof v === "number" && Number.isFinite(v)) return v;
  return m.count ? result.requests.filter((q) => q.status === m.key).length : null;
}

function setCell(cell, v, digits, blank) {
  cell.dataset.value = v == null ? "" : String(v);
  cell.textContent = v != null ? number(v, digits) : blank ? "" : "–";
}

/* after, before and the signed change of each metric, green where it improved */
function drawMetrics() {
  const after = page.runs[page.runs.length - 1];
  const before = page.runs.length > 1 ? page.runs[0] : null;
  for (const m of metricSpecs()) {
    const digits = m.digits ?? 1;
    const a = metricValue(after, m), b = metricValue(before, m);
    setCell($(`metric-${m.key}`), a, digits, false);
    setCell($(`before-${m.key}`), b, digits, !before);
    const cell = $(`change-${m.key}`);
    cell.classList.remove("better", "worse");
    cell.dataset.value = a == null || b == null ? "" : String(a - b);
    cell.textContent = "";
    if (a == null || b == null) continue;
    const d = a - b, size = number(Math.abs(d), digits);
    if (!/[1-9]/.test(size)) { cell.textContent = "0"; continue; } // no change at the digits shown
    const sign = d > 0 ? "+" : "-";
    const pct = b !== 0 ? ` (${sign}${number(Math.abs(d / b) * 100, 0)}%)` : "";
    cell.textContent = `${sign}${size}${pct}`;
    cell.classList.add((d < 0) === (m.better === "lower") ? "better" : "worse");
  }
}

/* which settings differ between before and after, e.g. "max delay 0 -> 200" */
function drawChanges() {
  const line = $("changes");
  line.hidden = false;
  line.textContent = page.words.unchanged || "";
  if (page.runs.length < 2) return;
  const [before, after] = page.runs.map((r) => r.settings || {});
  const parts = [];
  for (const key of new Set([...Object.keys(before), ...Object.keys(after)])) {
    if (JSON.stringify(before[key]) === JSON.stringify(after[key])) continue;
    const spec = page.controls.has(key) ? page.controls.get(key).spec : { label: key };
    parts.push(`${spec.label || key} ${settingText(spec, before[key])} -> ${settingText(spec, after[key])}`);
  }
  line.hidden = !parts.length;
  line.textContent = parts.length ? `${word("changed")}: ${parts.join("; ")}` : "";
}

function settingText(spec, value) {
  const choice = (spec.choices || []).find((c) => String(c.value) === String(value));
  return choice ? choice.label : value == null ? "–" : String(value);
}

/* "showing the first n of total requests", and why TTFT = E2E under static and dynamic batching */
function drawNotes() {
  const after = page.runs[page.runs.length - 1];
  const whole = page.words.whole_response && ["static", "dynamic"].includes((after.settings || {}).policy);
  $("metrics-note").textContent = whole ? page.words.whole_response : "";
  const drawn = after.drawn, note = $("drawn-note");
  note.hidden = !(drawn && drawn.requests < drawn.of);
  note.textContent = note.hidden ? "" : fill(word("shown_of"), { n: drawn.requests, total: drawn.of });
}

document.addEventListener("DOMContentLoaded", start);
