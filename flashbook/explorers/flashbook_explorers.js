// flashbook's explorers: one module for Jupyter/Colab (anywidget) and the static book.
//
// Each explorer is a pure `state(config, settings)` (the numbers) and a `view` that
// draws it (HTML tables and SVG) and owns the controls. The numbers mirror
// flashbook's Python (flashbook.tiled, flashbook.softmax and, beside this file,
// blocksize.py, qkv.py); the constants come from the config that Python exports. The
// sweep (sweep.py) and the mask tiles (maskmap.py) only look up what Python computed.
// Tests compare the two (how the numbers get here: __init__.py, beside this).
// No imports, no network: this file is served as it is.

const SVGNS = "http://www.w3.org/2000/svg";

// ------------------------------------------------------------ small helpers

function el(tag, attrs = {}, ...children) {
  const node = tag.startsWith("svg:") ? document.createElementNS(SVGNS, tag.slice(4))
    : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "text") node.textContent = v;
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children) if (c !== null && c !== undefined) node.append(c);
  return node;
}

function svg(tag, attrs = {}, ...children) { return el("svg:" + tag, attrs, ...children); }

// A displayed number: its text, and its full value in data-value for the tests.
function num(name, value, text) {
  return el("span", { "data-fb": name, "data-value": value === null ? "" : String(value),
    text: text === undefined ? String(value) : text });
}

export function humanBytes(n) {  // mirrors flashbook.plots.human_bytes
  for (const unit of ["B", "KiB", "MiB", "GiB", "TiB"]) {
    if (Math.abs(n) < 1024 || unit === "TiB") return unit === "B" ? `${n.toFixed(0)} B` : `${n.toFixed(1)} ${unit}`;
    n /= 1024;
  }
}

const fixed = (x, digits = 4) => (x === -Infinity ? "-inf" : x === Infinity ? "inf" : x.toFixed(digits));

// ------------------------------------------------------------ chapter 4: tiles and counts

const ceilDiv = (a, b) => Math.floor((a + b - 1) / b);

// flashbook.tiled.visible_key_tiles with n_q = n_k = n
export function visibleKeyTiles(n, bq, bk, causal) {
  const rowTiles = ceilDiv(n, bq), colTiles = ceilDiv(n, bk), counts = [];
  for (let i = 0; i < rowTiles; i++) {
    if (!causal) { counts.push(colTiles); continue; }
    const last = Math.min((i + 1) * bq, n) - 1;
    counts.push(last < 0 ? 0 : Math.min(Math.floor(last / bk) + 1, colTiles));
  }
  return counts;
}

// flashbook.tiled.tile_kinds: "full", "partial" or "skipped" per (i, j)
export function tileKinds(n, bq, bk, causal) {
  const counts = visibleKeyTiles(n, bq, bk, causal), colTiles = ceilDiv(n, bk);
  return counts.map((c, i) => Array.from({ length: colTiles }, (_, j) => {
    if (j >= c) return "skipped";
    const full = !causal || Math.min((j + 1) * bk, n) - 1 <= i * bq;
    return full ? "full" : "partial";
  }));
}

// flashbook.tiled.tile_schedule
export function tileSchedule(n, bq, bk, causal, order) {
  const counts = visibleKeyTiles(n, bq, bk, causal), out = [];
  if (order === "fa2") counts.forEach((c, i) => { for (let j = 0; j < c; j++) out.push([i, j]); });
  else for (let j = 0; j < ceilDiv(n, bk); j++) counts.forEach((c, i) => { if (j < c) out.push([i, j]); });
  return out;
}

// flashbook.tiled._tile_sums: (row_visits, key_visits)
function tileSums(n, bq, bk, causal) {
  const counts = visibleKeyTiles(n, bq, bk, causal);
  let rowVisits = 0, keyVisits = 0;
  counts.forEach((c, i) => {
    rowVisits += (Math.min((i + 1) * bq, n) - i * bq) * c;
    keyVisits += Math.min(c * bk, n);
  });
  return [rowVisits, keyVisits];
}

// flashbook.tiled.io_flash (batch 1, d_v = d): elements read and written per array
export function ioFlash(n, d, bq, bk, causal, order) {
  const [rv, kv] = tileSums(n, bq, bk, causal);
  if (order === "fa2") return { reads: { Q: n * d, K: kv * d, V: kv * d }, writes: { O: n * d, lse: n } };
  return {
    reads: { K: n * d, V: n * d, Q: rv * d, O: rv * d, m: rv + n, l: rv + n },
    writes: { O: (n + rv) * d, m: n + rv, l: n + rv, lse: n },
  };
}

// flashbook.tiled.io_naive
export function ioNaive(n, d) {
  return { reads: { Q: n * d, K: n * d, S: n * n, P: n * n, V: n * d }, writes: { S: n * n, P: n * n, O: n * d } };
}

// IOStats.hbm_bytes: per-row statistics in acc bytes, the rest in the input dtype
function hbmBytes(stats, cfg) {
  let total = 0;
  for (const part of [stats.reads, stats.writes])
    for (const [name, count] of Object.entries(part))
      total += count * (cfg.stat_arrays.includes(name) ? cfg.acc_bytes : cfg.dtype_bytes);
  return total;
}

// flashbook.tiled.onchip_elements(min(B_r, N), min(B_c, N), d), in bytes per buffer
export function onchipBytes(n, d, bq, bk, cfg) {
  const br = Math.min(bq, n), bc = Math.min(bk, n);
  const elements = { Q: br * d, K: bc * d, V: bc * d, "S/P": br * bc, O: br * d, m: br, l: br };
  const out = {};
  for (const [name, count] of Object.entries(elements))
    out[name] = count * (cfg.input_buffers.includes(name) ? cfg.dtype_bytes : cfg.acc_bytes);
  return out;
}

// flashbook.smem.tile_d: the head dimension padded to the kernels' tile width (null: none)
export function tileD(d, cfg) {
  for (const width of cfg.tile_ds) if (d <= width) return width;
  return null;
}

// flashbook.smem.smem_buffers for the forward kernel (blocksize.kernel_smem): what a GPU
// kernel keeps in shared memory, by buffer. From sm_80 on the Q tile and num_stages
// copies of the K and V tiles; on sm_75 Triton's fp32 operand tiles, one entry.
export function kernelSmem(cfg, chip, d, bq, bk, stages) {
  const width = tileD(d, cfg), elt = cfg.dtype_bytes;
  if (width === null) return {};
  if (parseInt(chip.arch.slice(3), 10) < 80) {
    let fp32 = Math.max((bq + bk) * width, bq * bk + Math.max(bq, bk) * width);
    if (elt === 4) fp32 += bq * bk + Math.max(bq, bk) * width;
    return { [cfg.fp32_operands]: 4 * fp32 };
  }
  return { Q: elt * bq * width, K: elt * stages * bk * width, V: elt * stages * bk * width };
}

