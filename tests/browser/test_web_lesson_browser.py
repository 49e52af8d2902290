"""The static lesson (`vit-lens export-web`) in headless chromium, served by a local static server: every step
renders; the page's analyses equal the library's on the same arrays; a drawn star, an uploaded image and 100
drawings are predicted as the library predicts them (the page's resize and crop included); no request leaves the
site's origin."""

from __future__ import annotations

import base64
import functools
import http.server
import io
import os
import re
import threading

import numpy as np
import pytest
from PIL import Image, ImageDraw

from support.browser import CHROMIUM, NO_CHROMIUM, page_at
from vit_core import analyses as A
from vit_core import load_model, run_with_capture
from vit_core.explain.lens import logit_lens
from vit_core.explain.occlusion import occlusion_map
from vit_core.explain.perturbation import faithfulness, random_patch_orders
from vit_core.teaching.data import CLASS_NAMES, sample_image
from vit_core.web import site as web_site

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)
ORT_INSTALLED = (web_site.WEB_ROOT / "node_modules" / web_site.ORT_PACKAGE / "dist" / web_site.ORT_FILES[-1]).is_file()
if not ORT_INSTALLED and os.environ.get("CI"):
    raise RuntimeError("CI must run the static lesson's tests: tools/setup installs onnxruntime-web with npm, and it is missing")

RELATIVE = 1e-5  # of the largest value: the page's analyses against the library's
POINTS = 0.001  # 0.1 percentage points: the page's prediction against the library's, the page's resize and crop included


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def shapes():
    return load_model("vit-lens/shapes-vit")


@pytest.fixture(scope="module")
def site_url(shapes, tmp_path_factory):
    """The Shapes ViT's site, written by the export and served by Python's own static server (as a teacher would)."""
    if not ORT_INSTALLED:
        pytest.skip("onnxruntime-web is not installed (bash tools/setup)")
    out = tmp_path_factory.mktemp("site")
    web_site.write_site(shapes, out)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(out)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()


@pytest.fixture(scope="module")
def lesson(browser, site_url):
    """The page at 1280 x 720, ready (the first example predicted), with every request it made and every error."""
    with page_at(browser, (1280, 720)) as page:
        requests, errors = [], []
        page.on("request", lambda r: requests.append(r.url))
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(site_url + "?step=1")
        page.wait_for_selector("body[data-ready]", state="attached", timeout=60_000)
        yield page, requests, errors


def ready_count(page) -> int:
    return int(page.evaluate("document.body.dataset.ready"))


def wait_next_prediction(page, before: int) -> None:
    page.wait_for_function(f"Number(document.body.dataset.ready) > {before}", timeout=30_000)


def b64(array: np.ndarray, dtype: str = "<f4") -> str:
    return base64.b64encode(np.ascontiguousarray(array, dtype=dtype).tobytes()).decode("ascii")


FROM_B64 = """(s, T) => { const b = Uint8Array.from(atob(s), (c) => c.charCodeAt(0)); return new T(b.buffer); }"""


def page_prediction(page) -> tuple[str, float]:
    return tuple(page.evaluate("[vitLens.app.image.preds[0].label, vitLens.app.image.preds[0].prob]"))


def library_prediction(loaded, image: Image.Image) -> tuple[str, float]:
    top = A.top_k(run_with_capture(loaded, image).logits, loaded.labels, 1)[0]
    return top.label, top.prob


