"""The dashboard run in-process with Streamlit's AppTest (no browser).

The model is chosen by environment variable (see dashboard/models.py): `VIT_LENS_MODEL=test-tiny` is a
random-init 2-block vit_tiny_patch16_224, fast and offline. The bundled Shapes ViT is tested when
its weights exist. `st.cache_resource` persists across tests in one process, so the model loads once.
"""

from __future__ import annotations

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from conftest import REPO as ROOT
from conftest import assert_healthy, encoded, run_app
from dashboard import text
from dashboard.examples import GRACE_HOPPER, SHAPE_PREFIX
from dashboard.views import RENAMED, RESEARCH_VIEWS, VIEWS
from dashboard.views.header import outside_its_world
from tools.hostile import images as hostile
from vit_core import TEACHING_MODEL
from vit_core.analyses import Prediction


def shown(at: AppTest) -> tuple:
    """What the user sees, comparably: image URLs (content hashes), chart specs, texts."""
    images = tuple(url for im in at.get("image") for url in im.value)
    charts = tuple(c.proto.spec for c in at.get("plotly_chart"))
    texts = tuple(m.value for m in at.markdown) + tuple(m.value for m in at.caption) + tuple(m.value for m in at.metric)
    return images, charts, texts


NEEDS_A_FILE = ("Concepts",)  # tabs that show their figures once given a file (tests/app/test_concepts_tab.py)


def test_every_view_renders_on_a_tiny_model(tiny_env):
    at = run_app()
    assert at.tabs and [t.label for t in at.tabs] == list(VIEWS)
    assert "vit_tiny_patch16_224" in "".join(m.value for m in at.markdown)
    assert any("RANDOM weights" in m.value and "vit_tiny_patch16_224" in m.value for m in at.markdown)  # the header
    assert text.UNTRAINED in [w.value for w in at.warning]  # the sentence, under About
    for view in VIEWS:
        at.session_state["view"] = view
        at.run()
        assert_healthy(at)
        assert not at.error, [e.value for e in at.error]
        assert at.get("image") or view in NEEDS_A_FILE, f"{view} shows no figure"
    # shapes come from the live capture: 1 class token + 14 x 14 patches, width 192
    at.session_state["view"] = "1 Pipeline"
    at.run()
    table = "".join(m.value for m in at.markdown)
    assert "[1, 197, 192]" in table and "[1, 3, 224, 224]" in table


@pytest.mark.parametrize(
    "view, widget, key, value",
    [
        ("Attention", "slider", "layer", 0),
        ("Attention", "selectbox", "head", 1),
        ("Attention", "selectbox", "query", 20),
        ("Attention", "radio", "fusion", "max"),
        ("Attention", "slider", "rollout_layer", 0),
        ("Patches", "number_input", "patch", 3),
        ("Positions", "select_slider", "pos_res", 7),
        ("Positions", "number_input", "pos_patch", 3),
        ("Filters", "number_input", "filter_start", 32),
        ("Distance", "toggle", "mad_renorm", True),
        ("Prediction", "slider", "topk", 3),
        ("Pipeline", "slider", "pipe_block", 0),
    ],
)
def test_each_control_changes_what_is_shown(tiny_env, view, widget, key, value):
    at = run_app(view=view)
    before = shown(at)
    getattr(at, widget)(key=key).set_value(value).run()
    assert_healthy(at)
    assert shown(at) != before, f"{key} -> {value} changed nothing in {view}"


def test_tabs_are_numbered_in_the_lessons_order_then_the_research_tools(tiny_env):
    at = run_app()
    assert [t.label for t in at.tabs] == ["1 Pipeline", "2 Patches", "3 Filters", "4 Positions", "5 Attention",
                                          "6 Distance", "7 Prediction", "8 Why?", *RESEARCH_VIEWS]
    assert list(RESEARCH_VIEWS) == ["Interventions", "Logit lens", "Registers & norms", "Concepts", "Lenses",
                                   "Compare"]


@pytest.mark.parametrize("old, new, widget, key", [("Pipeline", "1 Pipeline", "slider", "pipe_block"),
                                                   ("Attention", "5 Attention", "slider", "layer"),
                                                   ("Why?", "8 Why?", "selectbox", "target")])
