// What each lesson step says, written with this image's numbers: the Streamlit lesson's sentences and questions
// (dashboard/lesson/steps.py), with the controls named as this page names them. Pure functions of plain values.
// Numbers as there: layers and heads from 0, patches row by row from 0, distances in input pixels.

import * as A from "./analyses.js";

export const escape = (text) => String(text).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
export const pct = (p) => (p >= 0.1 ? `${(100 * p).toFixed(0)}%` : `${(100 * p).toFixed(1)}%`);
export const where = (k, grid) => `patch ${k} (row ${Math.floor(k / grid[1])}, column ${k % grid[1]})`;
const INPUTS = "<b>Your image</b>";

/** A question whose options are any values written with String(); `answer` is one of them. */
function question(prompt, options, answer) {
  const shown = options.map(String);
  return { prompt, options: shown, answer: shown.indexOf(String(answer)) };
}

/** Options for a "how many" question: the answer and the other distinct numbers, smallest first. */
function numberChoices(answer, others) {
  return [...new Set([answer, ...others])].sort((a, b) => a - b);
}

const tokenName = (g, index) => (index < g.P ? g.prefixNames[index] : `patch ${index - g.P} (row ${Math.floor((index - g.P) / g.grid[1])}, col ${(index - g.P) % g.grid[1]})`);
export const centrePatch = (g) => Math.floor(g.grid[0] / 2) * g.grid[1] + Math.floor(g.grid[1] / 2);

export function imageAndPatches(g, imageName, imageSize) {
  const [gh, gw] = g.grid, [ph, pw] = g.patchSize, [h, w] = g.imgSize, k = centrePatch(g);
  const prefix = g.P ? ` plus ${g.prefixNames.join(", ")} in front` : "";
  return {
    body: `A ViT does not slide over the image: it resizes and crops it to ${w} x ${h} pixels and cuts that into a grid of `
      + `<b>${gh} x ${gw} = ${g.N} patches</b> of ${ph} x ${pw} pixels, numbered row by row. Each patch becomes one token, so `
      + `the model reads your image like a sentence of ${g.N} words${prefix}.`,
    notice: `Your image <b>${escape(imageName)}</b> (${imageSize[0]} x ${imageSize[1]} pixels) is now ${g.N} patches of `
      + `${ph * pw * 3} numbers each (${ph} x ${pw} pixels x 3 colours). The framed one, ${where(k, g.grid)}, is the centre.`,
    tryThis: `Press <b>Draw</b> in ${INPUTS} and draw a shape: count how many of the ${g.N} patches your strokes cross.`,
    question: question(`How many tokens does the model read for this image${g.P ? " (its prefix tokens too)?" : "?"}`,
      numberChoices(g.T, [g.N, gh, ph * pw * 3, g.T + gh]), g.T),
    reveal: `${g.N} patch tokens` + (g.P ? ` + ${g.P} prefix token(s) (${g.prefixNames.join(", ")})` : "") + ` = ${g.T}.`,
  };
}

export function patchToVector(g, embedDim, explained) {
  const [ph, pw] = g.patchSize, n = ph * pw * 3, d = embedDim;
  const top3 = explained.slice(0, 3).reduce((a, b) => a + b, 0);
  return {
    body: `Each patch's ${n} numbers are multiplied by one matrix E, the same for every patch: out come <b>${d} numbers</b>, `
      + `the patch's token. Each row of E is a <b>filter</b>, a ${ph} x ${pw} colour pattern the patch is compared with; the `
      + `figure shows the main patterns among the ${d} filters (their principal components, paper Fig. 7 left).`,
    notice: `The first 3 patterns explain <b>${pct(top3)}</b> of the variance of this model's ${d} filters. Smooth blobs and `
      + "stripes mean learned filters, much like a CNN's first layer; noise means an untrained model.",
    tryThis: `Switch the figure to <b>Raw filters</b>: each is one ${ph} x ${pw} pattern; then step 1's patches are what they are compared with.`,
    question: question("How many numbers describe each patch after this step?", numberChoices(d, [n, g.N, 3]), d),
    reveal: `${d}: the model's width. Every patch, whatever its size in pixels, becomes ${d} numbers.`,
  };
}

export function whereItIs(g, similarity, k) {
  const near = A.mostSimilarPatches(similarity, k);
  const pattern = A.positionPattern(similarity, k, g.grid);
  const away = near.reduce((a, j) => a + A.gridDistance(k, j, g.grid), 0) / near.length;
  return {
    body: "Attention treats its tokens as a set: shuffle the patches and it would not notice. So a learned vector, the "
      + "<b>position embedding</b>, is added to each patch's token. Each small tile shows how similar one position's vector "
      + "is to every other position's (paper Fig. 7, center).",
    notice: `For the framed ${where(k, g.grid)}, the most similar positions are patches ${near.join(", ")}: on average `
      + `${away.toFixed(1)} patches away from it.`,
    tryThis: "Click another tile, a corner one: does its bright spot follow it?",
    question: { prompt: `Which positions have embeddings most like ${where(k, g.grid)}'s?`, options: A.POSITION_ANSWERS,
      answer: A.POSITION_ANSWERS.indexOf(pattern) },
    reveal: `On this model: ${pattern} (most similar: patches ${near.join(", ")}).`,
  };
}