// flashbook.explorers.blocksize._hash32 and example_qkv: exact 32-bit integer arithmetic
function hash32(x) {
  x >>>= 0;
  x = (x ^ (x >>> 16)) >>> 0;
  x = Math.imul(x, 0x7feb352d) >>> 0;
  x = (x ^ (x >>> 15)) >>> 0;
  x = Math.imul(x, 0x846ca68b) >>> 0;
  x = (x ^ (x >>> 16)) >>> 0;
  return x;
}

export function exampleValue(ex, a, r, c) {
  const key = (ex.seed + (a * 65536 + r) * 512 + c) % 4294967296;
  return ex.low + ex.width * (hash32(key) / 4294967296);
}

// The watched row's (step, m, l) after each step that visits its query tile: the
// update of flashbook.tiled's forward loop, for that one row.
export function rowTrace(cfg, n, d, bq, bk, causal, schedule, row) {
  const ex = cfg.example, scale = 1 / Math.sqrt(d);
  const q = Array.from({ length: d }, (_, c) => exampleValue(ex, 0, row, c));
  const scores = new Float64Array(n);
  for (let j = 0; j < n; j++) {
    let dot = 0;
    for (let c = 0; c < d; c++) dot += q[c] * exampleValue(ex, 1, j, c);
    scores[j] = scale * dot;
  }
  const tile = Math.floor(row / bq), trace = [];
  let m = -Infinity, l = 0;
  schedule.forEach(([i, j], step) => {
    if (i !== tile) return;
    const lo = j * bk, hi = Math.min(lo + bk, n);
    let tileMax = -Infinity;
    for (let c = lo; c < hi; c++) if (!(causal && c > row)) tileMax = Math.max(tileMax, scores[c]);
    const mNew = Math.max(m, tileMax), shift = mNew === -Infinity ? 0 : mNew;
    let p = 0;
    for (let c = lo; c < hi; c++) if (!(causal && c > row)) p += Math.exp(scores[c] - shift);
    l = Math.exp(m - shift) * l + p;
    m = mNew;
    trace.push([step, m, l]);
  });
  return trace;
}

// flashbook.explorers.blocksize.explorer_state, in the browser
export function blocksizeState(cfg, s) {
  const { n, d, block_q: bq, block_k: bk, causal, order } = s;
  const chip = cfg.chips[s.chip];
  const kinds = tileKinds(n, bq, bk, causal);
  const schedule = tileSchedule(n, bq, bk, causal, order);
  const row = Math.min(s.row, n - 1);
  const step = Math.max(0, Math.min(s.step, schedule.length - 1));
  const trace = rowTrace(cfg, n, d, bq, bk, causal, schedule, row);
  const seen = trace.filter((t) => t[0] <= step);
  const onchip = onchipBytes(n, d, bq, bk, cfg);
  const onchipTotal = Object.values(onchip).reduce((a, b) => a + b, 0);
  const kernel = kernelSmem(cfg, chip, d, bq, bk, s.num_stages);
  const kernelTotal = Object.values(kernel).reduce((a, b) => a + b, 0);
  const traffic = { naive: hbmBytes(ioNaive(n, d), cfg) };
  for (const o of Object.keys(cfg.orders)) traffic[o] = hbmBytes(ioFlash(n, d, bq, bk, causal, o), cfg);
  const nTiles = kinds.length * kinds[0].length;
  const nSkipped = kinds.flat().filter((k) => k === "skipped").length;
  const nPartial = kinds.flat().filter((k) => k === "partial").length;
  return {
    settings: { ...s, row, step }, kinds, schedule, step, row, trace,
    now: seen.length ? seen[seen.length - 1] : null,
    current: schedule.length ? schedule[step] : null,
    nTiles, nSkipped, nPartial, onchip, onchipTotal, smemPerBlock: chip.smem_per_block, chipName: chip.name,
    fits: onchipTotal <= chip.smem_per_block, traffic, arch: chip.arch,
    kernel, kernelTotal, kernelFits: Object.keys(kernel).length > 0 && kernelTotal <= chip.smem_per_block,
  };
}

// ------------------------------------------------------------ chapter 2: softmax and the online pass

function matmulT(a, b) { return a.map((r) => b.map((c) => r.reduce((acc, x, k) => acc + x * c[k], 0))); }

export function softmaxRows(s) {  // flashbook.softmax.softmax along the last axis
  return s.map((row) => {
    const m = Math.max(...row), shift = Number.isFinite(m) ? m : 0;
    const p = row.map((x) => Math.exp(x - shift)), l = p.reduce((a, b) => a + b, 0);
    return p.map((x) => (l > 0 ? x / l : 0));
  });
}

// flashbook.softmax.online_attention_trace with block_k = 1
export function onlineTrace(q, K, V, scale) {
  let m = -Infinity, l = 0, o = V[0].map(() => 0);
  return K.map((k, j) => {
    const dot = q.reduce((acc, x, c) => acc + x * k[c], 0), s = scale * dot;
    const mNew = Math.max(m, s), rescale = Math.exp(m - mNew), w = Math.exp(s - mNew);
    l = rescale * l + w;
    o = o.map((x, c) => rescale * x + w * V[j][c]);
    m = mNew;
    return [dot, s, m, rescale, w, l, ...o, ...o.map((x) => x / l)];
  });
}

export function qkvState(cfg, s) {
  const { Q, K, V } = s, scale = cfg.scale;
  const S = matmulT(Q, K).map((r) => r.map((x) => scale * x));
  const P = softmaxRows(S);
  const Vt = V[0].map((_, c) => V.map((r) => r[c]));
  const O = matmulT(P, Vt);
  const trace = onlineTrace(Q[s.token], K, V, scale);
  let error = 0;
  Q.forEach((q, i) => {
    const t = onlineTrace(q, K, V, scale), last = t[t.length - 1], dv = V[0].length;
    for (let c = 0; c < dv; c++) error = Math.max(error, Math.abs(last[6 + dv + c] - O[i][c]));
  });
  return { S, P, O, trace, error };
}

