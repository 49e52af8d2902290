"""What each lesson step says: its title, two or three sentences, one "Notice" and one "Try this" written with the
live numbers of the current model and image, and its predict-then-reveal question, with the answer computed from
the same numbers. Pure functions of plain values and arrays (no Streamlit); the page (dashboard/lesson/ui.py)
gathers those values from the capture and draws each step's figure with the explorer's own figure functions.

Numbers in the text: layers and heads from 0 as in the explorer, patches row by row from 0, distances in input
pixels, probabilities in percent.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from dashboard.lesson import facts
from dashboard.lesson.quiz import Question, question
from dashboard.literal import markdown_literal as md  # class and file names come from users
from vit_core import Geometry
from vit_core.analyses import AttentionMap, Prediction


@dataclass(frozen=True)
class Step:
    title: str
    tab: str | None  # the explorer tab that shows this figure with all its controls (a `?view=` value)


STEPS: tuple[Step, ...] = (
    Step("The image and its patches", "Patches"),
    Step("A patch becomes a vector", "Filters"),
    Step("Where it is: position embeddings", "Positions"),
    Step("Attention: one head", "Attention"),
    Step("Attention: all the heads of a layer", "Attention"),
    Step("Attention through the layers", "Attention"),
    Step("How far the heads look", "Distance"),
    Step("The prediction", "Prediction"),
    Step("Why this prediction?", "Why?"),
    Step("Going further", None),
)
COUNT = len(STEPS)


def parse_step(value: str | None) -> int:
    """The step (1..COUNT) a `?step=` value asks for; the first for anything else (missing, not a number)."""
    try:
        step = int(str(value).strip())
    except ValueError:
        return 1
    return min(max(step, 1), COUNT)


@dataclass(frozen=True)
class StepText:
    body: str  # two or three sentences (Markdown)
    notice: str  # what to notice on this image, with its numbers
    try_this: str  # something to do next
    question: Question | None = None  # predict, then reveal
    reveal: str = ""  # said with the answer, once revealed
    explore: dict[str, str] = field(default_factory=dict)  # the explorer's query parameters for this view


# Where the inputs are: the lesson opens with the sidebar collapsed, its button at the page's top left.
SIDEBAR = "the sidebar (open it with **»** at the top left)"


def pct(p: float) -> str:
    return f"{100 * p:.0f}%" if p >= 0.1 else f"{100 * p:.1f}%"


def where(k: int, grid: tuple[int, int]) -> str:
    """Patch k by its place: `patch 20 (row 1, column 6)`."""
    r, c = divmod(k, grid[1])
    return f"patch {k} (row {r}, column {c})"


# ----------------------------------------------------------------------------------------------
# 1-3: patches, vectors, positions


def image_and_patches(g: Geometry, image_name: str, image_size: tuple[int, int]) -> StepText:
    (gh, gw), (ph, pw), (h, w) = g.grid, g.patch_size, g.img_size
    k = g.center_patch
    prefix = f" plus {', '.join(g.prefix_names)} in front" if g.prefix_names else ""
    return StepText(
        body=(f"A ViT does not slide over the image: it resizes and crops it to {w} x {h} pixels and cuts that into a "
              f"grid of **{gh} x {gw} = {g.num_patches} patches** of {ph} x {pw} pixels, numbered row by row. Each "
              f"patch becomes one token, so the model reads your image like a sentence of {g.num_patches} words"
              f"{prefix}."),
        notice=(f"Your image **{md(image_name)}** ({image_size[0]} x {image_size[1]} pixels) is now {g.num_patches} "
                f"patches of {ph * pw * 3} numbers each ({ph} x {pw} pixels x 3 colours). The framed one, "
                f"{where(k, g.grid)}, is the centre."),
        try_this=(f"Turn on **Draw** in {SIDEBAR} and draw a shape: count how many of the {g.num_patches} patches "
                  "your strokes cross."),
        question=question("How many tokens does the model read for this image"
                          + (" (its prefix tokens too)?" if g.prefix_names else "?"),
                          facts.number_choices(g.num_tokens, [g.num_patches, gh, ph * pw * 3, g.num_tokens + gh]),
                          g.num_tokens),
        reveal=(f"{g.num_patches} patch tokens" + (f" + {g.num_prefix_tokens} prefix token(s) ({', '.join(g.prefix_names)})"
                                                  if g.prefix_names else "") + f" = {g.num_tokens}."),
        explore={"view": "Patches"},
    )


def patch_to_vector(g: Geometry, explained: np.ndarray) -> StepText:
    """explained: (k,) the filters' principal components' shares of their variance, largest first."""
    (ph, pw), d = g.patch_size, g.embed_dim
    n = ph * pw * 3
    top3 = float(np.sum(explained[:3]))
    return StepText(
        body=(f"Each patch's {n} numbers are multiplied by one matrix E, the same for every patch: out come "
              f"**{d} numbers**, the patch's token. Each row of E is a **filter**, a {ph} x {pw} colour pattern the "
              f"patch is compared with; the figure shows the main patterns among the {d} filters (their principal "
              "components, paper Fig. 7 left)."),
        notice=(f"The first 3 patterns explain **{pct(top3)}** of the variance of this model's {d} filters. Smooth "
                "blobs and stripes mean learned filters, much like a CNN's first layer; noise means an untrained model."),
        try_this=(f"Open the **Patches** view below and click a patch of your image: its {n} pixel numbers and its "
                  f"{d}-number token appear side by side."),
        question=question("How many numbers describe each patch after this step?",
                          facts.number_choices(d, [n, g.num_patches, 3]), d),
        reveal=f"{d}: the model's width. Every patch, whatever its size in pixels, becomes {d} numbers.",
        explore={"view": "Patches", "patch": str(g.center_patch)},
    )


def where_it_is(g: Geometry, similarity: np.ndarray, k: int) -> StepText:
    """similarity: (gh, gw) the cosine similarity of patch k's position embedding with every patch's."""
    near = facts.most_similar_patches(similarity, k)
    pattern = facts.position_pattern(similarity, k, g.grid)
    options = list(facts.POSITION_ANSWERS)
    return StepText(
        body=("Attention treats its tokens as a set: shuffle the patches and it would not notice. So a learned "
              "vector, the **position embedding**, is added to each patch's token. Each small tile shows how similar "
              "one position's vector is to every other position's (paper Fig. 7, center)."),
        notice=(f"For the framed {where(k, g.grid)}, the most similar positions are patches "
                f"{', '.join(str(j) for j in near)}: on average {np.mean([facts.grid_distance(k, j, g.grid) for j in near]):.1f} "
                "patches away from it."),
        try_this=("In the **Positions** view, pick a corner patch, or another input resolution: the pattern is "
                  "resampled, not learned again."),
        question=Question(f"Which positions have embeddings most like {where(k, g.grid)}'s?", tuple(options),
                          options.index(pattern)),
        reveal=f"On this model: {pattern} (most similar: patches {', '.join(str(j) for j in near)}).",
        explore={"view": "Positions"},
    )


# ----------------------------------------------------------------------------------------------
# 4-6: attention


def one_head(g: Geometry, layer: int, head: int, query: int, amap: AttentionMap) -> StepText:
    who = g.token_name(query)
    top = facts.top_patch(amap.map)
    patches = 1.0 - amap.prefix_share
    text = StepText(
        body=("In every layer, each token (a **query**) scores every token (the **keys**) and turns the scores into "
              "weights that sum to 1: $A = \\mathrm{softmax}(QK^\\top/\\sqrt{d})$. It then takes that mix of the "
              f"tokens' values. The map shows where **{who}** looks in layer {layer}, head {head}: brighter patches "
              "give it more."),
        notice=(f"Its top patch is {where(top, g.grid)}, with {pct(float(amap.map.ravel()[top]))} of the row; the "
                f"map is spread over about **{facts.effective_patches(amap.map):.0f}** of the {g.num_patches} patches."),
        try_this="Move **Layer** to 0, then back to the last: does this head's map spread out or focus?",
        explore={"view": "Attention", "layer": str(layer), "head": f"head {head}"},
    )
    if not g.num_prefix_tokens:
        return text
    options = (f"to the {g.num_patches} patches", f"to the prefix token{'s' if g.num_prefix_tokens > 1 else ''}")
    return StepText(text.body, text.notice, text.try_this,
                    Question(f"Where does most of {who}'s row go in this head: to the patches or to the prefix?",
                             options, 0 if patches >= 0.5 else 1),
                    f"{pct(patches)} to the patches, {pct(amap.prefix_share)} to the prefix (the map shows only the "
                    "patches' part).", text.explore)


def all_heads(g: Geometry, layer: int, query: int, maps: np.ndarray) -> StepText:
    """maps: (H, gh, gw) every head's map of `layer` for `query`."""
    who = g.token_name(query)
    focused = facts.most_focused_head(maps)
    spread = [facts.effective_patches(m) for m in maps]
    distinct = facts.distinct_top_patches(maps)
    return StepText(
        body=(f"A layer has **{g.num_heads} heads**, each with its own queries and keys: they look at different places "
              "at the same time, and their outputs are put side by side. The last tile is their mean, which hides "
              "how different they are."),
        notice=(f"In layer {layer}, {who}'s {g.num_heads} heads have their top patch in **{distinct}** different "
                f"place{'s' if distinct > 1 else ''}; the widest head spreads over about {max(spread):.0f} patches."),
        try_this="Move **Layer**: in which layer do the heads agree most?",
        question=question(f"Which head of layer {layer} is the most focused (on the fewest patches)?",
                          list(range(g.num_heads)), focused),
        reveal=f"Head {focused}: about {spread[focused]:.1f} patches (1 would be a single patch).",
        explore={"view": "Attention", "layer": str(layer)},
    )


