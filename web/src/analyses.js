// The analyses of docs/spec/analyses.md, computed in the browser: pure functions of typed arrays, no DOM.
// The same definitions as vit_core.analyses and vit_core.explain (tests/browser/test_web_lesson_browser.py runs them
// on the library's arrays and compares). Conventions: a token axis has T = P + N entries, P prefix tokens first, then
// the N = gh*gw patches row-major; an attention array of one image is (L, H, T, T) flattened row-major, rows = queries.

/** Softmax over logits (C,), in float64: -> Float64Array (C,). */
export function softmax(logits) {
  let max = -Infinity;
  for (const v of logits) max = Math.max(max, v);
  const e = Float64Array.from(logits, (v) => Math.exp(v - max));
  const total = e.reduce((a, b) => a + b, 0);
  return e.map((v) => v / total);
}

/** The k most probable classes, best first, ties by the lower index: [{index, prob}]. */
export function topK(probs, k) {
  const order = Array.from(probs.keys()).sort((a, b) => probs[b] - probs[a] || a - b);
  return order.slice(0, Math.min(k, probs.length)).map((index) => ({ index, prob: probs[index] }));
}

/** "<class> (NN.N%)": how the page says a prediction. */
export function predictionText(label, prob) {
  return `${label} (${(100 * prob).toFixed(1)}%)`;
}

/** Python's round(): halves to even (the deletion test's counts use it). */
export function roundHalfEven(x) {
  const r = Math.round(x);
  return Math.abs(x % 1) === 0.5 && r % 2 !== 0 ? r - 1 : r;
}

/** Attention of one query to every patch: (gh*gw,) Float64Array and the share that goes to prefix tokens.
 * head = null: the mean over heads. */
export function attentionRow(att, g, layer, head, query) {
  const { T, P, N, H } = g;
  const heads = head === null ? [...Array(H).keys()] : [head];
  const row = new Float64Array(T);
  for (const h of heads) {
    const base = ((layer * H + h) * T + query) * T;
    for (let j = 0; j < T; j++) row[j] += att[base + j] / heads.length;
  }
  let prefix = 0;
  for (let j = 0; j < P; j++) prefix += row[j];
  return { map: row.slice(P, P + N), prefixShare: prefix };
}

/** Attention rollout (Abnar & Zuidema 2020): R = A_last ... A_0, A_l = rownorm(0.5 * mean_h(att[l]) + 0.5 * I); the
 * class token's row of R (without a class token: the mean of the patch rows) over the patch keys -> (N,), unscaled.
 * Only the needed row is carried: r^T = e^T A_last ... A_0, from the left, in float64. */
export function rollout(att, g, lastLayer = g.L - 1) {
  const { T, P, N, H } = g;
  let r = new Float64Array(T);
  if (g.hasClassToken) r[0] = 1;
  else for (let i = P; i < T; i++) r[i] = 1 / N;
  for (let l = lastLayer; l >= 0; l--) {
    const a = new Float64Array(T * T); // (T, T): this layer's fused, mixed and renormalised attention
    for (let h = 0; h < H; h++) {
      const base = (l * H + h) * T * T;
      for (let k = 0; k < T * T; k++) a[k] += att[base + k];
    }
    for (let i = 0; i < T; i++) {
      let total = 0;
      for (let j = 0; j < T; j++) {
        a[i * T + j] = 0.5 * (a[i * T + j] / H) + (i === j ? 0.5 : 0);
        total += a[i * T + j];
      }
      for (let j = 0; j < T; j++) a[i * T + j] /= total;
    }
    const next = new Float64Array(T); // r^T A
    for (let i = 0; i < T; i++) {
      const ri = r[i];
      if (ri === 0) continue;
      for (let j = 0; j < T; j++) next[j] += ri * a[i * T + j];
    }
    r = next;
  }
  return r.slice(P, P + N);
}

/** Distance in input pixels between the centres of every two patches: (N*N,) Float64Array. */
export function patchDistances(g) {
  const [gh, gw] = g.grid, [ph, pw] = g.patchSize, N = gh * gw;
  const d = new Float64Array(N * N);
  for (let i = 0; i < N; i++) {
    for (let j = 0; j < N; j++) {
      const dy = (Math.floor(i / gw) - Math.floor(j / gw)) * ph, dx = ((i % gw) - (j % gw)) * pw;
      d[i * N + j] = Math.hypot(dy, dx);
    }
  }
  return d;
}

