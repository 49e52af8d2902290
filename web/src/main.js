// The static lesson: load the site's files, run the model on the student's image in this browser, show the step.
// State lives in this tab only. window.vitLens exposes the analyses and the model to the browser tests and the
// benchmark (tests/browser/test_web_lesson_browser.py, tools/benchmarks/web_lesson.py).

import * as A from "./analyses.js";
import * as F from "./figures.js";
import { decodeBlob, drawingCanvas, ImageRefusal } from "./inputs.js";
import { Model } from "./model.js";
import { modelCrop, normalised } from "./preprocess.js";
import { conceptCheck, predictThenReveal } from "./quiz.js";
import * as lessonText from "./lesson.js";
import { METHODS, STEP_VIEWS } from "./steps.js";
import { deletionTest, occlusion } from "./why.js";

const $ = (id) => document.getElementById(id);
const CHECK_FIRST = 0, CHECK_AGAIN = STEP_VIEWS.length + 1; // steps 1..10 between the two concept checks

function decoded(entry) {
  const bytes = Uint8Array.from(atob(entry.data), (c) => c.charCodeAt(0));
  return { shape: entry.shape, array: new Float32Array(bytes.buffer) };
}

async function json(path) {
  const response = await fetch(path);
  if (!response.ok) throw new Error(`${path}: ${response.status}`);
  return response.json();
}

class App {
  constructor(site, model) {
    this.site = site;
    this.model = model;
    this.g = model.g;
    const step = Number(new URLSearchParams(location.search).get("step"));
    this.s = {
      step: Number.isInteger(step) && step >= 0 && step <= CHECK_AGAIN ? step : CHECK_FIRST,
      layer: this.g.L - 1, head: 0, query: 0, rolloutLayer: this.g.L - 1, // the last layer first, as the dashboard method: "rollout", filterView: "pca",
      dropped: new Set(), silenced: new Set(), picks: {}, revealed: {}, before: [], after: [],
    };
    this.image = null;
    this.seen = new Map(); // image key -> its mean attention distances, for the averages of step 7
    this.timings = [];
  }

  label(i) { return this.site.info.labels[i] ?? `class ${i}`; }

  /** A value of the current image computed once (cleared with a new image). */
  cached(key, make) {
    if (!this.image.cache.has(key)) this.image.cache.set(key, make());
    return this.image.cache.get(key);
  }

  madSeen() { return [...this.seen.values()]; }

  /** The pass of an image: the crop the model sees, the graph's outputs, the prediction. */
  async setImage(name, { rgb, width, height }, started = performance.now()) {
    const pre = this.site.info.preprocessing;
    const { crop } = modelCrop(rgb, width, height, pre);
    const pixels = normalised(crop, this.g.imgSize[1], this.g.imgSize[0], pre);
    const result = await this.model.analyse(pixels);
    const probs = A.softmax(result.logits);
    const preds = A.topK(probs, this.g.C).map((p) => ({ ...p, label: this.label(p.index), logit: result.logits[p.index] }));
    this.image = { name, size: [width, height], crop, pixels, result, probs, preds, cache: new Map(), why: {}, after: null };
    this.s.dropped.clear(); this.s.silenced.clear();
    this.seen.set(name === "your drawing" ? `drawing-${this.seen.size}` : name, A.meanAttentionDistance(result.attention, this.g));
    $("prediction").textContent = `Prediction: ${A.predictionText(preds[0].label, preds[0].prob)}`;
    $("outside").innerHTML = this.outside() ?? "";
    this.render();
    this.timings.push({ what: name, ms: performance.now() - started });
    document.body.dataset.ready = String(this.timings.length);
  }