MORE_FOCUSED, MORE_SPREAD = "more focused", "more spread out"


def through_layers(g: Geometry, last: int, rollout: np.ndarray, first: np.ndarray, every: np.ndarray) -> StepText:
    """rollout: (gh, gw) rolled out up to layer `last` (shown); first, every: up to layer 0 and up to the last layer."""
    whose = "class token" if g.has_class_token else "mean patch"
    top = facts.top_patch(rollout)
    e_first, e_every = facts.effective_patches(first), facts.effective_patches(every)
    return StepText(
        body=("Each layer mixes the tokens, so after a few layers a token carries information from many patches. "
              "**Attention rollout** follows that mixing: multiply the layers' attention (mean over heads, the skip "
              f"connection counted as half) to estimate how much each patch reached the {whose} (paper Fig. 6)."),
        notice=(f"Rolled out over layers 0-{last}, the top patch is {where(top, g.grid)}, and the top tenth of the "
                f"patches holds **{pct(facts.top_share(rollout))}** of the total."),
        try_this="Move **Roll out up to layer** from 0 to the last and watch where the map settles.",
        question=Question(f"Rolled out over all {g.num_layers} layers instead of layer 0 alone, is the map more "
                          "focused or more spread out?", (MORE_FOCUSED, MORE_SPREAD),
                          0 if e_every < e_first else 1),
        reveal=f"Layer 0 alone: spread over about {e_first:.0f} patches; all layers: about {e_every:.0f}.",
        explore={"view": "Attention", "rollout_layer": str(last)},
    )