// ------------------------------------------------------------ chapter 9: the recorded sweep

const SWEEP_KEYS = ["head_dim", "block_m", "block_n", "num_warps", "num_stages"];
export function sweepState(cfg, s) {
  const key = SWEEP_KEYS.map((k) => s[k]).join(",");
  return { key, view: cfg.views[key], ranking: cfg.ranking[String(s.head_dim)] || [] };
}

// ------------------------------------------------------------ chapter 12: mask tiles

// flashbook.explorers.maskmap.view_key: the window counts only for "window", the prefix
// only for "prefix"
export function masksKey(s) {
  const param = s.mask === "window" ? s.window : s.mask === "prefix" ? s.prefix : 0;
  return `${s.mask},${s.n},${param},${s.tile}`;
}

// maskmap.encode_grid's runs: "f3p1s12*2,..." -> per tile row [[kind, count], ...]
// ("*k": the row k times)
const KIND_NAMES = { s: "skipped", f: "full", p: "partial" };
export function decodeGrid(text) {
  return text.split(",").flatMap((token) => {
    const [row, repeat] = token.split("*");
    const runs = [...row.matchAll(/([sfp])(\d+)/g)].map((m) => [KIND_NAMES[m[1]], parseInt(m[2], 10)]);
    return Array.from({ length: repeat ? parseInt(repeat, 10) : 1 }, () => runs);
  });
}

// maskmap.masks_state: the view Python computed for these settings, looked up
export function masksState(cfg, s) {
  const key = masksKey(s), view = cfg.views[key];
  const [bm, bn] = s.tile.split("x").map((x) => parseInt(x, 10));
  return { key, view, bm, bn, runs: view ? decodeGrid(view.grid) : [] };
}

// Python's f"{x:.{d}f}": x's exact value rounded to d decimals, a tie to even (toFixed
// rounds a tie away from zero: 0.5625 gives "0.563" where Python writes "0.562")
export function pyFixed(x, d) {
  const exact = Math.abs(x).toFixed(100).replace(/0+$/, ""), dot = exact.indexOf(".");
  if (dot >= 0 && exact.slice(dot + 1 + d) === "5") {
    const down = exact.slice(0, d ? dot + 1 + d : dot);
    if (parseInt(down[down.length - 1], 10) % 2 === 0) return (x < 0 ? "-" : "") + down;
  }
  return x.toFixed(d);
}

export function humanFlops(x) {  // mirrors maskmap.human_flops
  for (const unit of ["", "K", "M", "G", "T", "P"]) {
    if (Math.abs(x) < 1000 || unit === "P") {
      const digits = Math.abs(x) >= 100 ? 0 : Math.abs(x) >= 10 ? 1 : 2;
      return `${pyFixed(x, digits)} ${unit}FLOP`;
    }
    x /= 1000;
  }
}

// ------------------------------------------------------------ the views

const STYLE = `
.fbx { font: 14px/1.4 system-ui, sans-serif; color: #222; max-width: 100%; }
.fbx * { box-sizing: border-box; }
.fbx .fbx-controls { display: grid; grid-template-columns: repeat(auto-fill, minmax(150px, 1fr));
  gap: 6px 14px; margin: 0 0 10px; padding: 8px; background: #f6f7f9; border-radius: 6px; }
.fbx label { display: flex; flex-direction: column; font-size: 13px; gap: 2px; }
.fbx label.fbx-check { flex-direction: row; align-items: center; gap: 6px; }
.fbx input[type=range], .fbx select, .fbx input[type=number] { width: 100%; min-height: 28px; font-size: 14px; }
.fbx input[type=number] { max-width: 6.5em; }
.fbx .fbx-figs { display: flex; flex-wrap: wrap; gap: 10px; }
.fbx .fbx-fig { flex: 1 1 300px; min-width: 0; max-width: 480px; }
.fbx svg { width: 100%; height: auto; display: block; font-size: 12px; }
.fbx .fbx-readout { display: grid; grid-template-columns: repeat(auto-fill, minmax(220px, 1fr));
  gap: 2px 14px; margin: 8px 0; font-size: 14px; }
.fbx .fbx-table-wrap { overflow-x: auto; max-width: 100%; }
.fbx table { border-collapse: collapse; font-variant-numeric: tabular-nums; font-size: 13px; margin: 4px 0 10px; }
.fbx th, .fbx td { border: 1px solid #ddd; padding: 2px 6px; text-align: right; }
.fbx caption { text-align: left; font-weight: 600; }
.fbx .fbx-bad { color: #b00020; font-weight: 600; }
.fbx .fbx-ok { color: #1b7a1b; font-weight: 600; }
.fbx .fbx-edit td { padding: 1px; }
.fbx .fbx-edit input { width: 5.5em; }
.fbx .fbx-legend { display: flex; flex-wrap: wrap; gap: 4px 14px; margin: 4px 0; font-size: 13px; }
.fbx .fbx-legend > span { display: inline-flex; align-items: center; gap: 5px; }
.fbx .fbx-swatch { display: inline-block; width: 14px; height: 14px; border: 1px solid #bbb; }
.fbx .fbx-note { font-size: 13px; margin: 4px 0; overflow-wrap: anywhere; }
.fbx .fbx-controls .fbx-wide { grid-column: span 2; }
.fbx select:disabled { opacity: 0.55; }
`;

function control(label, input) { return el("label", {}, el("span", { text: label }), input); }

function rangeInput(name, value, min, max, step) {
  return el("input", { type: "range", name, "data-fb-control": name, min, max, step, value });
}

function select(name, options, value) {
  const s = el("select", { name, "data-fb-control": name });
  for (const [v, label] of options) s.append(el("option", { value: v, text: label, selected: String(v) === String(value) }));
  return s;
}

