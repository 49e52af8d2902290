// Figure drawing: canvases for images and maps, SVG for charts, text at 18 px or more (a projector at the back of a
// room). Each function takes plain arrays and returns an element; none computes an analysis.

const SVG = "http://www.w3.org/2000/svg";
export const FONT = 18;

/** A perceptual dark-to-bright colour scale (inferno-like): t in [0, 1] -> [r, g, b]. */
const STOPS = [[0, 0, 4], [40, 11, 84], [101, 21, 110], [159, 42, 99], [212, 72, 66], [245, 125, 21], [250, 193, 39], [252, 255, 164]];
export function colour(t) {
  t = Math.min(1, Math.max(0, Number.isFinite(t) ? t : 0)) * (STOPS.length - 1);
  const i = Math.min(Math.floor(t), STOPS.length - 2), f = t - i;
  return STOPS[i].map((v, c) => Math.round(v + f * (STOPS[i + 1][c] - v)));
}

/** Min-max scale for display only (a constant map shows mid-grey). */
export function scaled(values) {
  let lo = Infinity, hi = -Infinity;
  for (const v of values) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
  return Array.from(values, (v) => (hi > lo ? (v - lo) / (hi - lo) : 0.5));
}

export function canvas(width, height, label) {
  const c = document.createElement("canvas");
  c.width = width; c.height = height;
  c.setAttribute("role", "img");
  c.setAttribute("aria-label", label);
  return c;
}

/** The crop (H, W, 3) drawn on a canvas of `size` px, optionally with a map (N,) over the patch grid, the grid's
 * lines, framed patches {k: colour} and greyed patches (a Set). */
export function imageFigure(crop, [h, w], grid, size, { map = null, lines = false, frames = {}, greyed = null, label = "the image" } = {}) {
  const c = canvas(size, Math.round((size * h) / w), label), ctx = c.getContext("2d");
  const img = new ImageData(w, h);
  for (let i = 0; i < w * h; i++) { img.data.set(crop.subarray(i * 3, i * 3 + 3), i * 4); img.data[i * 4 + 3] = 255; }
  const tmp = document.createElement("canvas");
  tmp.width = w; tmp.height = h; tmp.getContext("2d").putImageData(img, 0, 0);
  ctx.imageSmoothingEnabled = false;
  ctx.drawImage(tmp, 0, 0, c.width, c.height);
  const [gh, gw] = grid, cw = c.width / gw, ch = c.height / gh;
  if (map) {
    const t = scaled(map);
    for (let k = 0; k < gh * gw; k++) {
      const [r, g, b] = colour(t[k]);
      ctx.fillStyle = `rgba(${r},${g},${b},0.72)`;
      ctx.fillRect((k % gw) * cw, Math.floor(k / gw) * ch, cw, ch);
    }
  }
  if (greyed) {
    ctx.fillStyle = "rgba(128,128,128,0.85)";
    for (const k of greyed) ctx.fillRect((k % gw) * cw, Math.floor(k / gw) * ch, cw, ch);
  }
  if (lines) { // a light line on a dark one: the grid shows on a white drawing and on a dark photo alike
    for (const [stroke, width] of [["rgba(0,0,0,0.55)", 3], ["rgba(255,255,255,0.9)", 1]]) {
      ctx.strokeStyle = stroke; ctx.lineWidth = width;
      for (let i = 1; i < gw; i++) { ctx.beginPath(); ctx.moveTo(i * cw, 0); ctx.lineTo(i * cw, c.height); ctx.stroke(); }
      for (let i = 1; i < gh; i++) { ctx.beginPath(); ctx.moveTo(0, i * ch); ctx.lineTo(c.width, i * ch); ctx.stroke(); }
    }
  }
  for (const [k, stroke] of Object.entries(frames)) {
    ctx.strokeStyle = stroke; ctx.lineWidth = 3;
    ctx.strokeRect((k % gw) * cw + 1.5, Math.floor(k / gw) * ch + 1.5, cw - 3, ch - 3);
  }
  return c;
}

/** The patch (0..N-1) under a click on a figure made by imageFigure. */
export function patchAt(event, element, grid) {
  const r = element.getBoundingClientRect();
  const col = Math.floor(((event.clientX - r.left) / r.width) * grid[1]), row = Math.floor(((event.clientY - r.top) / r.height) * grid[0]);
  return Math.min(grid[0] - 1, Math.max(0, row)) * grid[1] + Math.min(grid[1] - 1, Math.max(0, col));
}