  /** The teaching model's sentence when the image is outside what it knows (its `other` class wins, or no class is
   * likely), as the dashboard says it (lesson.json's "outside"), or null. */
  outside() {
    const o = this.site.lesson.outside, top = this.image.preds[0];
    if (!o || this.site.info.name !== o.model) return null;
    const shapes = this.site.info.labels.filter((label) => label !== o.other_class);
    const fill = (template, values) => lessonText.escape(template).replace(/`([^`]+)`/g, "<code>$1</code>")
      .replace(/\{(\w+)(:\.0%)?\}/g, (_, key, percent) => (percent ? `${Math.round(100 * values[key])}%` : lessonText.escape(values[key])));
    const known = { count: shapes.length, shapes: shapes.join(", "), label: top.label, prob: top.prob };
    if (top.label === o.other_class) return fill(o.other, known);
    if (top.prob < o.unsure_below) return fill(o.unsure, known);
    return null;
  }

  /** The map of a why method (N,), or null while it is computed (occlusion runs N + 1 forwards). */
  relevance(method) {
    const image = this.image, g = this.g;
    if (method === "rollout") return this.cached("rollout-" + (g.L - 1), () => A.rollout(image.result.attention, g, g.L - 1));
    if (method === "raw") return this.cached("raw", () => A.attentionRow(image.result.attention, g, g.L - 1, null, 0).map);
    if (!image.why.occlusion) {
      image.why.occlusion = "running";
      occlusion(this.model, image.pixels, image.preds[0].index).then((map) => {
        image.why.occlusion = map;
        if (this.image === image) this.render();
      });
    }
    return image.why.occlusion === "running" ? null : image.why.occlusion;
  }

  /** The deletion test of a method's map, or null while it runs. */
  deletion(method) {
    const image = this.image, key = `deletion-${method}`;
    if (!image.why[key]) {
      image.why[key] = "running";
      const { steps, random_orders: orders } = this.site.info.deletion;
      const started = performance.now();
      deletionTest(this.model, image.pixels, this.relevance(method), image.preds[0].index, orders, steps).then((test) => {
        image.why[key] = test;
        this.timings.push({ what: key, ms: performance.now() - started });
        if (this.image === image) this.render();
      });
    }
    return image.why[key] === "running" ? null : image.why[key];
  }

  /** The pass with the chosen patches dropped and heads silenced, or null without an intervention. */
  intervened() { return this.s.dropped.size || this.s.silenced.size ? this.image.after : null; }

  async intervene() {
    const image = this.image, g = this.g;
    if (!this.s.dropped.size && !this.s.silenced.size) { image.after = null; this.render(); return; }
    const kept = this.model.allPatches().filter((k) => !this.s.dropped.has(k));
    const heads = this.model.allHeads();
    for (const key of this.s.silenced) { const [l, h] = key.split(":").map(Number); heads[l * g.H + h] = 0; }
    const result = await this.model.analyse(image.pixels, kept, heads);
    const probs = A.softmax(result.logits);
    image.after = { result, probs, preds: A.topK(probs, 3) };
    this.render();
  }

  go(step) {
    this.s.step = Math.min(CHECK_AGAIN, Math.max(CHECK_FIRST, step));
    history.replaceState(null, "", `?step=${this.s.step}`);
    this.render();
  }

  render() {
    const s = this.s, lesson = this.site.lesson;
    const nav = $("steps");
    nav.replaceChildren(...["Check", ...lesson.steps.map((_, i) => `${i + 1}`), "Check again"].map((text, i) => {
      const b = document.createElement("button");
      b.textContent = text;
      b.title = i === CHECK_FIRST || i === CHECK_AGAIN ? "the concept check" : lesson.steps[i - 1];
      if (i === s.step) b.setAttribute("aria-current", "step");
      b.addEventListener("click", () => this.go(i));
      return b;
    }));
    $("back").disabled = s.step === CHECK_FIRST;
    $("next").disabled = s.step === CHECK_AGAIN;
    if (s.step === CHECK_FIRST || s.step === CHECK_AGAIN) return this.renderCheck();
    document.body.dataset.view = "step";
    document.body.dataset.step = String(s.step);
    const view = STEP_VIEWS[s.step - 1](this);
    $("title").textContent = `${s.step}. ${lesson.steps[s.step - 1]}`;
    $("figure").replaceChildren(view.figure);
    $("controls").replaceChildren(...view.controls);
    const t = view.text;
    $("body").innerHTML = t.body;
    $("notice").innerHTML = `<b>Notice.</b> ${t.notice}`;
    $("try").innerHTML = `<b>Try this.</b> ${t.tryThis}`;
    const key = `step${s.step}`;
    $("question").replaceChildren(...(t.question ? [predictThenReveal(t.question, t.reveal, key, s, () => this.render())] : []));
  }

  /** The concept check's figure: the student's image as the model sees it, cut into patches. */
  predictionFigure() {
    return STEP_VIEWS[0](this).figure;
  }

  renderCheck() {
    const s = this.s, first = s.step === CHECK_FIRST;
    document.body.dataset.view = "check";
    document.body.dataset.step = String(s.step);
    $("title").textContent = first ? "Before you start: what do you think?" : "The concept check again";
    $("body").textContent = first ? "Five questions on how a Vision Transformer sees. Answer them now; at the end you will meet them again."
      : "The same five questions: see what changed since the start.";
    $("notice").textContent = "";
    $("try").textContent = "";
    $("controls").replaceChildren();
    $("figure").replaceChildren(...(this.image ? [this.predictionFigure()] : []));
    const questions = this.site.lesson.concept_check;
    $("question").replaceChildren(conceptCheck(questions, first ? s.before : s.after, first ? "before" : "after", () => this.render(),
      first ? null : s.before));
  }
}

async function boot() {
  const [info, figures, lesson] = await Promise.all([json("model.json"), json("figures.json"), json("lesson.json")]);
  const site = { info, lesson, figures: Object.fromEntries(Object.entries(figures).map(([k, v]) => [k, decoded(v)])) };
  const model = await Model.load(info);
  const app = new App(site, model);
  window.vitLens = { app, analyses: A, figures: F, model, why: { deletionTest, occlusion }, preprocess: { modelCrop, normalised }, methods: METHODS,
    lesson: lessonText };
  $("model-name").textContent = `${info.name} (${info.weights})`;
  $("back").addEventListener("click", () => app.go(app.s.step - 1));
  $("next").addEventListener("click", () => app.go(app.s.step + 1));
  document.addEventListener("keydown", (e) => { // a presenter's clicker sends Page Up / Page Down, as in the Streamlit lesson
    if (e.key === "PageDown") { e.preventDefault(); app.go(app.s.step + 1); }
    if (e.key === "PageUp") { e.preventDefault(); app.go(app.s.step - 1); }
  });

  // Every example fetched now (a few kilobytes each): once the page is loaded it needs no network at all.
  const blobs = await Promise.all(info.examples.map(async (path) => (await fetch(path)).blob()));
  const examples = $("examples");
  info.examples.forEach((path, i) => {
    const name = path.split("/").pop().replace(/\.png$/, "");
    const b = document.createElement("button");
    b.textContent = name;
    b.addEventListener("click", async () => {
      const t = performance.now();
      await app.setImage(name, await decodeBlob(blobs[i]), t);
    });
    examples.append(b);
  });
  const drawing = drawingCanvas(288, 10, () => app.setImage("your drawing", drawing.pixels(), performance.now()));
  $("draw-area").append(drawing.element);
  $("clear").addEventListener("click", () => drawing.clear());
  $("draw").addEventListener("click", () => {
    const area = $("draw-area");
    area.hidden = !area.hidden;
    $("draw").setAttribute("aria-pressed", String(!area.hidden));
  });
  const photo = async (e) => {
    const file = e.target.files[0];
    if (!file) return;
    const t = performance.now();
    try {
      await app.setImage(file.name, await decodeBlob(file), t);
    } catch (error) {
      $("prediction").innerHTML = error instanceof ImageRefusal ? `${lessonText.escape(file.name)}: ${lessonText.escape(error.message)}`
        : `${lessonText.escape(file.name)} can't be read as an image: try a PNG or JPEG.`;
      $("outside").textContent = "";
    }
  };
  $("photo").addEventListener("change", photo);
  $("camera").addEventListener("change", photo); // a phone opens its camera for this one (capture="environment")
  await app.setImage(info.examples[0].split("/").pop().replace(/\.png$/, ""), await decodeBlob(blobs[0]));
  // From the navigation's start (performance's time origin): what a student waits from the link to the first answer.
  app.timings.push({ what: "open-to-first-prediction", ms: performance.now() });
}

boot().catch((error) => {
  document.getElementById("prediction").textContent = `The lesson could not start: ${error.message}`;
  document.body.dataset.failed = "1";
  throw error;
});