// ---- chapter 4
function tileGridSvg(st) {
  const { n, block_q: bq, block_k: bk } = st.settings, W = 300, H = 300, sx = W / n, sy = H / n;
  const visitIndex = new Map(st.schedule.map(([i, j], k) => [`${i},${j}`, k]));
  const g = svg("svg", { viewBox: `-2 -2 ${W + 4} ${H + 22}`, role: "img", "aria-label": "tile grid" });
  const colors = TILE_COLORS;
  st.kinds.forEach((rowKinds, i) => rowKinds.forEach((kind, j) => {
    const k = visitIndex.get(`${i},${j}`), done = k !== undefined && k <= st.step;
    g.append(svg("rect", { x: j * bk * sx, y: i * bq * sy, width: Math.min(bk, n - j * bk) * sx,
      height: Math.min(bq, n - i * bq) * sy, fill: colors[kind], "fill-opacity": kind === "skipped" ? 1 : done ? 1 : 0.35,
      stroke: "#fff", "stroke-width": 0.5 }));
  }));
  if (st.current) {
    const [i, j] = st.current;
    g.append(svg("rect", { x: j * bk * sx, y: i * bq * sy, width: Math.min(bk, n - j * bk) * sx,
      height: Math.min(bq, n - i * bq) * sy, fill: "none", stroke: "#d62728", "stroke-width": 2.5, "data-fb": "current-tile" }));
  }
  g.append(svg("line", { x1: 0, x2: W, y1: (st.row + 0.5) * sy, y2: (st.row + 0.5) * sy, stroke: "#333", "stroke-dasharray": "4 3" }));
  g.append(svg("text", { x: 0, y: H + 16, text: `keys →, queries ↓; dashed: row ${st.row}` }));
  return g;
}

const TILE_COLORS = { full: "#9ecae1", partial: "#fdae6b", skipped: "#e6e6e6" };

// What the tile grid's colours mean.
function tileLegend(st) {
  const swatch = (style) => el("span", { class: "fbx-swatch", style });
  const item = (key, style, text) => el("span", { "data-fb-legend": key }, swatch(style), text);
  return el("div", { class: "fbx-legend", "data-fb-legend-for": "tiles" },
    item("full", `background:${TILE_COLORS.full}`, "visited, no mask inside"),
    item("partial", `background:${TILE_COLORS.partial}`, "visited, masked in part"),
    item("skipped", `background:${TILE_COLORS.skipped}`, "skipped (wholly masked)"),
    item("later", `background:${TILE_COLORS.full};opacity:0.35`, "pale: not visited yet"),
    item("current", "border:2.5px solid #d62728;background:none", "red outline: this step"),
    item("row", "border:0;border-top:2px dashed #333;height:0;background:none", `dashed: row ${st.row}`));
}

function traceSvg(st) {
  const W = 300, H = 150, g = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "running m and l" });
  const steps = Math.max(st.schedule.length, 1), x = (k) => 30 + (k + 0.5) * (W - 40) / steps;
  const panel = (values, top, h, color, label) => {
    g.append(svg("text", { x: 2, y: top + h / 2 + 4, fill: color, text: label, "font-weight": 600 }));
    if (!values.length) return;
    const lo = Math.min(...values), hi = Math.max(...values), span = hi - lo || 1;
    const y = (v) => top + h - 4 - (v - lo) / span * (h - 8);
    const pts = [];
    st.trace.forEach((t, k) => {
      if (k) pts.push(`${x(t[0])},${y(values[k - 1])}`);
      pts.push(`${x(t[0])},${y(values[k])}`);
    });
    g.append(svg("polyline", { points: pts.join(" "), fill: "none", stroke: color, "stroke-width": 1.5 }));
    st.trace.forEach((t, k) => g.append(svg("circle", { cx: x(t[0]), cy: y(values[k]), r: 3,
      fill: t[0] <= st.step ? color : "#fff", stroke: color })));
    g.append(svg("rect", { x: 28, y: top, width: W - 36, height: h, fill: "none", stroke: "#ccc" }));
  };
  panel(st.trace.map((t) => t[1]), 4, 62, "#4C72B0", "m");
  panel(st.trace.map((t) => t[2]), 70, 62, "#C44E52", "l");
  g.append(svg("line", { x1: x(st.step), x2: x(st.step), y1: 4, y2: 132, stroke: "#d62728" }));
  g.append(svg("text", { x: 30, y: 146, text: "step of the loop (filled: done)" }));
  return g;
}

function barsSvg(items, limit, limitLabel, label) {
  const W = 300, rowH = 22, H = items.length * rowH + 26, max = Math.max(limit || 0, ...items.map((b) => b[1])) || 1;
  const g = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": label });
  items.forEach(([name, value, color], k) => {
    const y = 4 + k * rowH;
    g.append(svg("text", { x: 0, y: y + 14, text: name }));
    g.append(svg("rect", { x: 92, y, width: Math.max(1, value / max * (W - 100)), height: rowH - 6, fill: color }));
  });
  if (limit) {
    const lx = 92 + limit / max * (W - 100);
    g.append(svg("line", { x1: lx, x2: lx, y1: 0, y2: H - 20, stroke: "#000", "stroke-width": 2 }));
    g.append(svg("text", { x: Math.min(lx, W - 150), y: H - 6, text: limitLabel }));
  }
  return g;
}

// The two counts of what one program needs, each one bar stacked by buffer, against
// the chip's limit (dashed). A bar that does not fit is outlined in red and the part
// beyond the limit is hatched red; a legend names the buffers.
function footprintSvg(rows, limit, limitLabel, colors) {
  const W = 300, left = 4, span = W - 8, barH = 18, rowH = 44, H = rows.length * rowH + 18;
  const max = Math.max(limit, ...rows.map((r) => r.total)) || 1, x = (b) => left + b / max * span;
  const g = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "on-chip bytes, stacked by buffer" });
  g.append(svg("defs", {}, svg("pattern", { id: "fbx-over", width: 6, height: 6, patternUnits: "userSpaceOnUse",
    patternTransform: "rotate(45)" }, svg("rect", { width: 6, height: 6, fill: "#f4c7cf" }),
  svg("line", { x1: 0, y1: 0, x2: 0, y2: 6, stroke: "#b00020", "stroke-width": 3 }))));
  rows.forEach((r, k) => {
    const y = 16 + k * rowH;
    g.append(svg("text", { x: left, y: y - 4, fill: r.fits ? "#222" : "#b00020", "font-weight": r.fits ? 400 : 600, "font-size": 11,
      text: `${r.label}: ${humanBytes(r.total)}, ${r.fits ? "fits" : "does NOT fit"}` }));
    const bar = svg("g", { "data-fb-bar": r.key, "data-fits": String(r.fits), "data-total": String(r.total) });
    let at = 0;
    for (const [name, bytes] of Object.entries(r.items)) {
      bar.append(svg("rect", { x: x(at), y, width: bytes / max * span, height: barH, fill: colors[name] || "#999",
        stroke: "#fff", "stroke-width": 0.5, "data-fb-segment": name, "data-bytes": String(bytes) }));
      at += bytes;
    }
    if (!r.fits && r.total > limit)
      bar.append(svg("rect", { x: x(limit), y, width: x(r.total) - x(limit), height: barH, fill: "url(#fbx-over)",
        "fill-opacity": 0.75, "data-fb-overflow": r.key }));
    bar.append(svg("rect", { x: left, y, width: x(r.total) - left, height: barH, fill: "none",
      stroke: r.fits ? "#333" : "#b00020", "stroke-width": r.fits ? 1 : 2.5, "data-fb-outline": r.key }));
    g.append(bar);
  });
  const lx = x(limit);
  g.append(svg("line", { x1: lx, x2: lx, y1: 4, y2: H - 14, stroke: "#000", "stroke-width": 1.5, "stroke-dasharray": "4 2" }));
  g.append(svg("text", { x: left, y: H - 3, "font-size": 11, text: `dashed line: ${limitLabel}` }));
  return g;
}

