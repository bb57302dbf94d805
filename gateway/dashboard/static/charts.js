// Small SVG charts for the infer dashboard: time-series lines (gaps where a value is null, dashed
// horizontal lines for SLOs) and grouped horizontal bars. No dependencies; the same functions draw
// every chart of the page.
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
const PALETTE = ["#2563eb", "#f59e0b", "#dc2626", "#16a34a", "#9333ea", "#0891b2", "#db2777", "#65a30d"];

function svgEl(name, attrs, text) {
  const el = document.createElementNS(SVG_NS, name);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
  if (text !== undefined) el.textContent = text;
  return el;
}

function niceTicks(lo, hi, count) {
  if (!(hi > lo)) { hi = lo + 1; }
  const raw = (hi - lo) / Math.max(1, count);
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 2.5, 5, 10].map(m => m * mag).find(s => s >= raw) || raw;
  const ticks = [];
  for (let v = Math.floor(lo / step) * step; v <= hi + step * 1e-9; v += step) ticks.push(+v.toFixed(10));
  return ticks;
}

function shortNumber(v) {
  const a = Math.abs(v);
  if (a >= 1e6) return (v / 1e6).toFixed(1) + "M";
  if (a >= 1e3) return (v / 1e3).toFixed(1) + "k";
  if (a >= 100 || v === 0) return v.toFixed(0);
  if (a >= 1) return v.toFixed(1).replace(/\.0$/, "");
  return v.toPrecision(2);
}

function clockLabel(t) {
  const d = new Date(t * 1000);
  return d.toTimeString().slice(0, 8);
}

// lineChart(el, {series: [{name, points: [[t, v|null]...], dash?}], hlines: [{name, value}],
//                 unit, height}) draws into el (replacing its content).
function lineChart(el, opts) {
  const width = Math.max(280, el.clientWidth || 480), height = opts.height || 200;
  const m = {l: 48, r: 12, t: 18, b: 24};
  const series = opts.series.filter(s => s.points.length);
  const values = series.flatMap(s => s.points.map(p => p[1])).filter(v => v !== null && isFinite(v));
  const hlines = (opts.hlines || []).filter(h => h.value !== null && h.value !== undefined);
  const ts = series.flatMap(s => s.points.map(p => p[0]));
  const svg = svgEl("svg", {width, height, viewBox: `0 0 ${width} ${height}`, role: "img", class: "chart"});
  const t0 = ts.length ? Math.min(...ts) : 0, t1 = ts.length ? Math.max(...ts) : 1;
  const yTicks = niceTicks(0, Math.max(...values, ...hlines.map(h => h.value), 0) * 1.08 || 1, 4);
  const yMax = yTicks[yTicks.length - 1];
  const x = t => m.l + (t1 > t0 ? (t - t0) / (t1 - t0) : 0.5) * (width - m.l - m.r);
  const y = v => height - m.b - (v / yMax) * (height - m.t - m.b);
  for (const tick of yTicks) {
    svg.append(svgEl("line", {x1: m.l, x2: width - m.r, y1: y(tick), y2: y(tick), class: "grid"}));
    svg.append(svgEl("text", {x: m.l - 6, y: y(tick) + 4, "text-anchor": "end", class: "tick"}, shortNumber(tick)));
  }
  const xCount = Math.min(5, Math.max(1, Math.floor((width - m.l) / 110)));
  for (let i = 0; i <= xCount && t1 > t0; i++) {
    const t = t0 + (t1 - t0) * i / xCount;
    svg.append(svgEl("text", {x: x(t), y: height - 6, "text-anchor": i === 0 ? "start" : i === xCount ? "end" : "middle",
                              class: "tick"}, clockLabel(t)));
  }
  if (opts.unit) svg.append(svgEl("text", {x: 4, y: 10, class: "tick unit"}, opts.unit));
  hlines.forEach(h => {
    svg.append(svgEl("line", {x1: m.l, x2: width - m.r, y1: y(h.value), y2: y(h.value), class: "slo",
                              "data-slo": h.value}));
    svg.append(svgEl("text", {x: width - m.r - 2, y: y(h.value) - 4, "text-anchor": "end", class: "slo-label"},
                     `${h.name} ${shortNumber(h.value)}`));
  });
  series.forEach((s, i) => {
    const color = s.color || PALETTE[i % PALETTE.length];
    let d = "", pen = false;
    for (const [t, v] of s.points) {
      if (v === null || !isFinite(v)) { pen = false; continue; }
      d += `${pen ? "L" : "M"}${x(t).toFixed(1)},${y(v).toFixed(1)}`;
      pen = true;
    }
    if (d) svg.append(svgEl("path", {d, stroke: color, class: "line" + (s.dash ? " dashed" : ""), "data-series": s.name}));
    s.points.forEach(([t, v], j) => {  // lone points (a bucket between gaps) still show
      const prev = s.points[j - 1], next = s.points[j + 1];
      if (v !== null && (!prev || prev[1] === null) && (!next || next[1] === null))
        svg.append(svgEl("circle", {cx: x(t), cy: y(v), r: 2.5, fill: color}));
    });
  });
  el.replaceChildren(svg, legend(series.map((s, i) => [s.name, s.color || PALETTE[i % PALETTE.length], s.dash]),
                                 hlines.length ? "SLO" : null));
  if (!values.length) el.append(Object.assign(document.createElement("div"), {className: "empty", textContent: "no data in this window"}));
}