/** Small RGB images (k, ph, pw, 3) each min-max scaled, in a grid with a caption under each. */
export function tileGrid(data, count, [ph, pw], columns, tile, captions) {
  const rows = Math.ceil(count / columns), captionH = captions ? FONT + 6 : 0;
  const c = canvas(columns * (tile + 6), rows * (tile + 6 + captionH), "a grid of filters");
  if (captions) c.dataset.text = "1"; // its captions are figure text (tools/benchmarks/web_lesson.py measures them)
  const ctx = c.getContext("2d");
  ctx.font = `${FONT}px sans-serif`; ctx.textAlign = "center"; ctx.fillStyle = "#222";
  const cell = tile / Math.max(ph, pw);
  for (let i = 0; i < count; i++) {
    const values = data.subarray(i * ph * pw * 3, (i + 1) * ph * pw * 3), t = scaled(values);
    const x0 = (i % columns) * (tile + 6), y0 = Math.floor(i / columns) * (tile + 6 + captionH);
    for (let p = 0; p < ph * pw; p++) {
      const [r, g, b] = [0, 1, 2].map((ch) => Math.round(255 * t[p * 3 + ch]));
      ctx.fillStyle = `rgb(${r},${g},${b})`;
      ctx.fillRect(x0 + (p % pw) * cell, y0 + Math.floor(p / pw) * cell, Math.ceil(cell), Math.ceil(cell));
    }
    if (captions) { ctx.fillStyle = "#222"; ctx.fillText(captions[i], x0 + tile / 2, y0 + tile + FONT + 2); }
  }
  return c;
}

/** Maps (count, gh, gw) side by side, each min-max scaled, with captions and an optional frame on one; given
 * `under` ({crop (H, W, 3), size [H, W]}), each map is drawn over the image, as imageFigure draws one map. */
export function mapGrid(maps, count, grid, columns, tile, captions, framed = -1, under = null) {
  const [gh, gw] = grid, captionH = captions ? FONT + 6 : 0, gap = captions ? 8 : 2;
  const rows = Math.ceil(count / columns);
  const c = canvas(columns * (tile + gap), rows * (tile + gap + captionH), "a grid of maps"), ctx = c.getContext("2d");
  if (captions) c.dataset.text = "1";
  ctx.font = `${FONT}px sans-serif`; ctx.textAlign = "center";
  const picture = under ? imageFigure(under.crop, under.size, grid, tile) : null;
  for (let i = 0; i < count; i++) {
    const t = scaled(maps.subarray ? maps.subarray(i * gh * gw, (i + 1) * gh * gw) : maps[i]);
    const x0 = (i % columns) * (tile + gap), y0 = Math.floor(i / columns) * (tile + gap + captionH);
    if (picture) ctx.drawImage(picture, x0, y0, tile, tile);
    for (let k = 0; k < gh * gw; k++) {
      const [r, g, b] = colour(t[k]);
      ctx.fillStyle = picture ? `rgba(${r},${g},${b},0.72)` : `rgb(${r},${g},${b})`;
      ctx.fillRect(x0 + ((k % gw) * tile) / gw, y0 + (Math.floor(k / gw) * tile) / gh, Math.ceil(tile / gw), Math.ceil(tile / gh));
    }
    if (i === framed) { ctx.strokeStyle = "#0af"; ctx.lineWidth = 3; ctx.strokeRect(x0 + 1.5, y0 + 1.5, tile - 3, tile - 3); }
    if (captions) { ctx.fillStyle = "#222"; ctx.fillText(captions[i], x0 + tile / 2, y0 + tile + FONT + 2); }
  }
  return c;
}

function svgElement(name, attributes = {}, text = null) {
  const e = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attributes)) e.setAttribute(k, v);
  if (text !== null) e.textContent = text;
  return e;
}