export function oneHead(g, layer, head, query, amap) {
  const who = tokenName(g, query), top = A.topPatch(amap.map), patches = 1 - amap.prefixShare;
  const text = {
    body: "In every layer, each token (a <b>query</b>) scores every token (the <b>keys</b>) and turns the scores into weights "
      + "that sum to 1: A = softmax(QK<sup>T</sup>/&radic;d). It then takes that mix of the tokens' values. The map shows "
      + `where <b>${who}</b> looks in layer ${layer}, head ${head}: brighter patches give it more.`,
    notice: `Its top patch is ${where(top, g.grid)}, with ${pct(amap.map[top])} of the row; the map is spread over about `
      + `<b>${A.effectivePatches(amap.map).toFixed(0)}</b> of the ${g.N} patches.`,
    tryThis: "Move <b>Layer</b> to 0, then back to the last: does this head's map spread out or focus?",
    question: null, reveal: "",
  };
  if (!g.P) return text;
  text.question = { prompt: `Where does most of ${who}'s row go in this head: to the patches or to the prefix?`,
    options: [`to the ${g.N} patches`, `to the prefix token${g.P > 1 ? "s" : ""}`], answer: patches >= 0.5 ? 0 : 1 };
  text.reveal = `${pct(patches)} to the patches, ${pct(amap.prefixShare)} to the prefix (the map shows only the patches' part).`;
  return text;
}

export function allHeads(g, layer, query, maps) {
  const who = tokenName(g, query);
  const spread = maps.map(A.effectivePatches);
  const focused = spread.indexOf(Math.min(...spread));
  const distinct = new Set(maps.map(A.topPatch)).size;
  return {
    body: `A layer has <b>${g.H} heads</b>, each with its own queries and keys: they look at different places at the same `
      + "time, and their outputs are put side by side. The last tile is their mean, which hides how different they are.",
    notice: `In layer ${layer}, ${who}'s ${g.H} heads have their top patch in <b>${distinct}</b> different `
      + `place${distinct > 1 ? "s" : ""}; the widest head spreads over about ${Math.max(...spread).toFixed(0)} patches.`,
    tryThis: "Move <b>Layer</b>: in which layer do the heads agree most?",
    question: question(`Which head of layer ${layer} is the most focused (on the fewest patches)?`, [...Array(g.H).keys()], focused),
    reveal: `Head ${focused}: about ${spread[focused].toFixed(1)} patches (1 would be a single patch).`,
  };
}

export const MORE_FOCUSED = "more focused", MORE_SPREAD = "more spread out";

export function throughLayers(g, last, rolled, first, every) {
  const whose = g.hasClassToken ? "class token" : "mean patch", top = A.topPatch(rolled);
  const eFirst = A.effectivePatches(first), eEvery = A.effectivePatches(every);
  return {
    body: "Each layer mixes the tokens, so after a few layers a token carries information from many patches. <b>Attention "
      + "rollout</b> follows that mixing: multiply the layers' attention (mean over heads, the skip connection counted as "
      + `half) to estimate how much each patch reached the ${whose} (paper Fig. 6).`,
    notice: `Rolled out over layers 0-${last}, the top patch is ${where(top, g.grid)}, and the top tenth of the patches holds `
      + `<b>${pct(A.topShare(rolled))}</b> of the total.`,
    tryThis: "Move <b>Roll out up to layer</b> from 0 to the last and watch where the map settles.",
    question: { prompt: `Rolled out over all ${g.L} layers instead of layer 0 alone, is the map more focused or more spread out?`,
      options: [MORE_FOCUSED, MORE_SPREAD], answer: eEvery < eFirst ? 0 : 1 },
    reveal: `Layer 0 alone: spread over about ${eFirst.toFixed(0)} patches; all layers: about ${eEvery.toFixed(0)}.`,
  };
}

