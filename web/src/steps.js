// Each lesson step's figure and controls, computed in the browser from the current image's pass. A step function
// takes the app (state, model, site data) and returns {figure, controls, text}; it never runs the model itself except
// through the app's cached helpers (app.why, app.intervene), so a control change redraws without a new forward pass.

import * as A from "./analyses.js";
import * as F from "./figures.js";
import * as L from "./lesson.js";

const FIG = 460; // px: the main figure's side at 1280 x 720
const PAIR = 340; // px: each of steps 9 and 10's two figures, side by side in their wider stage (style.css)

function select(label, options, value, onChange, id) {
  const wrap = document.createElement("label");
  wrap.className = "control";
  wrap.textContent = `${label} `;
  const s = document.createElement("select");
  s.id = id;
  options.forEach(([v, text]) => { const o = new Option(text, v); o.selected = String(v) === String(value); s.append(o); });
  s.addEventListener("change", () => onChange(s.value));
  wrap.append(s);
  return wrap;
}

function slider(label, min, max, value, onChange, id) {
  const wrap = document.createElement("label");
  wrap.className = "control";
  wrap.innerHTML = `${label} <output>${value}</output> `;
  const s = Object.assign(document.createElement("input"), { type: "range", min, max, value, id });
  s.addEventListener("input", () => { wrap.querySelector("output").textContent = s.value; onChange(Number(s.value)); });
  wrap.append(s);
  return wrap;
}

function button(text, onClick, pressed = null) {
  const b = document.createElement("button");
  b.textContent = text;
  if (pressed !== null) b.setAttribute("aria-pressed", String(pressed));
  b.addEventListener("click", onClick);
  return b;
}

function caption(text) {
  const p = document.createElement("p");
  p.className = "caption";
  p.textContent = text;
  return p;
}

function box(...children) {
  const d = document.createElement("div");
  d.className = "figure-row";
  d.append(...children.filter(Boolean));
  return d;
}

const layerOptions = (g) => [...Array(g.L).keys()].map((l) => [l, `${l}`]);

// 1. The image and its patches
export function patches(app) {
  const { g, s, image } = app;
  const k = s.patch ?? L.centrePatch(g);
  const fig = F.imageFigure(image.crop, g.imgSize, g.grid, FIG, { lines: true, frames: { [k]: "#0af" }, label: "the image cut into patches" });
  fig.addEventListener("click", (e) => { s.patch = F.patchAt(e, fig, g.grid); app.render(); });
  return { figure: box(fig), controls: [caption(`Click a patch: ${L.where(k, g.grid)} is framed.`)],
    text: L.imageAndPatches(g, image.name, image.size) };
}

// 2. A patch becomes a vector
export function filters(app) {
  const { g, s, site } = app;
  const raw = s.filterView === "raw";
  const pca = site.figures.filters_pca, explained = site.figures.filters_pca_explained.array;
  const k = pca.shape[0];
  const fig = raw
    ? F.tileGrid(site.figures.filters.array, Math.min(48, site.figures.filters.shape[0]), g.patchSize, 8, 48, null)
    : F.tileGrid(pca.array, k, g.patchSize, 7, 52, Array.from(explained, (v) => `${(100 * v).toFixed(1)}%`));
  const controls = [button("Principal components", () => { s.filterView = "pca"; app.render(); }, !raw),
    button("Raw filters", () => { s.filterView = "raw"; app.render(); }, raw)];
  return { figure: box(fig), controls, text: L.patchToVector(g, app.site.info.geometry.embed_dim, Array.from(explained)) };
}

// 3. Where it is: position embeddings
export function positions(app) {
  const { g, s, site } = app;
  const sim = site.figures.pos_embed_similarity;
  const k = s.posPatch ?? L.centrePatch(g);
  if (!sim) return { figure: caption("This model has no learned position embedding."), controls: [], text: L.imageAndPatches(g, app.image.name, app.image.size) };
  const [gh, gw] = g.grid, tile = Math.floor(FIG / gw) - 2;
  const fig = F.mapGrid(sim.array, g.N, g.grid, gw, tile, null, k);
  fig.addEventListener("click", (e) => { s.posPatch = F.patchAt(e, fig, [gh, gw]); app.render(); });
  const similarity = sim.array.subarray(k * g.N, (k + 1) * g.N);
  return { figure: box(fig), controls: [caption(`Tile k: patch k's position against every position. Framed: ${L.where(k, g.grid)}; click another.`)],
    text: L.whereItIs(g, similarity, k) };
}

const queryOptions = (g) => [...g.prefixNames.map((name, i) => [i, name]), ...[...Array(g.N).keys()].map((k) => [g.P + k, `patch ${k}`])];