def test_every_step_renders(lesson):
    page, _, errors = lesson
    for step in range(12):  # 0: the concept check, 1..10: the steps, 11: the check again
        page.goto(page.url.split("?")[0] + f"?step={step}")
        page.wait_for_selector("body[data-ready]", state="attached", timeout=60_000)
        assert page.inner_text("#title").strip()
        if 1 <= step <= 10:
            assert page.locator("#figure canvas, #figure svg").count() >= 1, step
            assert page.inner_text("#notice").startswith("Notice."), step
        else:
            assert page.locator(".concept-check .question").count() == 5
    page.goto(page.url.split("?")[0] + "?step=10")
    page.wait_for_selector("body[data-ready]", state="attached", timeout=60_000)
    page.get_by_role("button", name="Token norms").click()
    assert page.locator("#figure canvas[aria-label='token norms']").count() == 1
    assert re.search(r"\d+ high-norm patches", page.inner_text("#controls"))
    page.keyboard.press("PageUp")  # a presenter's clicker
    assert page.inner_text("#title").startswith("9.") and page.url.endswith("?step=9")
    page.goto(page.url.split("?")[0] + "?step=9")
    page.wait_for_selector("#figure svg[aria-label='deletion test']", timeout=60_000)
    verdicts = "beats random|worse than random|not distinguishable from random"
    assert re.search(rf"Deletion test: ({verdicts})", page.inner_text("#controls"))
    assert re.fullmatch(r"Prediction: \w+ \(\d+\.\d%\)", page.inner_text("#prediction").strip())
    assert errors == []


def test_the_pages_analyses_are_the_librarys(lesson, shapes):
    page, _, _ = lesson
    image = sample_image("star", seed=2)
    cap = run_with_capture(shapes, image)
    g = shapes.geometry
    target = int(np.argmax(cap.logits))
    rollout = A.attention_rollout(cap.pattern, g.num_prefix_tokens, g.grid)
    distances = A.mean_attention_distance(cap.pattern, g.num_prefix_tokens, g.grid, g.patch_size)
    lens = logit_lens(shapes, cap)
    occlusion = occlusion_map(shapes, cap, target)
    test = faithfulness(shapes, cap, {"rollout": rollout}, target)
    token_norms = np.linalg.norm(cap.tokens.astype(np.float64), axis=-1)  # (L+1, T)
    page_values = page.evaluate(f"""async ([att, pixels, map, target, normsB64]) => {{
        const fromB64 = {FROM_B64};
        const V = vitLens, g = V.model.g, A = V.analyses;
        const a = fromB64(att, Float32Array), x = fromB64(pixels, Float32Array), m = fromB64(map, Float32Array);
        const norms = fromB64(normsB64, Float32Array);
        const pass = await V.model.analyse(x);
        const {{ random_orders: orders, steps }} = V.app.site.info.deletion;
        const test = await V.why.deletionTest(V.model, x, m, target, orders, steps);
        return {{
            rollout: Array.from(A.rollout(a, g)), distances: Array.from(A.meanAttentionDistance(a, g)),
            lens: Array.from(pass.lens), occlusion: Array.from(await V.why.occlusion(V.model, x, target)),
            deletion: test.curve, random: test.randomMean, spread: test.randomSpread, verdict: test.verdict.label,
            norms: Array.from(pass.norms), logits: Array.from(pass.logits),
            attention: btoa(Array.from(new Uint8Array(pass.attention.buffer), (c) => String.fromCharCode(c)).join("")),
            high: [...Array(g.L + 1).keys()].map((r) => A.highNormPatches(norms.subarray(r * g.T, (r + 1) * g.T), g)),
        }};
    }}""", [b64(cap.pattern), b64(cap.input_tensor), b64(rollout), target, b64(token_norms)])

    def close(ours, theirs, name, scale=None):
        theirs = np.asarray(theirs, dtype=np.float64).ravel()
        gap = np.abs(np.asarray(ours, dtype=np.float64) - theirs).max()
        scale = scale or max(np.abs(theirs).max(), 1e-12)
        print(f"{name}: the page's and the library's differ by {gap:.2g}, {gap / scale:.2g} of {scale:.3g}")
        assert gap <= RELATIVE * scale, (name, gap)

    close(page_values["logits"], cap.logits, "logits (onnxruntime-web)")
    close(np.frombuffer(base64.b64decode(page_values["attention"]), "<f4"), cap.pattern, "attention (onnxruntime-web)")

    close(page_values["rollout"], rollout, "rollout")
    close(page_values["distances"], distances, "mean attention distance")
    close(page_values["lens"], lens, "logit lens")
    # The occlusion map is a difference of two probabilities near p_c, which a float32 forward knows to about 1e-7
    # (onnxruntime's logits and torch's differ by 2e-6): its own largest value (1.6e-3 here, each patch matters little
    # alone) is no scale for it; the probabilities it is made of are.
    close(page_values["occlusion"], occlusion, "occlusion", scale=float(A.softmax(cap.logits)[target]))
    close(page_values["deletion"], test.deletion["rollout"], "deletion curve")
    close(page_values["random"], test.deletion["random"], "random deletion curve")
    close(page_values["spread"], test.random_deletion_std, "random spread")
    assert page_values["verdict"] == test.deletion_verdict("rollout").label
    close(page_values["norms"], token_norms, "token norms")
    assert np.array_equal(page_values["high"], A.high_norm_patches(token_norms.astype(np.float32), g.num_prefix_tokens))
    assert np.array_equal(random_patch_orders(g.num_patches), page.evaluate("vitLens.app.site.info.deletion.random_orders"))