def test_links_with_the_former_tab_labels_open_the_renamed_tabs(tiny_env, old, new, widget, key):
    """`?view=Attention` (README, slides, the load test) opens "5 Attention": RENAMED maps every former label."""
    assert RENAMED[old] == new
    at = run_app(view=old)
    assert at.session_state["view"] == new
    assert key in {w.key for w in at.get(widget)}  # the renamed tab's content is what ran


def test_a_former_tab_label_stays_in_the_link_as_todays(tiny_env):
    """`?view=Attention` opens "5 Attention" and the URL keeps the view (as its label today), so the link still shares it."""
    at = run_app(view="Attention")
    assert at.query_params["view"] == "5 Attention"
    assert "layer" in {w.key for w in at.slider}


@pytest.mark.parametrize("head, shown", [("2", 2), ("-1", -1), ("mean", -1), ("head 1", 1)])
def test_a_head_in_a_link_is_a_number_or_its_label(tiny_env, head, shown):
    """`&head=2` (the README's `&head=...`) and the widget's own label `&head=head+2` open the same head."""
    at = run_app(view="Attention", layer="1", head=head, query="6")
    assert at.selectbox(key="head").value == shown
    assert at.selectbox(key="query").value == 6  # a token by its index, as `patch 5 (row 0, col 5)` by its name
    assert any(f"layer 1, {'mean of heads' if shown == -1 else f'head {shown}'}" in m.value for m in at.markdown)


def test_the_header_is_one_line_and_the_introduction_is_behind_about(tiny_env):
    at = run_app(view="Attention")
    line = next(m.value for m in at.markdown if m.value.startswith("Model **"))
    assert "vit_tiny_patch16_224" in line and "(example)" in line and "· prediction " in line
    intro = [m.value for m in at.markdown if m.value == text.INTRO]
    assert len(intro) == 1  # once, inside the About popover, not above every tab


def test_query_parameters_open_the_shared_view(tiny_env):
    at = run_app(view="Attention", layer="1", head="head 2", query="patch 5 (row 0, col 5)")
    assert at.slider(key="layer").value == 1
    assert at.selectbox(key="head").value == 2
    assert at.selectbox(key="query").value == 1 + 5
    assert any("layer 1" in m.value for m in at.markdown)


def test_bad_upload_shows_an_error_and_keeps_the_previous_image(tiny_env):
    at = run_app(view="Attention")
    before = shown(at)[0]
    at.file_uploader(key="upload").set_value(("holiday.png", b"this is not an image", "image/png")).run()
    assert_healthy(at)
    assert any("holiday.png" in e.value and "not an image" in e.value for e in at.error)
    assert shown(at)[0] == before  # the previous image's views still render
    for view in ("Patches", "Prediction"):
        at.session_state["view"] = view
        at.run()
        assert_healthy(at)
        assert at.get("image")

    rng = np.random.default_rng(0)
    good = encoded(rng.integers(0, 255, size=(120, 160, 3), dtype=np.uint8))
    at.file_uploader(key="upload").set_value(("noise.png", good, "image/png")).run()
    assert_healthy(at)
    assert not at.error
    assert any("noise.png" in m.value for m in at.markdown)


@pytest.mark.parametrize("name, maker, message", [
    ("scans.jpg", lambda: hostile.many_scan_jpeg(3000), "progressive scans"),
    ("wide.png", lambda: hostile.gray_png(10_000, 10), "enlarge it to"),  # refused by the model's crop
])
def test_a_hostile_upload_is_refused_and_the_previous_image_kept(tiny_env, name, maker, message):
    at = run_app(view="Attention")
    before = shown(at)[0]
    at.file_uploader(key="upload").set_value((name, maker(), "image/png")).run()
    assert_healthy(at)
    assert any(message in e.value for e in at.error)
    assert shown(at)[0] == before


def test_a_damaged_later_frame_shows_the_first_one(tiny_env):
    at = run_app(view="Attention")
    at.file_uploader(key="upload").set_value(("damaged.gif", hostile.damaged_second_frame_gif(), "image/gif")).run()
    assert_healthy(at)
    assert not at.error
    assert any("damaged.gif" in m.value for m in at.markdown)