// 4. Attention: one head
export function oneHead(app) {
  const { g, s, image } = app;
  const amap = A.attentionRow(image.result.attention, g, s.layer, s.head, s.query);
  const frames = s.query >= g.P ? { [s.query - g.P]: "#0af" } : {};
  const fig = F.imageFigure(image.crop, g.imgSize, g.grid, FIG, { map: amap.map, frames, label: "attention of one head" });
  fig.addEventListener("click", (e) => { s.query = g.P + F.patchAt(e, fig, g.grid); app.render(); });
  const controls = [
    select("Layer", layerOptions(g), s.layer, (v) => { s.layer = Number(v); app.render(); }, "layer"),
    select("Head", [...Array(g.H).keys()].map((h) => [h, `${h}`]), s.head, (v) => { s.head = Number(v); app.render(); }, "head"),
    select("Query", queryOptions(g), s.query, (v) => { s.query = Number(v); app.render(); }, "query"),
    caption(`Click a patch to make it the query. To prefix tokens: ${L.pct(amap.prefixShare)}.`),
  ];
  return { figure: box(fig), controls, text: L.oneHead(g, s.layer, s.head, s.query, amap) };
}

// 5. Attention: all the heads of a layer
export function allHeads(app) {
  const { g, s, image } = app;
  const maps = [...Array(g.H).keys()].map((h) => A.attentionRow(image.result.attention, g, s.layer, h, s.query).map);
  const mean = A.attentionRow(image.result.attention, g, s.layer, null, s.query).map;
  const columns = Math.ceil(Math.sqrt(g.H + 1)), tile = Math.floor(FIG / columns) - 10;
  const fig = F.mapGrid([...maps, mean], g.H + 1, g.grid, columns, tile, [...maps.map((_, h) => `head ${h}`), "mean"], -1,
    { crop: image.crop, size: g.imgSize });
  const controls = [select("Layer", layerOptions(g), s.layer, (v) => { s.layer = Number(v); app.render(); }, "layer"),
    select("Query", queryOptions(g), s.query, (v) => { s.query = Number(v); app.render(); }, "query")];
  return { figure: box(fig), controls, text: L.allHeads(g, s.layer, s.query, maps) };
}

// 6. Attention through the layers
export function throughLayers(app) {
  const { g, s, image } = app;
  const last = Math.min(s.rolloutLayer ?? g.L - 1, g.L - 1);
  const rolled = app.cached(`rollout-${last}`, () => A.rollout(image.result.attention, g, last));
  const fig = F.imageFigure(image.crop, g.imgSize, g.grid, FIG, { map: rolled, label: "attention rollout" });
  const controls = [slider("Roll out up to layer", 0, g.L - 1, last, (v) => { s.rolloutLayer = v; app.render(); }, "rollout-layer")];
  const first = app.cached("rollout-0", () => A.rollout(image.result.attention, g, 0));
  const every = app.cached(`rollout-${g.L - 1}`, () => A.rollout(image.result.attention, g, g.L - 1));
  return { figure: box(fig), controls, text: L.throughLayers(g, last, rolled, first, every) };
}

// 7. How far the heads look
export function distance(app) {
  const { g, image } = app;
  const mad = app.cached("mad", () => A.meanAttentionDistance(image.result.attention, g));
  const uniform = A.uniformDistance(g);
  const dots = [];
  for (let l = 0; l < g.L; l++) for (let h = 0; h < g.H; h++) dots.push([l, mad[l * g.H + h]]);
  const seen = app.madSeen();
  const series = [{ points: dots, colour: "#1f77b4", dots: true },
    { points: [[0, uniform], [g.L - 1, uniform]], colour: "#666", dashed: true, label: "even" }];
  if (seen.length > 1) {
    const avg = [...Array(g.L).keys()].map((l) => [l, seen.reduce((a, m) => a + m.slice(l * g.H, (l + 1) * g.H).reduce((x, y) => x + y, 0) / g.H, 0) / seen.length]);
    series.push({ points: avg, colour: "#e4572e", dots: true, cross: true });
  }
  const fig = F.chart(series, { width: FIG, height: 380, xLabel: "block", yLabel: "mean distance (px)", yMax: Math.max(uniform, ...mad) * 1.1, label: "mean attention distance" });
  return { figure: box(fig), controls: [caption("Each dot is one head of this image; the dashed line is attention spread evenly.")],
    text: L.howFar(g, mad, uniform, seen.length) };
}

// 8. The prediction
export function prediction(app) {
  const { g, image } = app;
  const preds = image.preds.slice(0, 5);
  const fig = F.bars(preds.map((p) => ({ text: A.predictionText(p.label, p.prob), value: p.prob })), { width: FIG, label: "the prediction" });
  return { figure: box(fig), controls: [caption(`Top ${preds.length} of ${g.C} classes; the bars are probabilities.`)], text: L.prediction(g, preds, app.outside()) };
}

export const METHODS = { rollout: "Rollout", raw: "Raw attention", occlusion: "Patch occlusion" };