/** Mean attention distance (paper Fig. 7 right): MAD[l, h] = (1/N) sum_i sum_j att[l, h, i, j] d(i, j) over patch
 * queries and keys, prefix attention left out and not renormalised (renormalise = true: each row over its patch mass
 * first) -> (L*H,) Float64Array in pixels. */
export function meanAttentionDistance(att, g, renormalise = false) {
  const { T, P, N, H, L } = g;
  const d = patchDistances(g);
  const out = new Float64Array(L * H);
  for (let l = 0; l < L; l++) {
    for (let h = 0; h < H; h++) {
      let total = 0;
      for (let i = 0; i < N; i++) {
        const base = ((l * H + h) * T + P + i) * T + P;
        let sum = 0, mass = 0;
        for (let j = 0; j < N; j++) {
          sum += att[base + j] * d[i * N + j];
          mass += att[base + j];
        }
        total += renormalise ? sum / Math.max(mass, 1e-12) : sum;
      }
      out[l * H + h] = total / N;
    }
  }
  return out;
}

/** Mean distance between two patch centres: the value of attention spread evenly (the figure's dashed line). */
export function uniformDistance(g) {
  const d = patchDistances(g);
  return d.reduce((a, b) => a + b, 0) / d.length;
}

// ------------------------------------------------------------------------------------------------
// Why: orders, the deletion test and its verdict (analyses.md, "Faithfulness", "Verdicts")

/** Patches by relevance descending, ties by index ascending: (N,) -> [patch indices]. */
export function patchOrder(relevance) {
  return Array.from(relevance.keys()).sort((a, b) => relevance[b] - relevance[a] || a - b);
}

/** n_k = round(k N / S) patches dropped at k = 0..S-1. */
export function deletionCounts(n, steps) {
  return Array.from({ length: steps }, (_, k) => roundHalfEven((k * n) / steps));
}

/** Trapezoid rule over (k / S, curve_k), k = 0..S-1. */
export function deletionAuc(curve) {
  const s = curve.length;
  let area = 0;
  for (let k = 1; k < s; k++) area += (curve[k - 1] + curve[k]) / 2 / s;
  return area;
}

/** The kept-patch sets of the deletion test: the map's order with its first n_k dropped, then each random order with
 * its last n_k dropped (its first N - n_k kept) -> {method: [[kept]] (S), random: [[[kept]] (S)] (R)}. */
export function deletionSets(order, randomOrders, steps) {
  const n = order.length, counts = deletionCounts(n, steps);
  return {
    method: counts.map((c) => order.slice(c)),
    random: randomOrders.map((o) => counts.map((c) => o.slice(0, n - c))),
  };
}

/** Mean and standard deviation (ddof) of numbers. */
export function meanStd(values, ddof = 0) {
  const m = values.reduce((a, b) => a + b, 0) / values.length;
  if (values.length - ddof <= 0) return { mean: m, std: NaN };
  const v = values.reduce((a, b) => a + (b - m) * (b - m), 0) / (values.length - ddof);
  return { mean: m, std: Math.sqrt(v) };
}

export const BEATS = "beats random", WORSE = "worse than random", TIED = "not distinguishable from random";

/** The verdict rule: gain = random mean - AUC (lower deletion AUC is better); "beats random" when the gain exceeds
 * max(2 std, 1e-6) of the random orders' AUCs (ddof 1), "worse than random" below minus that, else tied. */
export function deletionVerdict(auc, randomAucs) {
  const { mean } = meanStd(randomAucs), { std } = meanStd(randomAucs, 1);
  const gain = mean - auc, threshold = Math.max(2 * std, 1e-6);
  const label = Number.isNaN(gain) || Number.isNaN(threshold) ? TIED : gain > threshold ? BEATS : gain < -threshold ? WORSE : TIED;
  return { label, gain, threshold, randomMean: mean, randomStd: std };
}

/** The deletion test from the target's probabilities on the sets of `deletionSets` (same nesting) -> the method's
 * curve (S,), the random orders' mean curve and spread (std ddof 0 per step), their AUCs, and the verdict. */
export function deletionResult(methodProbs, randomProbs) {
  const steps = methodProbs.length;
  const mean = [], spread = [];
  for (let k = 0; k < steps; k++) {
    const { mean: m, std } = meanStd(randomProbs.map((curve) => curve[k]));
    mean.push(m);
    spread.push(std);
  }
  const auc = deletionAuc(methodProbs), randomAucs = randomProbs.map(deletionAuc);
  return { curve: methodProbs, randomMean: mean, randomSpread: spread, auc, randomAucs, verdict: deletionVerdict(auc, randomAucs) };
}