/** A line or scatter chart: series [{points: [[x, y]], colour, dots?, dashed?, label?}], axes titled. */
export function chart(series, { width = 460, height = 340, xLabel = "", yLabel = "", xTicks = null, yMax = null, yMin = 0, label = "a chart" } = {}) {
  const svg = svgElement("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": label, "font-size": FONT });
  const m = { l: 64, r: 14, t: 12, b: 58 };
  const xs = series.flatMap((s) => s.points.map((p) => p[0])), ys = series.flatMap((s) => s.points.map((p) => p[1]));
  const x0 = Math.min(...xs), x1 = Math.max(...xs), y1 = (yMax ?? Math.max(...ys) * 1.08) || 1;
  const X = (x) => m.l + ((x - x0) / (x1 - x0 || 1)) * (width - m.l - m.r);
  const Y = (y) => height - m.b - ((y - yMin) / (y1 - yMin || 1)) * (height - m.t - m.b);
  svg.append(svgElement("line", { x1: m.l, y1: Y(yMin), x2: width - m.r, y2: Y(yMin), stroke: "#444" }));
  svg.append(svgElement("line", { x1: m.l, y1: Y(yMin), x2: m.l, y2: m.t, stroke: "#444" }));
  for (const t of xTicks || [...new Set(xs)]) {
    const [v, name] = Array.isArray(t) ? t : [t, String(t)];
    svg.append(svgElement("text", { x: X(v), y: height - m.b + FONT + 4, "text-anchor": "middle" }, name));
  }
  for (const v of [yMin, (yMin + y1) / 2, y1]) {
    svg.append(svgElement("text", { x: m.l - 6, y: Y(v) + 6, "text-anchor": "end" }, v >= 10 ? v.toFixed(0) : v.toFixed(2)));
  }
  svg.append(svgElement("text", { x: (m.l + width - m.r) / 2, y: height - 6, "text-anchor": "middle" }, xLabel));
  svg.append(svgElement("text", { x: 16, y: (m.t + height - m.b) / 2, "text-anchor": "middle", transform: `rotate(-90 16 ${(m.t + height - m.b) / 2})` }, yLabel));
  for (const s of series) {
    if (s.band) {
      const upper = s.points.map(([x, y], i) => `${X(x)},${Y(y + s.band[i])}`), lower = s.points.map(([x, y], i) => `${X(x)},${Y(Math.max(yMin, y - s.band[i]))}`).reverse();
      svg.append(svgElement("polygon", { points: [...upper, ...lower].join(" "), fill: s.colour, opacity: 0.18 }));
    }
    if (s.dots) {
      for (const [x, y] of s.points) {
        svg.append(s.cross
          ? svgElement("path", { d: `M${X(x) - 7},${Y(y) - 7}L${X(x) + 7},${Y(y) + 7}M${X(x) - 7},${Y(y) + 7}L${X(x) + 7},${Y(y) - 7}`, stroke: s.colour, "stroke-width": 3 })
          : svgElement("circle", { cx: X(x), cy: Y(y), r: 6, fill: s.colour, opacity: 0.75 }));
      }
    } else {
      svg.append(svgElement("polyline", { points: s.points.map(([x, y]) => `${X(x)},${Y(y)}`).join(" "), fill: "none", stroke: s.colour,
        "stroke-width": 3, "stroke-dasharray": s.dashed ? "8 6" : "none" }));
    }
  }
  // Labels as a legend at the top right, one line each: at the curves' ends they overlap where the curves meet.
  series.filter((s) => s.label).forEach((s, i) => {
    svg.append(svgElement("text", { x: width - m.r, y: m.t + FONT * (i + 1), "text-anchor": "end", fill: s.colour }, s.label));
  });
  return svg;
}

/** Horizontal bars: [{text, value in [0, 1]}], each bar labelled with its text. */
export function bars(items, { width = 460, label = "a bar chart" } = {}) {
  const row = FONT * 2.4, height = items.length * row + 8;
  const svg = svgElement("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": label, "font-size": FONT });
  items.forEach((item, i) => {
    const y = 4 + i * row;
    svg.append(svgElement("rect", { x: 0, y, width: Math.max(2, item.value * width), height: row - 8, fill: i === 0 ? "#e4572e" : "#9aa5b1", rx: 3 }));
    svg.append(svgElement("text", { x: 8, y: y + row / 2 + 2, fill: "#111", "font-weight": i === 0 ? "bold" : "normal" }, item.text));
  });
  return svg;
}

/** A table of rows of cells, as an SVG (so its text is the figure's size wherever it is shown). */
export function table(rows, widths, { label = "a table" } = {}) {
  const row = FONT * 1.8, width = widths.reduce((a, b) => a + b, 0), height = rows.length * row + 4;
  const svg = svgElement("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": label, "font-size": FONT });
  rows.forEach((cells, i) => {
    let x = 0;
    cells.forEach((cell, j) => {
      svg.append(svgElement("text", { x: x + 4, y: 4 + (i + 0.7) * row, "font-weight": i === 0 ? "bold" : "normal" }, cell));
      x += widths[j];
    });
  });
  return svg;
}