def test_examples_and_export(tiny_env):
    at = run_app(view="Prediction")
    at.selectbox(key="example").set_value("Synthetic scene (drawn by the app)").run()
    assert_healthy(at)
    assert any("Synthetic scene" in m.value for m in at.markdown)
    labels = [b.proto.label for b in at.get("download_button")]
    assert any(".npz" in label for label in labels) and any(".json" in label for label in labels)


@pytest.mark.skipif(not (ROOT / "vit_core" / "assets" / "shapes_vit" / "model.safetensors").is_file(),
                    reason="the bundled Shapes ViT is not trained yet (vit_core/assets/shapes_vit/model.safetensors)")
def test_bundled_teaching_model(monkeypatch):
    monkeypatch.setenv("VIT_LENS_MODEL", "vit-lens/shapes-vit")
    at = run_app()
    assert "vit-lens/shapes-vit" in "".join(m.value for m in at.markdown)
    assert not any("RANDOM weights" in w.value for w in at.warning)
    assert not any("RANDOM weights" in m.value for m in at.markdown)
    for view in VIEWS:
        at.session_state["view"] = view
        at.run()
        assert_healthy(at)
        assert at.get("image") or view in NEEDS_A_FILE


@pytest.mark.skipif(not (ROOT / "vit_core" / "assets" / "shapes_vit" / "model.safetensors").is_file(),
                    reason="the bundled Shapes ViT is not trained yet (vit_core/assets/shapes_vit/model.safetensors)")
def test_teaching_model_says_plainly_when_a_photo_is_none_of_its_shapes(monkeypatch):
    """A photograph (Grace Hopper) is outside the Shapes ViT's world: the page says it only knows its shapes.
    A drawn shape gets no such notice."""
    monkeypatch.setenv("VIT_LENS_MODEL", "vit-lens/shapes-vit")
    photo = run_app(example=GRACE_HOPPER)
    notices = [i.value for i in photo.info if "only knows 8 shapes" in i.value]
    assert len(notices) == 1, [i.value for i in photo.info]
    shape = run_app(example=f"{SHAPE_PREFIX}star")
    assert not [i.value for i in shape.info if "only knows 8 shapes" in i.value]


def test_outside_its_world_is_said_for_other_and_for_unsure_answers():
    labels = ("circle", "square", "triangle", "cross", "star", "ring", "heart", "arrow", "other")
    other = Prediction(8, "other", 0.91, 3.0)
    unsure = Prediction(3, "cross", 0.48, 1.0)
    sure = Prediction(4, "star", 0.93, 5.0)
    assert "none of them" in outside_its_world(TEACHING_MODEL, labels, other)
    assert "unsure" in outside_its_world(TEACHING_MODEL, labels, unsure) and "48%" in outside_its_world(
        TEACHING_MODEL, labels, unsure)
    assert outside_its_world(TEACHING_MODEL, labels, sure) is None
    assert outside_its_world("vit_base_patch16_224", labels, unsure) is None  # ImageNet models: not this notice


def test_patch_defaults_are_the_centre_patch_on_a_7x7_grid(monkeypatch):
    """ViT-B/32 sees 7 x 7 patches: the centre is patch 24 (row 3, col 3), for the Patches view and the
    Positions view alike. (An old formula, N // 2 + gw // 2, gave 27 here.)"""
    monkeypatch.setenv("VIT_LENS_MODEL", "vit_base_patch32_224")
    monkeypatch.setenv("VIT_LENS_RANDOM_INIT", "1")
    at = run_app(view="Patches")
    assert at.number_input(key="patch").value == 24
    assert any(m.value.startswith("**Patch 24** (row 3, column 3)") for m in at.markdown)
    assert run_app(view="Positions").number_input(key="pos_patch").value == 24