# ----------------------------------------------------------------------------------------------
# 7-10: distance, prediction, why, further


def how_far(g: Geometry, distances: np.ndarray, uniform: float, images: int = 1) -> StepText:
    """distances: (L, H) this image's mean attention distance per head, in pixels; images: how many images of this
    model the figure averages (its crosses, drawn from 2 images on)."""
    best = facts.most_global_layer(distances)
    means = distances.mean(axis=1)  # (L,)
    if images > 1:
        average = (f"The crosses average the {images} images you analysed with this model: draw another shape or pick "
                   f"another example in {SIDEBAR}, and they move.")
    else:
        average = (f"With one image there is nothing to average yet: draw a shape or pick another example in {SIDEBAR}, "
                   "and the figure adds crosses, the average of your images.")
    other = 0 if best else len(means) - 1  # the reveal compares the answer with another layer, never with itself
    return StepText(
        body=("For each head, average the distance in pixels between a patch and the patches it attends to, weighted "
              "by attention: its **mean attention distance** (paper Fig. 7, right). A CNN's first layers only see "
              "neighbours; a ViT's heads may look anywhere from layer 0 on."),
        notice=(f"In layer 0 the heads range from **{distances[0].min():.0f} to {distances[0].max():.0f} px**; in the "
                f"last layer from {distances[-1].min():.0f} to {distances[-1].max():.0f} px. Attention spread evenly "
                f"would give {uniform:.0f} px (the dashed line)."),
        try_this=f"{average} Does the most global layer stay the same?",  # not named: the question below asks it
        question=question("Which layer has the most global heads (the largest mean distance)?",
                          list(range(g.num_layers)), best),
        reveal=(f"Layer {best}: {means[best]:.0f} px on average over its heads (layer {other}: "
                f"{means[other]:.0f} px)."),
        explore={"view": "Distance"},
    )


SHIFT_YES, SHIFT_NO = "Yes, it rises", "No, it stays the same"