function footprintLegend(rows, colors) {
  const names = [...new Set(rows.flatMap((r) => Object.keys(r.items)))];
  return el("div", { class: "fbx-legend", "data-fb-legend-for": "buffers" }, ...names.map((name) =>
    el("span", { "data-fb-legend": name }, el("span", { class: "fbx-swatch", style: `background:${colors[name] || "#999"}` }), name)),
  el("span", { "data-fb-legend": "overflow" }, el("span", { class: "fbx-swatch", style: "background:repeating-linear-gradient(45deg,#b00020 0 2px,#f4c7cf 2px 5px);border-color:#b00020" }), "beyond the limit"));
}

function blocksizeView(root, cfg, store) {
  const lim = cfg.limits, s0 = store.get();
  const controls = {
    n: rangeInput("n", s0.n, ...lim.n), d: rangeInput("d", s0.d, ...lim.d),
    block_q: rangeInput("block_q", s0.block_q, ...lim.block_q), block_k: rangeInput("block_k", s0.block_k, ...lim.block_k),
    chip: select("chip", Object.keys(cfg.chips).map((c) => [c, cfg.chips[c].name]), s0.chip),
    order: select("order", Object.entries(cfg.orders).map(([o, name]) => [o, `${o.toUpperCase()}: ${name}`]), s0.order),
    causal: el("input", { type: "checkbox", name: "causal", "data-fb-control": "causal", checked: s0.causal }),
    step: rangeInput("step", s0.step, 0, 1, 1), row: rangeInput("row", s0.row, 0, s0.n - 1, 1),
    num_stages: rangeInput("num_stages", s0.num_stages, ...lim.num_stages),
  };
  const labels = {}, label = (k, text) => { labels[k] = el("span", { text }); return labels[k]; };
  const box = el("div", { class: "fbx-controls" });
  for (const [k, text] of [["n", "N"], ["d", "d"], ["block_q", "B_r"], ["block_k", "B_c"], ["chip", "chip"],
    ["order", "loop order"], ["step", "step"], ["row", "row"], ["num_stages", "kernel's stages"]]) {
    box.append(el("label", {}, label(k, text), controls[k]));
  }
  box.append(el("label", { class: "fbx-check" }, controls.causal, el("span", { text: "causal mask" })));
  const readout = el("div", { class: "fbx-readout", "aria-live": "polite" });
  const figs = el("div", { class: "fbx-figs" });
  root.append(box, readout, figs);

  const read = () => {
    const s = { ...store.get() };
    for (const k of ["n", "d", "block_q", "block_k", "step", "row", "num_stages"]) s[k] = parseInt(controls[k].value, 10);
    s.chip = controls.chip.value; s.order = controls.order.value; s.causal = controls.causal.checked;
    s.row = Math.min(s.row, s.n - 1);
    return s;
  };
  for (const c of Object.values(controls)) c.addEventListener("input", () => store.set(read()));
  for (const c of Object.values(controls)) c.addEventListener("change", () => store.set(read()));

  const draw = () => {
    const st = blocksizeState(cfg, store.get()), s = st.settings;
    root.setAttribute("data-fb-settings", JSON.stringify(s));
    controls.row.max = s.n - 1;
    controls.step.max = Math.max(st.schedule.length - 1, 1);
    for (const k of ["n", "d", "block_q", "block_k", "step", "row", "num_stages"]) controls[k].value = s[k];
    controls.chip.value = s.chip; controls.order.value = s.order; controls.causal.checked = s.causal;
    for (const [k, text] of [["n", "N"], ["d", "d"], ["block_q", "B_r"], ["block_k", "B_c"], ["row", "row"]]) labels[k].textContent = `${text} = ${s[k]}`;
    labels.step.textContent = `step = ${st.step} (0 to ${st.schedule.length - 1})`;
    const pipelined = parseInt(st.arch.slice(3), 10) >= 80;
    labels.num_stages.textContent = pipelined ? `kernel's stages = ${s.num_stages}` : `kernel's stages (none on the ${st.chipName})`;
    const flash = st.traffic[s.order], ratio = flash / st.traffic.naive;
    readout.replaceChildren(
      el("div", {}, "tiles: ", num("tiles", st.nTiles), " (", num("skipped", st.nSkipped), " skipped, ",
        num("partial", st.nPartial), " masked in part), visited: ", num("visited", st.schedule.length)),
      el("div", {}, "current tile (i, j): ", num("current", st.current ? st.current.join(",") : "", st.current ? `(${st.current.join(", ")})` : "none")),
      el("div", {}, `row ${st.row}: m = `, st.now ? num("m", st.now[1], fixed(st.now[1])) : num("m", null, "not yet"),
        ", l = ", st.now ? num("l", st.now[2], fixed(st.now[2])) : num("l", null, "not yet")),
      el("div", {}, "everything on chip (the paper's count): ", num("onchip", st.onchipTotal, humanBytes(st.onchipTotal)), " of ", num("smem", st.smemPerBlock, humanBytes(st.smemPerBlock)),
        ` per program on ${st.chipName}: `, el("span", { "data-fb": "fits", "data-value": String(st.fits), class: st.fits ? "fbx-ok" : "fbx-bad", text: st.fits ? "fits" : "does NOT fit" })),
      el("div", {}, `a kernel's shared memory (${pipelined ? `${s.num_stages} stages` : "fp32 tiles"}): `, num("kernel-smem", st.kernelTotal, humanBytes(st.kernelTotal)),
        `: `, el("span", { "data-fb": "kernel-fits", "data-value": String(st.kernelFits), class: st.kernelFits ? "fbx-ok" : "fbx-bad", text: st.kernelFits ? "fits" : "does NOT fit" })),
      el("div", {}, "HBM traffic: ", num("hbm", flash, humanBytes(flash)), ", naive ", num("hbm-naive", st.traffic.naive, humanBytes(st.traffic.naive)),
        ", ratio ", num("hbm-ratio", ratio, ratio.toFixed(2))),
      el("div", {}, "FA2 order ", num("hbm-fa2", st.traffic.fa2, humanBytes(st.traffic.fa2)), ", FA1 order ", num("hbm-fa1", st.traffic.fa1, humanBytes(st.traffic.fa1))),
    );
    const colors = cfg.buffer_colors, rows = [
      { key: "paper", label: "everything on chip", items: st.onchip, total: st.onchipTotal, fits: st.fits }];
    if (st.kernelTotal) rows.push({ key: "kernel", label: pipelined ? `a kernel's shared memory (${s.num_stages} stages)` : "a kernel's shared memory (fp32 tiles)",
      items: st.kernel, total: st.kernelTotal, fits: st.kernelFits });
    // the kernel bar models chapter 7's forward kernel (query tiles outside) in either loop
    // order, with d padded to the tile width the kernels load (flashbook.smem.tile_d)
    const width = tileD(s.d, cfg);
    const kernelNote = (pipelined
      ? `A kernel keeps S/P, O, m and l in registers: its shared memory holds the Q tile and ${s.num_stages} copies of the K and V tiles (fp16).`
      : `On the ${st.chipName} Triton has no tensor-core path: a kernel keeps fp32 copies of one product's operands at a time in shared memory (Q and K, or P and V), with no pipeline.`)
      + ` The kernel bar is chapter 7's kernel, with query tiles outside, whichever loop order is chosen`
      + (width !== null && width !== s.d ? `, and with d = ${s.d} rounded up to ${width}, the tile width the kernels load.` : ".");
    const traffic = (name, o) => [(s.order === o ? "▶ " : "") + name, st.traffic[o], s.order === o ? "#2c5d8f" : "#9bb7d4"];
    figs.replaceChildren(
      el("div", { class: "fbx-fig" }, tileGridSvg(st), tileLegend(st)),
      el("div", { class: "fbx-fig" }, traceSvg(st),
        el("p", { class: "fbx-note" }, "What one program needs, counted two ways (the bars):"),
        footprintSvg(rows, st.smemPerBlock, `the ${st.chipName}'s shared memory per program`, colors),
        footprintLegend(rows, colors),
        el("p", { class: "fbx-note" }, "Everything on chip: every buffer one program holds, one copy each, "
          + "inputs in fp16 and S/P, O, m, l in fp32 (the paper's view). " + kernelNote),
        el("p", { class: "fbx-note" }, "HBM traffic, reads and writes (▶: the loop order chosen):"),
        barsSvg([["naive", st.traffic.naive, "#999"], traffic("FA2 order", "fa2"), traffic("FA1 order", "fa1")], null, "", "HBM bytes")),
    );
  };
  store.on(draw);
  draw();
}