def star_strokes(box) -> list[tuple[float, float]]:
    """A five-pointed star drawn in one stroke, in page coordinates of the drawing canvas's box."""
    cx, cy, r = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2, box["width"] * 0.38
    points = [(cx + r * np.sin(4 * np.pi * i / 5), cy - r * np.cos(4 * np.pi * i / 5)) for i in range(6)]
    return points


def test_a_drawn_star_is_predicted_as_the_library_predicts_it(lesson, shapes):
    page, _, _ = lesson
    page.click("#draw")
    canvas = page.locator("#drawing")
    canvas.scroll_into_view_if_needed()  # (under the text on steps 9 and 10, where the figures take the width)
    box = canvas.bounding_box()
    before = ready_count(page)
    points = star_strokes(box)
    page.mouse.move(*points[0])
    page.mouse.down()
    for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
        for t in np.linspace(0, 1, 8)[1:]:
            page.mouse.move(x0 + t * (x1 - x0), y0 + t * (y1 - y0))
    page.mouse.up()
    wait_next_prediction(page, before)
    label, prob = page_prediction(page)
    png = base64.b64decode(page.evaluate("document.getElementById('drawing').toDataURL('image/png')").split(",", 1)[1])
    theirs = library_prediction(shapes, Image.open(io.BytesIO(png)))
    assert label == theirs[0] == "star"
    assert abs(prob - theirs[1]) <= POINTS


def test_an_uploaded_image_is_predicted_as_the_library_predicts_it(lesson, shapes, tmp_path):
    page, _, _ = lesson
    picture = Image.new("RGB", (260, 190), (250, 248, 240))
    picture.paste(sample_image("heart", seed=5, size=150), (60, 20))  # not square: the resize and the crop both work
    path = tmp_path / "heart.png"
    picture.save(path)
    before = ready_count(page)
    page.set_input_files("#photo", str(path))
    wait_next_prediction(page, before)
    label, prob = page_prediction(page)
    theirs = library_prediction(shapes, Image.open(path))
    assert label == theirs[0]
    assert abs(prob - theirs[1]) <= POINTS


def drawings(count: int = 100):
    """Shapes of every class on pages of random sizes and aspect ratios (seeded): what a class's photos and drawings are."""
    rng = np.random.default_rng(0)
    for i in range(count):
        name = CLASS_NAMES[i % len(CLASS_NAMES)]
        side = int(rng.integers(48, 220))
        size = (side + int(rng.integers(0, 120)), side + int(rng.integers(0, 120)))
        page = Image.new("RGB", size, tuple(rng.integers(200, 256, 3).tolist()))
        corner = (int(rng.integers(0, size[0] - side + 1)), int(rng.integers(0, size[1] - side + 1)))
        page.paste(sample_image(name, seed=100 + i, size=side), corner)
        if i % 3 == 0:
            ImageDraw.Draw(page).line([(0, 0), page.size], fill=(90, 90, 90), width=2)
        yield page