/** Patch occlusion: p_c of the image minus p_c with patch k alone dropped, for every patch -> (N,). */
export function occlusionMap(fullProb, droppedProbs) {
  return Float64Array.from(droppedProbs, (p) => fullProb - p);
}

// ------------------------------------------------------------------------------------------------
// The lesson's numbers (dashboard/lesson/facts.py)

/** How many patches a map is spread over: 1 / sum(p^2) of the map (clipped at 0) scaled to sum 1. */
export function effectivePatches(map) {
  const p = Array.from(map, (v) => Math.max(v, 0));
  const total = p.reduce((a, b) => a + b, 0);
  if (total <= 0) return p.length;
  return 1 / p.reduce((a, v) => a + (v / total) ** 2, 0);
}

/** The index of a map's largest entry (the first on ties). */
export function topPatch(map) {
  let best = 0;
  for (let i = 1; i < map.length; i++) if (map[i] > map[best]) best = i;
  return best;
}

/** The share of a map's positive total its top tenth of patches hold. */
export function topShare(map, fraction = 0.1) {
  const p = Array.from(map, (v) => Math.max(v, 0)).sort((a, b) => b - a);
  const total = p.reduce((a, b) => a + b, 0);
  if (total <= 0) return 0;
  const n = Math.max(1, roundHalfEven(fraction * p.length));
  return p.slice(0, n).reduce((a, b) => a + b, 0) / total;
}

export function gridDistance(a, b, grid) {
  const gw = grid[1];
  return Math.hypot(Math.floor(a / gw) - Math.floor(b / gw), (a % gw) - (b % gw));
}

/** The `count` patches most similar to patch k (k left out), most similar first (a stable sort). */
export function mostSimilarPatches(similarity, k, count = 4) {
  const idx = Array.from(similarity.keys()).filter((j) => j !== k);
  return idx.sort((a, b) => similarity[b] - similarity[a] || a - b).slice(0, count);
}

export const NEIGHBOURS = "its neighbours", FAR = "patches far from it", NO_PATTERN = "no pattern: all about the same";
export const POSITION_ANSWERS = [NEIGHBOURS, FAR, NO_PATTERN];

/** facts.position_pattern: which positions are most like patch k's. */
export function positionPattern(similarity, k, grid, count = 4) {
  const others = Array.from(similarity.keys()).filter((j) => j !== k);
  if (!others.length || meanStd(others.map((j) => similarity[j])).std < 0.05) return NO_PATTERN;
  const distances = others.map((j) => gridDistance(k, j, grid));
  const near = meanStd(mostSimilarPatches(similarity, k, count).map((j) => gridDistance(k, j, grid))).mean;
  const nearest = [...distances].sort((a, b) => a - b).slice(0, count);
  if (near <= 1.5 * meanStd(nearest).mean) return NEIGHBOURS;
  if (near > meanStd(distances).mean) return FAR;
  return NO_PATTERN;
}

/** The first logit-lens row from which on the top-1 class is the final one. */
export function settledRow(tops) {
  const last = tops[tops.length - 1];
  for (let r = 0; r < tops.length; r++) if (tops.slice(r).every((t) => t === last)) return r;
  return tops.length - 1;
}

/** The top-1 class of every logit-lens row: lens (rows*C,) -> [{index, prob}] per row. */
export function lensTops(lens, rows, classes) {
  return Array.from({ length: rows }, (_, r) => topK(softmax(lens.subarray(r * classes, (r + 1) * classes)), 1)[0]);
}

// ------------------------------------------------------------------------------------------------
// Token norms and high-norm tokens (Darcet et al., ICLR 2024; analyses.md)

/** numpy's default quantile (linear interpolation between the sorted values). */
export function quantile(values, q) {
  const sorted = Float64Array.from(values).sort();
  const at = q * (sorted.length - 1), lo = Math.floor(at), hi = Math.min(lo + 1, sorted.length - 1);
  return sorted[lo] + (at - lo) * (sorted[hi] - sorted[lo]);
}

/** Which patch tokens of one residual row are high-norm: norms (T,) of the row -> booleans (N,), above Q3 + 3 IQR of the
 * row's patch norms (prefix tokens never count). */
export function highNormPatches(rowNorms, g) {
  const patches = Array.from(rowNorms.slice(g.P, g.P + g.N));
  const q1 = quantile(patches, 0.25), q3 = quantile(patches, 0.75), fence = q3 + 3 * (q3 - q1);
  return patches.map((v) => v > fence);
}