// ---- chapter 2
function table(name, caption, rows, rowNames, colNames) {
  const t = el("table", { "data-fb-table": name }, el("caption", { text: caption }));
  t.append(el("tr", {}, el("th"), ...colNames.map((c) => el("th", { text: c }))));
  rows.forEach((r, i) => t.append(el("tr", {}, el("th", { text: rowNames[i] }),
    ...r.map((x, j) => el("td", { "data-fb": `${name}-${i}-${j}`, "data-value": String(x), text: fixed(x) })))));
  return el("div", { class: "fbx-table-wrap" }, t);
}

function qkvView(root, cfg, store) {
  const s0 = store.get(), inputs = [];
  const editors = el("div", { class: "fbx-figs" });
  for (const m of ["Q", "K", "V"]) {
    const t = el("table", { class: "fbx-edit" }, el("caption", { text: `${m} (edit any entry)` }));
    s0[m].forEach((r, i) => t.append(el("tr", {}, el("th", { text: cfg.tokens[i] }), ...r.map((x, c) => {
      const inp = el("input", { type: "number", step: "0.05", value: x, "data-fb-control": `${m}-${i}-${c}`,
        "aria-label": `${m}[${i}][${c}]` });
      inputs.push([m, i, c, inp]);
      return el("td", {}, inp);
    }))));
    editors.append(el("div", { class: "fbx-table-wrap" }, t));
  }
  const token = select("token", cfg.tokens.map((t, i) => [i, t]), s0.token);
  const box = el("div", { class: "fbx-controls" }, control("trace token", token));
  const out = el("div", { "aria-live": "polite" });
  root.append(editors, box, out);
  const read = () => {
    const s = JSON.parse(JSON.stringify(store.get()));
    for (const [m, i, c, inp] of inputs) { const v = parseFloat(inp.value); if (Number.isFinite(v)) s[m][i][c] = v; }
    s.token = parseInt(token.value, 10);
    return s;
  };
  for (const c of [token, ...inputs.map((x) => x[3])]) { c.addEventListener("input", () => store.set(read())); c.addEventListener("change", () => store.set(read())); }
  const draw = () => {
    const s = store.get(), st = qkvState(cfg, s);
    root.setAttribute("data-fb-settings", JSON.stringify(s));
    for (const [m, i, c, inp] of inputs) if (document.activeElement !== inp && parseFloat(inp.value) !== s[m][i][c]) inp.value = s[m][i][c];
    token.value = s.token;
    const traceCols = ["q·k_j", "s_j", "m", "rescale e^(m_old-m)", "weight e^(s_j-m)", "l",
      ...cfg.vdims, ...cfg.vdims.map((v) => `o/l ${v.slice(1)}`)];
    out.replaceChildren(
      table("S", "scores S = scale · Q Kᵀ", st.S, cfg.tokens, cfg.keys),
      table("P", "weights P = softmax(S)", st.P, cfg.tokens, cfg.keys),
      table("O", "output O = P V", st.O, cfg.tokens, cfg.dims),
      table("trace", `online pass of ${cfg.tokens[s.token]}`, st.trace, cfg.keys, traceCols),
      el("p", {}, "max |online − standard| over all tokens: ", num("error", st.error, st.error.toExponential(1))),
    );
  };
  store.on(draw);
  draw();
}