def test_the_pages_resize_and_crop_give_the_librarys_predictions(lesson, shapes):
    """On the examples and 100 drawings: the page's crop (Pillow's resampling in JavaScript) is the library's, byte for
    byte, and its top-1 and probability are the library's to 0.1 points."""
    page, _, _ = lesson
    images = [sample_image(name, seed=2) for name in CLASS_NAMES if name != "other"] + list(drawings())
    payload = [[b64(np.asarray(im), "u1"), im.width, im.height] for im in images]
    results = page.evaluate(f"""async (images) => {{
        const fromB64 = {FROM_B64};
        const V = vitLens, pre = V.app.site.info.preprocessing, A = V.analyses, out = [];
        for (const [rgb, w, h] of images) {{
            const {{ crop, width, height }} = V.preprocess.modelCrop(fromB64(rgb, Uint8Array), w, h, pre);
            const pass = await V.model.analyse(V.preprocess.normalised(crop, width, height, pre));
            const top = A.topK(A.softmax(pass.logits), 1)[0];
            out.push([btoa(String.fromCharCode(...crop)), top.index, top.prob]);
        }}
        return out;
    }}""", payload)
    worst = 0.0
    for image, (crop, index, prob) in zip(images, results, strict=True):
        cap = run_with_capture(shapes, image)
        assert np.array_equal(np.frombuffer(base64.b64decode(crop), np.uint8), cap.input_image.ravel())
        assert index == int(np.argmax(cap.logits))
        worst = max(worst, abs(prob - float(A.softmax(cap.logits)[index])))
    assert worst <= POINTS, worst


def test_once_loaded_the_lesson_works_offline(lesson):
    """With the network gone, an example, the deletion test and a new step still work: the page has what it needs."""
    page, _, errors = lesson
    page.context.set_offline(True)
    try:
        before = ready_count(page)
        page.get_by_role("button", name="arrow", exact=True).click()
        wait_next_prediction(page, before)
        page.get_by_role("button", name="9", exact=True).click()
        page.wait_for_selector("#figure svg[aria-label='deletion test']", timeout=60_000)
        assert page_prediction(page)[0] and not errors
    finally:
        page.context.set_offline(False)


def test_no_request_leaves_the_sites_origin(lesson, site_url):
    _, requests, _ = lesson
    assert requests and all(url.startswith(site_url) or url.startswith("data:") for url in requests), \
        [u for u in requests if not u.startswith(site_url)]


def plain(text: str) -> str:
    """A step's sentence without its markup (the Streamlit lesson's Markdown, the page's HTML)."""
    return re.sub(r"\*\*|</?b>|\\\\", "", text).strip()