function legend(items, sloName) {
  const box = document.createElement("div");
  box.className = "legend";
  for (const [name, color, dash] of items) {
    const item = document.createElement("span");
    const swatch = document.createElement("i");
    swatch.style.borderTopColor = color;
    if (dash) swatch.style.borderTopStyle = "dashed";
    item.append(swatch, name);
    box.append(item);
  }
  if (sloName) {
    const item = document.createElement("span");
    const swatch = document.createElement("i");
    swatch.className = "slo-swatch";
    item.append(swatch, sloName);
    box.append(item);
  }
  return box;
}

// barChart(el, {groups: [{name, values: [v|null...]}], keys: [names...], unit}): horizontal bars,
// one row per group, one bar per key.
function barChart(el, opts) {
  const width = Math.max(280, el.clientWidth || 480), row = 14 * opts.keys.length + 12;
  const m = {l: 110, r: 70, t: 6, b: 6};
  const height = m.t + m.b + row * Math.max(1, opts.groups.length);
  const all = opts.groups.flatMap(g => g.values).filter(v => v !== null && isFinite(v));
  const max = Math.max(...all, 0) || 1;
  const svg = svgEl("svg", {width, height, viewBox: `0 0 ${width} ${height}`, role: "img", class: "chart"});
  opts.groups.forEach((g, i) => {
    const top = m.t + i * row;
    svg.append(svgEl("text", {x: m.l - 8, y: top + row / 2 + 2, "text-anchor": "end", class: "tick"}, g.name));
    g.values.forEach((v, j) => {
      const yPos = top + 4 + j * 14;
      const w = v === null ? 0 : (v / max) * (width - m.l - m.r);
      svg.append(svgEl("rect", {x: m.l, y: yPos, width: Math.max(w, v ? 1 : 0), height: 11, rx: 2,
                                fill: PALETTE[j % PALETTE.length], "data-bar": `${g.name}:${opts.keys[j]}`}));
      svg.append(svgEl("text", {x: m.l + w + 4, y: yPos + 9, class: "tick"},
                       v === null ? "unpriced" : (opts.format || shortNumber)(v)));
    });
  });
  el.replaceChildren(svg, legend(opts.keys.map((k, j) => [k, PALETTE[j % PALETTE.length]]), null));
  if (!opts.groups.length) el.append(Object.assign(document.createElement("div"), {className: "empty", textContent: "no priced traffic in this window"}));
}

window.InferCharts = {lineChart, barChart};