// ---- chapter 9
function sweepView(root, cfg, store) {
  const s0 = store.get(), labels = { head_dim: "d", block_m: "B_r (block_m)", block_n: "B_c (block_n)", num_warps: "warps", num_stages: "stages" };
  const controls = {};
  const box = el("div", { class: "fbx-controls" });
  for (const k of SWEEP_KEYS) {
    controls[k] = select(k, cfg.options[k].map((v) => [v, String(v)]), s0[k]);
    box.append(control(labels[k], controls[k]));
  }
  const out = el("div", { "aria-live": "polite" });
  root.append(box, out);
  const read = () => Object.fromEntries(SWEEP_KEYS.map((k) => [k, parseInt(controls[k].value, 10)]));
  for (const c of Object.values(controls)) { c.addEventListener("input", () => store.set(read())); c.addEventListener("change", () => store.set(read())); }
  const draw = () => {
    const s = store.get(), { key, view: v, ranking } = sweepState(cfg, s);
    root.setAttribute("data-fb-settings", JSON.stringify(s));
    for (const k of SWEEP_KEYS) controls[k].value = s[k];
    const head = el("div", { class: "fbx-readout" });
    if (!v || !v.found) head.append(el("div", { "data-fb": "status", "data-value": "missing", text: "not in the recorded sweep" }));
    else {
      head.append(el("div", {}, "status: ", num("status", v.status)));
      if (v.status === "ok") head.append(
        el("div", {}, num("tflops", v.tflops, v.tflops.toFixed(0)), " TFLOP/s, number ", num("rank", v.rank), " of ", num("n-ran", v.n_ran)),
        el("div", {}, "registers/thread ", num("regs", v.regs, v.regs === null ? "?" : String(v.regs)), ", spilled ", num("spills", v.spills, v.spills === null ? "?" : String(v.spills))));
      else head.append(el("div", { text: v.note }));
      head.append(el("div", {}, "shared memory ", num("shared", v.shared_bytes, v.shared_bytes === null ? "?" : humanBytes(v.shared_bytes))));
    }
    const kib = (b) => (b / 1024).toFixed(1);
    const fits = el("table", { "data-fb-table": "fits" }, el("caption", { text: "the kernel's shared memory (Q, and K and V per stage: chapter 4's second bar; on the T4, one fp32 copy of a product's operands, as chapter 6 counts it): fits one program?" }),
      el("tr", {}, ...["chip", "needs (KiB)", "limit (KiB)", "fits", "from"].map((t) => el("th", { text: t }))));
    if (v) for (const name of cfg.chips) {
      const f = v.fits[name];
      fits.append(el("tr", {}, el("th", { text: name }), el("td", { "data-fb": `need-${name}`, "data-value": String(f.bytes), text: kib(f.bytes) }),
        el("td", { "data-fb": `limit-${name}`, "data-value": String(f.limit), text: kib(f.limit) }),
        el("td", { "data-fb": `fits-${name}`, "data-value": String(f.fits), class: f.fits ? "fbx-ok" : "fbx-bad", text: f.fits ? "yes" : "no" }),
        el("td", { text: f.how })));
    }
    const W = 300, H = 140, g = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "configurations that ran, fastest first" });
    const top = Math.max(1, ...ranking.map((r) => r[1])), bw = (W - 10) / Math.max(ranking.length, 1);
    ranking.forEach(([k, t], i) => g.append(svg("rect", { x: 5 + i * bw, y: 120 - t / top * 110, width: Math.max(bw - 0.5, 0.5), height: t / top * 110,
      fill: k === key.split(",").slice(1).join(",") ? "#d62728" : "#bbb" })));
    g.append(svg("text", { x: 5, y: 136, text: `TFLOP/s, fastest first (d = ${s.head_dim}; red: this)` }));
    out.replaceChildren(head, el("div", { class: "fbx-figs" }, el("div", { class: "fbx-fig" }, g),
      el("div", { class: "fbx-fig fbx-table-wrap" }, fits)));
  };
  store.on(draw);
  draw();
}

// ---- chapter 12
const MASK_KEYS = ["mask", "n", "window", "prefix", "tile"];
const KIND_LABELS = { full: "full: no mask (main)", partial: "partial: masked", skipped: "skipped" };

function maskGridSvg(cfg, s, st) {
  const { n } = s, { bm, bn, view } = st, W = 300, sx = W / n;
  const c = view.counts;
  const g = svg("svg", { viewBox: `-1 -1 ${W + 2} ${W + 20}`, role: "img", "data-fb-figure": "mask-grid",
    "aria-label": `tile grid, ${n} x ${n} in ${s.tile} tiles: ${c.skipped} skipped, ${c.full} full, ${c.partial} partial` });
  st.runs.forEach((runs, i) => {
    let j = 0;
    const y = i * bm * sx, h = Math.min(bm, n - i * bm) * sx;
    for (const [kind, count] of runs) {
      const x0 = j * bn * sx, x1 = Math.min((j + count) * bn, n) * sx;
      g.append(svg("rect", { x: x0, y, width: x1 - x0, height: h, fill: cfg.colors[kind], "data-kind": kind,
        "shape-rendering": "crispEdges" }));   // no seams between rows thinner than a pixel
      j += count;
    }
  });
  // tile edges, where the tiles are large enough on screen to show them
  const lines = svg("g", { stroke: "#fff", "stroke-width": 0.6 });
  if (bn * sx >= 3) for (let x = bn; x < n; x += bn) lines.append(svg("line", { x1: x * sx, x2: x * sx, y1: 0, y2: W }));
  if (bm * sx >= 3) for (let y = bm; y < n; y += bm) lines.append(svg("line", { x1: 0, x2: W, y1: y * sx, y2: y * sx }));
  g.append(lines);
  if (s.mask === "documents") {   // each document's own square on the diagonal
    const cu = cfg.documents[String(n)];
    for (let b = 0; b + 1 < cu.length; b++) g.append(svg("rect", { x: cu[b] * sx, y: cu[b] * sx, width: (cu[b + 1] - cu[b]) * sx,
      height: (cu[b + 1] - cu[b]) * sx, fill: "none", stroke: "#333", "stroke-width": 0.8, "stroke-dasharray": "3 2" }));
  }
  g.append(svg("rect", { x: 0, y: 0, width: W, height: W, fill: "none", stroke: "#999", "stroke-width": 0.8 }));
  g.append(svg("text", { x: 0, y: W + 14, text: `keys j → (N = ${n}); queries i ↓; tile ${bm} × ${bn}` }));
  return g;
}