def test_the_steps_say_what_the_streamlit_lesson_says(lesson, shapes):
    """On the same arrays, each step's notice and its question (prompt, options, answer) are the Streamlit lesson's
    (dashboard/lesson/steps.py), word for word."""
    from dashboard.lesson import facts, steps
    from vit_core.loading.model import patch_embed_weight, pos_embed_rows

    page, _, _ = lesson
    g = shapes.geometry
    image = sample_image("star", seed=2)
    cap = run_with_capture(shapes, image)
    k, p = g.center_patch, g.num_prefix_tokens
    similarity = A.pos_embed_similarity(pos_embed_rows(shapes), p, g.no_embed_class, g.grid)
    explained = A.filters_pca(patch_embed_weight(shapes)).explained_variance_ratio
    maps = A.layer_attention_maps(cap.pattern, 0, 0, p, g.grid)
    rolled = [A.attention_rollout(cap.pattern, p, g.grid, last_layer=last) for last in (0, g.num_layers - 1)]
    distances = A.mean_attention_distance(cap.pattern, p, g.grid, g.patch_size)
    uniform = A.uniform_attention_distance(g.grid, g.patch_size)
    preds = A.top_k(cap.logits, shapes.labels, g.num_classes)
    lens_tops = np.argmax(logit_lens(shapes, cap), axis=-1)
    theirs = [
        steps.image_and_patches(g, "star", image.size),
        steps.patch_to_vector(g, explained),
        steps.where_it_is(g, similarity[k], k),
        steps.one_head(g, 0, 0, 0, A.attention_map(cap.pattern, 0, 0, 0, p, g.grid)),
        steps.all_heads(g, 0, 0, maps),
        steps.through_layers(g, g.num_layers - 1, rolled[1], rolled[0], rolled[1]),
        steps.how_far(g, distances, uniform),
        steps.prediction(g, preds, None),
        steps.going_further(g, preds[0].label, facts.top_layer_from(lens_tops)),
    ]
    ours = page.evaluate(f"""([att, sim, explained, k, size, settled, logitsB64]) => {{
        const fromB64 = {FROM_B64};
        const V = vitLens, g = V.model.g, A = V.analyses, L = V.lesson, a = fromB64(att, Float32Array);
        const similarity = fromB64(sim, Float32Array).subarray(k * g.N, (k + 1) * g.N);
        const maps = [...Array(g.H).keys()].map((h) => A.attentionRow(a, g, 0, h, 0).map);
        const logits = fromB64(logitsB64, Float32Array), probs = A.softmax(logits);
        const preds = A.topK(probs, g.C).map((p) => ({{ ...p, label: V.app.label(p.index), logit: logits[p.index] }}));
        const mad = A.meanAttentionDistance(a, g), first = A.rollout(a, g, 0), every = A.rollout(a, g);
        return [
            L.imageAndPatches(g, "star", size),
            L.patchToVector(g, V.app.site.info.geometry.embed_dim, fromB64(explained, Float32Array)),
            L.whereItIs(g, similarity, k), L.oneHead(g, 0, 0, 0, A.attentionRow(a, g, 0, 0, 0)), L.allHeads(g, 0, 0, maps),
            L.throughLayers(g, g.L - 1, every, first, every), L.howFar(g, mad, A.uniformDistance(g), 1), L.prediction(g, preds),
            L.goingFurther(g, preds[0].label, settled),
        ];
    }}""", [b64(cap.pattern), b64(similarity), b64(explained), k, list(image.size), facts.top_layer_from(lens_tops),
            b64(cap.logits)])
    for step, (py, js) in enumerate(zip(theirs, ours, strict=True), start=1):
        assert plain(js["notice"]) == plain(py.notice), step
        if py.question is None:
            assert js["question"] is None, step
            continue
        assert plain(js["question"]["prompt"]) == plain(py.question.prompt), step
        assert [plain(o) for o in js["question"]["options"]] == [plain(o) for o in py.question.options], step
        assert js["question"]["answer"] == py.question.answer, step
        assert plain(js["reveal"]) == plain(py.reveal), step


