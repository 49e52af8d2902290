// The model in the browser: ONNX Runtime Web (WASM, one thread) running the exported graph (vit_core.web.graph).
// Inputs pixels (B, 3, H, W), kept (B, K) int64 patch indices, head_mask (L, H); outputs logits (B, C),
// attention (B, L, H, T', T'), logit_lens (B, L+1, C), token_norms (B, L+1, T') with T' = P + K.

import * as ort from "../ort/ort.wasm.min.mjs";

// One thread: a static host can't send the headers (COOP/COEP) that threads need, and one thread gives the same
// numbers on every machine. The WASM files are the site's own (ort/), never a CDN.
ort.env.wasm.numThreads = 1;
ort.env.wasm.wasmPaths = new URL("../ort/", import.meta.url).href;

const BATCH = 16; // perturbed copies per run, at most: the deletion test's and the occlusion map's forwards

export class Model {
  constructor(session, logitsSession, info) {
    this.session = session; // every output: one image's pass
    this.logitsSession = logitsSession; // the logits alone, last block for the class token: the perturbation tests
    const g = info.geometry;
    const [gh, gw] = g.grid;
    this.g = {
      L: g.num_layers, H: g.num_heads, P: g.prefix_names.length, N: gh * gw, T: g.prefix_names.length + gh * gw,
      C: g.num_classes, grid: g.grid, patchSize: g.patch_size, imgSize: g.img_size,
      hasClassToken: g.prefix_names.includes("CLS"), prefixNames: g.prefix_names,
    };
    this.queue = Promise.resolve(); // one run at a time: a session runs one inference at once
  }

  static async load(info, base = "./") {
    const url = (file) => new URL(file, new URL(base, location.href)).href;
    const [graph, logitsGraph, weights] = await Promise.all([info.graph.file, info.graph.logits_file, info.graph.weights]
      .map(async (file) => new Uint8Array(await (await fetch(url(file))).arrayBuffer())));
    // Both graphs read the one weights file (vit_core.web.graph.shared_weights), fetched once; each session gets its
    // own copy, in case the runtime takes the buffer over.
    const open = (bytes, copy) => ort.InferenceSession.create(bytes, { executionProviders: ["wasm"], graphOptimizationLevel: "all",
      externalData: [{ path: info.graph.weights, data: copy ? weights.slice() : weights }] });
    const logitsSession = await open(logitsGraph, true);
    return new Model(await open(graph, false), logitsSession, info);
  }

  allHeads() {
    return new Float32Array(this.g.L * this.g.H).fill(1);
  }

  allPatches() {
    return [...Array(this.g.N).keys()];
  }

  /** One run: the image's pixels (3*H*W) for every row, kept-patch lists of one length, heads (L*H,).
   * fetch: the outputs wanted. -> {name: Float32Array} */
  async runBatch(pixels, sets, heads, fetch, session = this.session) {
    const { imgSize } = this.g, b = sets.length, k = sets[0].length, size = pixels.length;
    const batchPixels = new Float32Array(b * size);
    for (let i = 0; i < b; i++) batchPixels.set(pixels, i * size);
    const kept = new BigInt64Array(b * k);
    sets.forEach((set, i) => { if (set.length !== k) throw new Error("kept sets of one run have one length"); set.forEach((p, j) => { kept[i * k + j] = BigInt(p); }); });
    const feeds = {
      pixels: new ort.Tensor("float32", batchPixels, [b, 3, imgSize[0], imgSize[1]]),
      kept: new ort.Tensor("int64", kept, [b, k]),
      head_mask: new ort.Tensor("float32", heads || this.allHeads(), [this.g.L, this.g.H]),
    };
    const job = this.queue.then(() => session.run(feeds, fetch));
    this.queue = job.catch(() => {});
    const out = await job;
    return Object.fromEntries(fetch.map((name) => [name, out[name].data]));
  }

  /** Everything about one image with the kept patches (default all): logits (C,), attention (L*H*T'*T'),
   * lens ((L+1)*C,), norms ((L+1)*T',). */
  async analyse(pixels, kept = null, heads = null) {
    const out = await this.runBatch(pixels, [kept || this.allPatches()], heads, ["logits", "attention", "logit_lens", "token_norms"]);
    return { logits: out.logits, attention: out.attention, lens: out.logit_lens, norms: out.token_norms };
  }

  /** Logits of the image with each kept-patch set (lists of patch indices), sets of one length run together:
   * -> [Float32Array (C,)] in the sets' order. */
  async logitsOfKeptSets(pixels, sets, heads = null) {
    const { C } = this.g, results = new Array(sets.length);
    const byLength = new Map();
    sets.forEach((set, i) => byLength.set(set.length, [...(byLength.get(set.length) || []), i]));
    for (const indices of byLength.values()) {
      for (let start = 0; start < indices.length; start += BATCH) {
        const chunk = indices.slice(start, start + BATCH);
        const { logits } = await this.runBatch(pixels, chunk.map((i) => sets[i]), heads, ["logits"], this.logitsSession);
        chunk.forEach((i, row) => { results[i] = logits.slice(row * C, (row + 1) * C); });
      }
    }
    return results;
  }
}