// 9. Why this prediction?
export function why(app) {
  const { g, s, image } = app;
  const target = image.preds[0];
  const method = s.method || "rollout";
  const relevance = app.relevance(method);
  const controls = [select("Method", Object.entries(METHODS), method, (v) => { s.method = v; app.render(); }, "method")];
  if (!relevance) return { figure: caption("Computing the map..."), controls, text: L.why(g, target.label, METHODS[method], new Float64Array(g.N), null) };
  const map = F.imageFigure(image.crop, g.imgSize, g.grid, PAIR, { map: relevance, label: `${METHODS[method]} map` });
  const test = app.deletion(method);
  let curve = caption("Running the deletion test...");
  if (test) {
    const x = (k) => k / test.curve.length;
    curve = F.chart([
      { points: test.randomMean.map((v, k) => [x(k), v]), band: test.randomSpread, colour: "#777", label: "random" },
      { points: test.curve.map((v, k) => [x(k), v]), colour: "#e4572e", label: METHODS[method] },
    ], { width: PAIR, height: PAIR - 20, xLabel: "share deleted", yLabel: `p(${target.label})`, yMax: 1, label: "deletion test",
      xTicks: [[0, "0"], [0.5, "0.5"], [0.9, "0.9"]] });
  }
  const verdict = test ? caption(`Deletion test: ${test.verdict.label} (AUC ${test.auc.toFixed(3)}, random ${test.verdict.randomMean.toFixed(3)} ± ${test.verdict.randomStd.toFixed(3)}).`) : null;
  return { figure: box(map, curve), controls: [...controls, verdict].filter(Boolean), text: L.why(g, target.label, METHODS[method], relevance, test) };
}

// 10. Going further: interventions and the logit lens
export function further(app) {
  const { g, s, image } = app;
  const after = app.intervened();
  const shown = after || image;
  const fig = F.imageFigure(image.crop, g.imgSize, g.grid, PAIR, { greyed: s.dropped, lines: true, label: "click patches to drop them" });
  fig.addEventListener("click", (e) => { const k = F.patchAt(e, fig, g.grid);
    if (s.dropped.has(k)) s.dropped.delete(k);
    else if (s.dropped.size < g.N - 1) s.dropped.add(k); // one patch stays: a sequence of the class token alone says little
    app.intervene();
  });
  const tops = A.lensTops(shown.result.lens, g.L + 1, g.C);
  const rows = [["after", "top class"], ...tops.map((t, r) => [r === 0 ? "emb" : `${r - 1}`, A.predictionText(app.label(t.index), t.prob)])];
  let side = F.table(rows, [110, 230], { label: "logit lens" });
  if (s.furtherView === "norms") { // the image's own tokens (no intervention): their norms after the chosen block
    const row = s.normsRow ?? g.L, norms = image.result.norms.subarray(row * g.T, (row + 1) * g.T);
    const high = A.highNormPatches(norms, g);
    const frames = Object.fromEntries(high.flatMap((h, k) => (h ? [[k, "#e4572e"]] : [])));
    side = F.imageFigure(image.crop, g.imgSize, g.grid, PAIR, { map: norms.slice(g.P, g.P + g.N), frames, label: "token norms" });
  }
  const heads = document.createElement("div");
  heads.className = "heads";
  heads.append(caption("Heads on (click to silence):"));
  for (let l = 0; l < g.L; l++) {
    const row = document.createElement("div");
    row.append(`${l}: `);
    for (let h = 0; h < g.H; h++) {
      const key = `${l}:${h}`;
      row.append(button(`${h}`, () => { s.silenced.has(key) ? s.silenced.delete(key) : s.silenced.add(key); app.intervene(); }, !s.silenced.has(key)));
    }
    heads.append(row);
  }
  const before = image.preds[0];
  const now = after ? A.predictionText(app.label(after.preds[0].index), after.preds[0].prob) : A.predictionText(before.label, before.prob);
  const pc = after ? after.probs[before.index] : before.prob;
  const summary = caption(`${s.dropped.size} patches dropped, ${s.silenced.size} heads silenced: ${now}; p(${before.label}) ${L.pct(before.prob)} -> ${L.pct(pc)}.`);
  summary.id = "intervention";
  const reset = button("Undo all", () => { s.dropped.clear(); s.silenced.clear(); app.intervene(); });
  const settled = A.settledRow(A.lensTops(image.result.lens, g.L + 1, g.C).map((t) => t.index));
  const views = [button("Logit lens", () => { s.furtherView = "lens"; app.render(); }, s.furtherView !== "norms"),
    button("Token norms", () => { s.furtherView = "norms"; app.render(); }, s.furtherView === "norms")];
  if (s.furtherView === "norms") {
    const row = s.normsRow ?? g.L;
    const high = A.highNormPatches(image.result.norms.subarray(row * g.T, (row + 1) * g.T), g).filter(Boolean).length;
    views.push(select("Tokens after block", [...Array(g.L + 1).keys()].map((r) => [r, r === 0 ? "emb" : `${r - 1}`]), row,
      (v) => { s.normsRow = Number(v); app.render(); }, "norms-row"), caption(`${high} high-norm patches (framed).`));
  }
  return { figure: box(fig, side), controls: [...views, summary, heads, reset], text: L.goingFurther(g, before.label, settled) };
}

export const STEP_VIEWS = [patches, filters, positions, oneHead, allHeads, throughLayers, distance, prediction, why, further];