function masksView(root, cfg, store) {
  const s0 = store.get(), o = cfg.options;
  const k = (x) => (x % 1024 === 0 ? `${x / 1024}K` : String(x));
  const controls = {
    mask: select("mask", o.mask.map((m) => [m, cfg.labels[m]]), s0.mask),
    n: select("n", o.n.map((x) => [x, `${k(x)} (${x})`]), s0.n),
    window: select("window", o.window.map((x) => [x, `${k(x)} (${x})`]), s0.window),
    prefix: select("prefix", o.prefix.map((x) => [x, `${k(x)} (${x})`]), s0.prefix),
    tile: select("tile", o.tile.map((t) => [t, t.replace("x", " × ")]), s0.tile),
  };
  const wide = control("mask", controls.mask);
  wide.classList.add("fbx-wide");
  const box = el("div", { class: "fbx-controls" }, wide, control("sequence length N", controls.n),
    control("tile B_r × B_c", controls.tile), control("window W (keys)", controls.window),
    control("prefix (keys)", controls.prefix));
  const out = el("div", { "aria-live": "polite" });
  root.append(box, out);
  const read = () => ({ mask: controls.mask.value, n: parseInt(controls.n.value, 10), window: parseInt(controls.window.value, 10),
    prefix: parseInt(controls.prefix.value, 10), tile: controls.tile.value });
  for (const c of Object.values(controls)) { c.addEventListener("input", () => store.set(read())); c.addEventListener("change", () => store.set(read())); }
  const draw = () => {
    const s = store.get(), st = masksState(cfg, s), v = st.view;
    root.setAttribute("data-fb-settings", JSON.stringify(s));
    for (const key of MASK_KEYS) controls[key].value = String(s[key]);
    controls.window.disabled = s.mask !== "window";
    controls.prefix.disabled = s.mask !== "prefix";
    if (!v) { out.replaceChildren(el("p", { "data-fb": "status", "data-value": "missing", text: `no view for ${st.key}` })); return; }
    const c = v.counts, f = v.flops;
    const legend = el("div", { class: "fbx-legend" }, ...["full", "partial", "skipped"].map((kind) =>
      el("span", {}, el("span", { class: "fbx-swatch", style: `background:${cfg.colors[kind]}` }), `${KIND_LABELS[kind]} (${c[kind]})`)));
    const row = (label, name, value, text) => el("tr", {}, el("th", { text: label }), el("td", {}, num(name, value, text)));
    const pct = (x) => `${pyFixed(100 * x, 1)} %`;
    const t = el("table", { "data-fb-table": "mask-counts" }, el("caption", { text: "what a kernel computes" }),
      row("tiles skipped", "skipped", c.skipped), row("tiles full (no mask)", "full", c.full),
      row("tiles partial (masked)", "partial", c.partial), row("tiles visited", "visited", c.visited),
      row("tiles in all", "total", c.total),
      row("share of tiles computed", "work-fraction", c.work_fraction, pyFixed(c.work_fraction, 3)),
      row("FLOPs of the visited tiles", "flops-visited", f.visited, humanFlops(f.visited)),
      row("FLOPs of the full N × N", "flops-full", f.full, humanFlops(f.full)),
      row("FLOPs saved", "flops-saved", f.saved, humanFlops(f.saved)),
      row("share of FLOPs saved", "flops-saved-fraction", f.saved_fraction, pct(f.saved_fraction)),
      row("share of pairs the mask allows", "allowed-fraction", v.allowed_fraction, pyFixed(v.allowed_fraction, 3)));
    const notes = [el("p", { class: "fbx-note" }, "The same counts in Python: ", el("code", { "data-fb": "call", "data-value": v.call, text: v.call }), ".")];
    if (s.mask === "documents") {
      const cu = cfg.documents[String(s.n)], lengths = cu.slice(1).map((x, b) => x - cu[b]);
      notes.push(el("p", { class: "fbx-note" }, `${lengths.length} packed documents, a fixed set of lengths drawn with seed ${cfg.doc_seed}: `,
        num("doc-lengths", lengths.join(","), lengths.join(", ")), " (dashed: each document's square); ",
        el("code", { text: `ids = masks.doc_ids_from_cu_seqlens([${cu.join(", ")}])` }), "."));
    }
    notes.push(el("p", { class: "fbx-note" }, `FLOPs: the forward's Q Kᵀ and P V, 2 per multiply-add, so 4 · N² · d for the full N × N, per head, at d = ${cfg.head_dim}. `
      + "A visited tile costs all its B_r · B_c pairs, masked or not; the allowed pairs are what the mask keeps."));
    out.replaceChildren(el("div", { class: "fbx-figs" },
      el("div", { class: "fbx-fig" }, maskGridSvg(cfg, s, st), legend),
      el("div", { class: "fbx-fig fbx-table-wrap" }, t)), ...notes);
  };
  store.on(draw);
  draw();
}

const VIEWS = { blocksize: blocksizeView, qkv: qkvView, sweep: sweepView, masks: masksView };

// A store over plain settings: {get, set, on}. The widget's store writes through to
// the model (and so to Python); the static page's keeps them in the page.
function localStore(settings) {
  let value = settings; const subs = [];
  return { get: () => value, set: (v) => { value = v; subs.forEach((f) => f()); }, on: (f) => subs.push(f) };
}

function modelStore(model) {
  const subs = [];
  return {
    get: () => model.get("settings"),
    set: (v) => { model.set("settings", v); model.save_changes(); },
    on: (f) => { subs.push(f); model.on("change:settings", f); },
    off: () => subs.forEach((f) => model.off("change:settings", f)),
  };
}

export function mount(el_, kind, cfg, store) {
  const view = VIEWS[kind];
  if (!view) throw new Error(`unknown explorer kind ${kind}`);
  const root = el("div", { class: "fbx", "data-fb-explorer": kind });
  root.append(el("style", { text: STYLE }));
  el_.replaceChildren(root);
  view(root, cfg, store);
  return root;
}

// The static book: every placeholder <div class="flashbook-explorer"> holds its config.
export function mountStatic(doc = document) {
  for (const div of doc.querySelectorAll("div.flashbook-explorer:not([data-mounted])")) {
    const cfg = JSON.parse(div.querySelector('script[type="application/json"]').textContent);
    div.setAttribute("data-mounted", "");
    mount(div, div.dataset.kind, cfg, localStore(cfg.settings));
  }
}

export default {
  render({ model, el: target }) {
    const store = modelStore(model);
    mount(target, model.get("kind"), model.get("config"), store);
    return () => store.off();   // the view is gone: stop redrawing it
  },
};