def prediction(g: Geometry, preds: Sequence[Prediction], outside: str | None, thickness: str | None = None) -> StepText:
    """preds: the top classes, best first (at least one); outside, thickness: a sentence on an image outside the
    model's world, and on a ring with circle second (dashboard.draw.thickness_note), or None."""
    top = preds[0]
    runner = (f"; the runner-up, **{md(preds[1].label)}**, gets {pct(preds[1].prob)}" if len(preds) > 1 else "")
    gap = top.logit - preds[1].logit if len(preds) > 1 else 0.0
    return StepText(
        body=(f"After the last block, the {'class token' if g.has_class_token else 'pooled token'} goes through a final "
              f"norm and one linear layer, the **head**: {g.num_classes} scores (logits), one per class. Softmax turns "
              "them into probabilities that sum to 1."),
        notice=(f"The model says **{md(top.label)}** with **{pct(top.prob)}**{runner}."
                + "".join(f" {extra}" for extra in (outside, thickness) if extra)),
        try_this=(f"Turn on **Draw** in {SIDEBAR} and change your shape a little at a time: how far can you go "
                  "before the answer changes?"),
        question=Question(f"If every logit rose by 5, would {md(top.label)}'s probability change?",
                          (SHIFT_YES, SHIFT_NO), 1),
        reveal=(f"No: softmax depends only on differences between logits. {md(top.label)} leads by {gap:.2f}, and "
                "that gap is what decides." if len(preds) > 1 else
                "No: softmax depends only on differences between logits."),
        explore={"view": "Prediction"},
    )


VERDICT_ANSWERS = ("Yes: faster than random, beyond the random orders' spread", "Not distinguishable from random",
                   "No: slower than random")


def why(g: Geometry, label: str, method: str, relevance: np.ndarray) -> StepText:
    """relevance: (gh, gw) the map of `method` (its title) for class `label`."""
    top = facts.top_patch(relevance)
    return StepText(
        body=(f"A **relevance map** scores each patch for how much it pushed the model towards {md(label)}. Methods "
              "disagree, and a map can look convincing and still be wrong. The **deletion test** asks the model: "
              "delete the patches the map ranks highest first, and p(class) should fall faster than for random orders."),
        notice=(f"{method}'s top patch is {where(top, g.grid)}; its top tenth of the patches holds "
                f"**{pct(facts.top_share(relevance))}** of its positive relevance."),
        try_this="Pick another **Method**: do the maps agree on the same patches?",
        question=Question(f"Will deleting {method}'s top patches first make p({md(label)}) fall faster than random "
                          "orders?", VERDICT_ANSWERS, 0),  # the answer is set from the test's verdict: `judged`
        explore={"view": "Why?", "tests": "deletion_auc"},
    )


def judged(text: StepText, verdict: int, auc: float, random_mean: float, random_std: float, margin: float) -> StepText:
    """The why step's question answered by the deletion test: `verdict` indexes VERDICT_ANSWERS; the AUC of p(class)
    along the deletion curve (lower is better) beside the random orders' mean and standard deviation."""
    assert text.question is not None
    q = text.question
    return StepText(text.body, text.notice, text.try_this, Question(q.prompt, q.options, verdict, q.why),
                    f"Deletion AUC {auc:.3f} against random {random_mean:.3f} ± {random_std:.3f} (lower is better; "
                    f"beating random needs more than {margin:g} standard deviations).", text.explore)


def going_further(g: Geometry, label: str, settled: int) -> StepText:
    """settled: the first logit-lens row from which on the top-1 class is the final one (0: the embeddings, l: after
    block l - 1; the last row, g.num_layers: only after the last block)."""
    last = g.num_layers - 1
    if settled == 0:
        when = f"is **{md(label)}** already at the embeddings and stays so through every block"
    elif settled > last:
        when = f"becomes **{md(label)}** only after the last block (block {last}); before it, another class led"
    else:
        when = f"becomes **{md(label)}** after block {settled - 1} and stays so through the last (block {last})"
    return StepText(
        body=("Three tools researchers use next: **interventions** (drop patches or switch heads off and see the "
              "prediction change), the **logit lens** (the model's head read after every block, as in the figure), "
              "and **registers & norms** (tokens with huge norms that store global information)."),
        notice=f"Read after each of the {g.num_layers} blocks, the top class {when}.",
        try_this="Open **Interventions** and drop the patches your relevance map ranked highest: does the answer hold?",
    )