export function howFar(g, distances, uniform, images) {
  const means = Array.from({ length: g.L }, (_, l) => distances.slice(l * g.H, (l + 1) * g.H).reduce((a, b) => a + b, 0) / g.H);
  const best = means.indexOf(Math.max(...means));
  const layer = (l) => Array.from(distances.slice(l * g.H, (l + 1) * g.H));
  const average = images > 1
    ? `The crosses average the ${images} images you looked at: draw another shape or pick another example in ${INPUTS}, and they move.`
    : `With one image there is nothing to average yet: draw a shape or pick another example in ${INPUTS}, and the figure adds crosses, the average of your images.`;
  const other = best ? 0 : g.L - 1;
  return {
    body: "For each head, average the distance in pixels between a patch and the patches it attends to, weighted by "
      + "attention: its <b>mean attention distance</b> (paper Fig. 7, right). A CNN's first layers only see neighbours; a "
      + "ViT's heads may look anywhere from layer 0 on.",
    notice: `In layer 0 the heads range from <b>${Math.min(...layer(0)).toFixed(0)} to ${Math.max(...layer(0)).toFixed(0)} px</b>; `
      + `in the last layer from ${Math.min(...layer(g.L - 1)).toFixed(0)} to ${Math.max(...layer(g.L - 1)).toFixed(0)} px. `
      + `Attention spread evenly would give ${uniform.toFixed(0)} px (the dashed line).`,
    tryThis: `${average} Does the most global layer stay the same?`,
    question: question("Which layer has the most global heads (the largest mean distance)?", [...Array(g.L).keys()], best),
    reveal: `Layer ${best}: ${means[best].toFixed(0)} px on average over its heads (layer ${other}: ${means[other].toFixed(0)} px).`,
  };
}

export const SHIFT_YES = "Yes, it rises", SHIFT_NO = "No, it stays the same";

/** outside: the teaching model's sentence on an image outside its world (the app's outside()), HTML, or null. */
export function prediction(g, preds, outside = null) {
  const top = preds[0];
  const runner = preds.length > 1 ? `; the runner-up, <b>${escape(preds[1].label)}</b>, gets ${pct(preds[1].prob)}` : "";
  const gap = preds.length > 1 ? top.logit - preds[1].logit : 0;
  return {
    body: `After the last block, the ${g.hasClassToken ? "class token" : "pooled token"} goes through a final norm and one `
      + `linear layer, the <b>head</b>: ${g.C} scores (logits), one per class. Softmax turns them into probabilities that sum to 1.`,
    notice: `The model says <b>${escape(top.label)}</b> with <b>${pct(top.prob)}</b>${runner}.${outside ? ` ${outside}` : ""}`,
    tryThis: `Press <b>Draw</b> in ${INPUTS} and change your shape a little at a time: how far can you go before the answer changes?`,
    question: { prompt: `If every logit rose by 5, would ${escape(top.label)}'s probability change?`, options: [SHIFT_YES, SHIFT_NO], answer: 1 },
    reveal: preds.length > 1
      ? `No: softmax depends only on differences between logits. ${escape(top.label)} leads by ${gap.toFixed(2)}, and that gap is what decides.`
      : "No: softmax depends only on differences between logits.",
  };
}

export const VERDICT_ANSWERS = ["Yes: faster than random, beyond the random orders' spread", "Not distinguishable from random",
  "No: slower than random"];

/** The why step, its question answered by the deletion test once it has run (`test`: analyses.deletionResult). */
export function why(g, label, method, relevance, test) {
  const top = A.topPatch(relevance);
  const text = {
    body: `A <b>relevance map</b> scores each patch for how much it pushed the model towards ${escape(label)}. Methods disagree, `
      + "and a map can look convincing and still be wrong. The <b>deletion test</b> asks the model: delete the patches the map "
      + "ranks highest first, and p(class) should fall faster than for random orders.",
    notice: `${method}'s top patch is ${where(top, g.grid)}; its top tenth of the patches holds <b>${pct(A.topShare(relevance))}</b> `
      + "of its positive relevance.",
    tryThis: "Pick another <b>Method</b>: do the maps agree on the same patches?",
    question: { prompt: `Will deleting ${method}'s top patches first make p(${escape(label)}) fall faster than random orders?`,
      options: VERDICT_ANSWERS, answer: 0 },
    reveal: "",
  };
  if (test) {
    const v = test.verdict;
    text.question.answer = v.label === A.BEATS ? 0 : v.label === A.WORSE ? 2 : 1;
    text.reveal = `Deletion AUC ${test.auc.toFixed(3)} against random ${v.randomMean.toFixed(3)} ± ${v.randomStd.toFixed(3)} `
      + "(lower is better; beating random needs more than 2 standard deviations).";
  }
  return text;
}

export function goingFurther(g, label, settled) {
  const last = g.L - 1;
  const when = settled === 0 ? `is <b>${escape(label)}</b> already at the embeddings and stays so through every block`
    : settled > last ? `becomes <b>${escape(label)}</b> only after the last block (block ${last}); before it, another class led`
      : `becomes <b>${escape(label)}</b> after block ${settled - 1} and stays so through the last (block ${last})`;
  return {
    body: "Three tools researchers use next: <b>interventions</b> (drop patches or switch heads off and see the prediction "
      + "change), the <b>logit lens</b> (the model's head read after every block, as in the figure), and <b>registers &amp; "
      + "norms</b> (tokens with huge norms that store global information).",
    notice: `Read after each of the ${g.L} blocks, the top class ${when}.`,
    tryThis: "Click patches of the image to drop them, or switch heads off: does the answer hold?",
    question: null, reveal: "",
  };
}