def test_each_prefix_token_gets_its_share_on_a_distilled_model(monkeypatch):
    """DeiT-distilled has two prefix tokens: the Attention tab lists each one's share of the query's row
    (analyses.prefix_token_shares), and together they are the metric's prefix share."""
    monkeypatch.setenv("VIT_LENS_MODEL", "deit_small_distilled_patch16_224")
    monkeypatch.setenv("VIT_LENS_RANDOM_INIT", "1")
    at = run_app(view="Attention", layer="0", head="head 1")
    line = next(c.value for c in at.caption if c.value.startswith("CLS: "))
    shares = [float(part.split(": ")[1].rstrip("%")) for part in line.split(" · ")]
    assert [part.split(":")[0] for part in line.split(" · ")] == ["CLS", "DIST"]
    total = float(next(m.value for m in at.metric if m.label.startswith("Share of this row")).rstrip("%"))
    assert sum(shares) == pytest.approx(total, abs=0.11)  # each rounded to 0.1 %


def main_area_order(at: AppTest) -> list[tuple[str, str]]:
    """The main area's elements in page order: (type, text) for alerts and captions, (type, "") for the rest."""
    order = []
    for node in at.main:
        kind = getattr(node, "type", "")
        value = getattr(node, "value", "") if kind in ("error", "caption", "markdown") else ""
        order.append((kind, value if isinstance(value, str) else ""))
    return order


@pytest.mark.parametrize("page", [None, "page_scripts/lesson.py"], ids=["one-image", "lesson"])
def test_a_refused_upload_is_said_in_the_main_area_above_the_figures(tiny_env, page):
    """A text file named .png: the refusal and the image still shown come first in the main area, before the page's
    first figure and its header; nothing of it in the sidebar, which a phone keeps closed."""
    at = run_app(view="Pipeline")
    if page is not None:
        at.switch_page(page).run()
        assert_healthy(at)
    still = shown(at)[0]
    at.file_uploader(key="upload").set_value(("fake.png", b"this is not an image", "image/png")).run()
    assert_healthy(at)
    assert not at.sidebar.error  # said once, where the user looks
    order = main_area_order(at)
    kinds = [kind for kind, _ in order]
    error = next(i for i, (kind, value) in enumerate(order) if kind == "error" and value.startswith("fake.png: "))
    assert "not an image" in order[error][1]
    assert order[error + 1] == ("caption", f"Still showing {examples_shown(at)}.")
    header = next(i for i, (kind, value) in enumerate(order) if kind == "markdown" and value.startswith("Model **")) \
        if page is None else len(order)  # the lesson has no header line
    assert error < kinds.index("image") and error < header  # above the first figure, and the header
    assert shown(at)[0] == still  # the previous image's figures
    at.file_uploader(key="upload").set_value(("noise.png", encoded(np.zeros((64, 64, 3), np.uint8)), "image/png")).run()
    assert_healthy(at)
    assert not at.error  # a good file: the refusal is gone


def examples_shown(at: AppTest) -> str:
    """The name of the image the sidebar says is shown ("Shown: **name** (source)")."""
    line = next(c.value for c in at.sidebar.caption if c.value.startswith("Shown: **"))
    return line.split("**")[1]


def test_a_refused_drawing_is_said_in_the_main_area_above_the_canvas_and_figures(tiny_env, monkeypatch):
    """A drawing the canvas check refuses: said first in the main area (above the canvas, its result and the tabs),
    with the previous drawing still shown; nothing of it in the sidebar."""
    import sys

    from app.test_draw_canvas import FakeCanvas
    from dashboard import session
    from tools.hostile.canvas import canvas_drawing, data_url, hostile_canvas_values

    at = run_app(view="Attention")
    at.toggle(key=session.K_DRAW_ON).set_value(True).run()
    canvas = FakeCanvas()
    monkeypatch.setattr(sys.modules["streamlit_drawable_canvas"], "st_canvas", canvas)
    canvas.url = data_url(canvas_drawing())
    at.run()
    assert_healthy(at)
    assert not at.error
    canvas.url = hostile_canvas_values()["fits"]
    at.run()
    assert_healthy(at)
    assert not at.sidebar.error
    order = main_area_order(at)
    error = next(i for i, (kind, value) in enumerate(order) if kind == "error" and value.startswith("drawing.png: "))
    assert order[error + 1] == ("caption", "Still showing drawing.png.")
    assert error < [kind for kind, _ in order].index("image")  # above the drawing's crop and every figure
