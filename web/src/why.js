// "Why this prediction?" in the browser: the patch-occlusion map and the deletion test against random orders, run with
// the graph's keep-mask (forward passes only). The definitions are analyses.js's; this module only runs the forwards.

import { deletionResult, deletionSets, occlusionMap, patchOrder, softmax } from "./analyses.js";

/** p_c of every kept-patch set, each distinct set run once (a set's patches in any order: the same tokens). */
async function targetProbs(model, pixels, sets, target) {
  const keyOf = (set) => [...set].sort((a, b) => a - b).join(",");
  const unique = new Map();
  for (const set of sets) if (!unique.has(keyOf(set))) unique.set(keyOf(set), set);
  const logits = await model.logitsOfKeptSets(pixels, [...unique.values()]);
  const prob = new Map([...unique.keys()].map((key, i) => [key, softmax(logits[i])[target]]));
  return sets.map((set) => prob.get(keyOf(set)));
}

/** The deletion test of a relevance map (N,) for class `target`: the map's order against the site's random orders. */
export async function deletionTest(model, pixels, relevance, target, randomOrders, steps) {
  const sets = deletionSets(patchOrder(relevance), randomOrders, steps);
  const flat = [...sets.method, ...sets.random.flat()];
  const probs = await targetProbs(model, pixels, flat, target);
  const methodProbs = probs.slice(0, steps);
  const randomProbs = randomOrders.map((_, r) => probs.slice(steps * (r + 1), steps * (r + 2)));
  return deletionResult(methodProbs, randomProbs);
}

/** The patch-occlusion map for class `target`: p_c minus p_c with each patch alone dropped -> (N,). */
export async function occlusion(model, pixels, target) {
  const all = [...Array(model.g.N).keys()];
  const sets = [all, ...all.map((k) => all.filter((j) => j !== k))];
  const probs = await targetProbs(model, pixels, sets, target);
  return occlusionMap(probs[0], probs.slice(1));
}