@pytest.mark.parametrize("config", [
    {"input_size": (3, 224, 224), "interpolation": "bicubic", "crop_pct": 0.9, "crop_mode": "center"},  # ViT-B/16 augreg2
    {"input_size": (3, 224, 224), "interpolation": "bilinear", "crop_pct": 0.875, "crop_mode": "center"},
    {"input_size": (3, 384, 384), "interpolation": "bicubic", "crop_pct": 1.0, "crop_mode": "squash"},
])
def test_the_pages_resize_and_crop_are_timms_for_imagenet_configs(lesson, config):
    """The page's crop for other models' preprocessing (bicubic, crop_pct < 1, squash) is the library's, byte for byte:
    timm's eval transform up to its crop (vit_core.loading.model.split_eval_transform), on photos larger and smaller
    than the input."""
    from vit_core.loading.model import split_eval_transform

    page, _, _ = lesson
    data_config = {**config, "mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5)}
    crop_transform, _ = split_eval_transform(data_config)
    images = [next(drawings(1)).resize(size) for size in [(512, 600), (300, 200), (97, 130), (224, 224)]]
    pre = {**data_config, "input_size": list(config["input_size"]), "mean": [0.5] * 3, "std": [0.5] * 3}
    crops = page.evaluate(f"""([images, pre]) => {{
        const fromB64 = {FROM_B64};
        return images.map(([rgb, w, h]) => {{
            const {{ crop }} = vitLens.preprocess.modelCrop(fromB64(rgb, Uint8Array), w, h, pre);
            let s = ""; for (const v of crop) s += String.fromCharCode(v);
            return btoa(s);
        }});
    }}""", [[[b64(np.asarray(im), "u1"), im.width, im.height] for im in images], pre])
    for image, crop in zip(images, crops, strict=True):
        expected = np.asarray(crop_transform(image), dtype=np.uint8).ravel()
        ours = np.frombuffer(base64.b64decode(crop), np.uint8)
        assert ours.shape == expected.shape, (image.size, ours.shape, expected.shape)
        assert np.array_equal(ours, expected), (image.size, np.abs(ours.astype(int) - expected).max())


@pytest.fixture
def fresh(browser, site_url):
    """A page of its own at a size (its `open(size, step)`): the layout tests change what the module's page shows."""
    pages = []

    def open_at(size: tuple[int, int], step: int):
        page = browser.new_page(viewport={"width": size[0], "height": size[1]})
        pages.append(page)
        page.goto(site_url + f"?step={step}")
        page.wait_for_selector("body[data-ready]", state="attached", timeout=60_000)
        return page

    yield open_at
    for page in pages:
        page.close()


def box(page, selector: str) -> dict:
    return page.locator(selector).first.bounding_box()


def test_on_a_phone_each_steps_title_and_question_come_first(fresh):
    """390 x 844: the step's title, text and question before its figure and the image inputs (step 9's title was
    about 1,400 px down)."""
    for step in (1, 5, 9):
        page = fresh((390, 844), step)
        title, question, figure, inputs = (box(page, s) for s in ("#title", "#question", "#figure", "#inputs"))
        assert title["y"] < 300, (step, title)
        assert title["y"] < question["y"] < figure["y"] < inputs["y"], step


def test_at_a_projector_the_drawing_canvas_is_whole_in_the_first_screen(fresh):
    page = fresh((1280, 720), 1)
    page.click("#draw")
    canvas = box(page, "#drawing")
    assert canvas["y"] + canvas["height"] <= 720, canvas
    assert page.locator("#photo").count() == 1 and page.locator("#camera").count() == 1  # still there, shown as buttons


def test_the_patch_grid_shows_on_a_white_drawing(fresh):
    """Step 1's grid on an all-white image: its lines are darker than the image (a white line on white vanished)."""
    page = fresh((1280, 720), 1)
    page.click("#draw")
    before = ready_count(page)
    canvas = box(page, "#drawing")
    page.mouse.move(canvas["x"] + 5, canvas["y"] + 5)  # one dot in a corner: the image stays white where the grid is
    page.mouse.down()
    page.mouse.move(canvas["x"] + 6, canvas["y"] + 6)
    page.mouse.up()
    wait_next_prediction(page, before)
    line, cell = page.evaluate("""() => {
        const c = document.querySelector("#figure canvas"), ctx = c.getContext("2d"), g = vitLens.app.g;
        const x = Math.round(c.width / g.grid[1] * 2), y = Math.round(c.height / g.grid[0] * 3.5);  // away from the frame
        const px = (x, y) => Array.from(ctx.getImageData(x, y, 1, 1).data.slice(0, 3));
        return [px(x, y), px(x + Math.round(c.width / g.grid[1] / 2), y)];
    }""")
    assert min(cell) >= 250, cell  # the white image inside a patch
    assert max(line) <= 200, line  # the grid's line on it


def test_step_5_opens_at_the_dashboards_layer_with_the_image_under_each_tile(fresh):
    """Step 5 opens at the last layer, as the dashboard's lesson does, so the Notice numbers agree; each tile of its
    grid is drawn over the image (a constant map over a half-black, half-white image shows both halves)."""
    page = fresh((1280, 720), 5)
    layers = page.evaluate("vitLens.app.g.L")
    assert page.input_value("#layer") == str(layers - 1)
    assert f"In layer {layers - 1}," in page.inner_text("#notice")
    left, right = page.evaluate("""() => {
        const g = vitLens.app.g, [h, w] = g.imgSize, crop = new Uint8ClampedArray(h * w * 3);
        for (let i = 0; i < h * w; i++) if (i % w >= w / 2) crop.fill(255, i * 3, i * 3 + 3);
        const c = vitLens.figures.mapGrid([new Float32Array(g.N)], 1, g.grid, 1, 100, null, -1, { crop, size: g.imgSize });
        const px = (x) => Array.from(c.getContext("2d").getImageData(x, 50, 1, 1).data.slice(0, 3));
        return [px(20), px(80)];
    }""")
    assert sum(right) - sum(left) > 60, (left, right)  # a map alone (no image under) is one colour here


def test_steps_9_and_10_show_their_figures_large_in_the_first_screen(fresh):
    """At 1280 x 720 each of the two figures is at least 320 px wide (about 220 px before), whole on the first screen."""
    for step, selector in ((9, "#figure svg[aria-label='deletion test']"), (10, "#figure svg[aria-label='logit lens']")):
        page = fresh((1280, 720), step)
        page.wait_for_selector(selector, timeout=60_000)
        for figure in page.locator("#figure canvas, #figure svg").all():
            b = figure.bounding_box()
            assert b["width"] >= 320 and b["y"] + b["height"] <= 720, (step, b)


@pytest.mark.parametrize("picture, sentence", [("gradient", "none of them (<code>other</code>, 92%)"),
                                               ("swirl", "it is unsure here: its best guess, circle, has only 44%")])
def test_a_photo_outside_the_models_world_is_explained_as_the_dashboard_explains_it(fresh, shapes, tmp_path, picture,
                                                                                    sentence):
    from dashboard.text import PHOTOS_OF_THE_WORLD
    from dashboard.views.header import outside_its_world

    y, x = np.mgrid[0:120, 0:160]
    pixels = {"gradient": np.stack([x * 1.5, y * 2, 255 - x], -1),
              "swirl": np.stack([x * 1.2 + y * 0.5, (x * y) % 255, y * 2], -1)}[picture]
    path = tmp_path / f"{picture}.png"
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(path)
    top = A.top_k(run_with_capture(shapes, Image.open(path)).logits, shapes.labels, 1)[0]
    theirs = outside_its_world("vit-lens/shapes-vit", shapes.labels, top)
    assert theirs is not None  # the dashboard explains this one: so must the page
    theirs = theirs.removesuffix(f" {PHOTOS_OF_THE_WORLD}")  # less the dashboard's way out: the page has no other model
    page = fresh((1280, 720), 8)
    before = ready_count(page)
    page.set_input_files("#photo", str(path))
    wait_next_prediction(page, before)
    ours = page.inner_html("#outside")
    assert sentence in ours and plain(ours.replace("<code>", "`").replace("</code>", "`")) == plain(theirs)
    assert plain(theirs).replace("`", "") in plain(page.inner_text("#notice"))  # step 8's Notice says it too, as the dashboard's


def png_of_size(path, width: int, height: int) -> None:
    """A drawn PNG of that many pixels, small on disk: 1 bit a pixel, a square in the middle (deflate of rows alike)."""
    image = Image.new("1", (width, height), 1)
    ImageDraw.Draw(image).rectangle((width // 3, height // 3, 2 * width // 3, 2 * height // 3), fill=0)
    image.save(path, optimize=False)


def test_a_huge_png_is_refused_from_its_header_and_a_large_one_decoded_scaled(fresh, tmp_path):
    """20000 x 20000 (400 MP, a small file): one sentence, from the header alone, and the previous image stays; a
    5000 x 4000 one (20 MP, over the page's 16 MP) is decoded at about 4 MP and predicted."""
    huge, large = tmp_path / "huge.png", tmp_path / "large.png"
    png_of_size(huge, 20000, 20000)
    png_of_size(large, 5000, 4000)
    assert huge.stat().st_size < 2_000_000
    page = fresh((1280, 720), 1)
    shown = page.evaluate("vitLens.app.image.name")
    page.set_input_files("#photo", str(huge))
    page.wait_for_function("document.getElementById('prediction').textContent.includes('huge.png')", timeout=30_000)
    assert page.inner_text("#prediction").strip() == (
        "huge.png: The image is 20000 x 20000 pixels (400 MP); the limit is 50 MP. Downscale it first.")
    assert page.evaluate("vitLens.app.image.name") == shown
    before = ready_count(page)
    page.set_input_files("#photo", str(large))
    wait_next_prediction(page, before)
    width, height = page.evaluate("vitLens.app.image.size")
    assert width < 5000 and abs(width / height - 5000 / 4000) < 0.01 and 2e6 <= width * height <= 4e6, (width, height)
    assert re.fullmatch(r"Prediction: \w+ \(\d+\.\d%\)", page.inner_text("#prediction").strip())
