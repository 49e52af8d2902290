"""The Concepts tab on the Shapes ViT: the bundled concepts out of the box, and concepts learned by `vit-lens
concepts` from a small drawn folder, offered by the server by name (typed as a path only by a single user); the
image's strongest features (maps and top patches), its reconstruction error (checked against vit_core.concepts), and
"remove this concept" with the prediction before and after. A file of another model, a damaged or hostile one, or
no file, is said in one line and the tab keeps working."""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

import vit_core
from conftest import APP_TIMEOUT, assert_healthy, encoded
from dashboard import session
from dashboard.image_choice import ImageChoice
from dashboard.models import ModelRequest
from dashboard.views import LESSON_VIEWS, RESEARCH_VIEWS
from dashboard.views.concepts import TYPED, feature_marks
from dashboard.views.context import ViewContext
from support.dataset_folder import shapes_concepts
from vit_core.concepts import image_concepts, load_concepts, logits_with_concept_removed
from vit_core.concepts.folders import BUNDLED_DIR, BUNDLED_NAME
from vit_core.teaching.data import sample_image

SHAPES = "vit-lens/shapes-vit"


@functools.lru_cache(maxsize=None)
def shapes_context() -> ViewContext:
    loaded = vit_core.load_model(SHAPES, device="cpu")
    data = encoded(np.asarray(sample_image("star", seed=3)))
    picture = vit_core.decode_image(data).image
    image = ImageChoice("star.png", hashlib.sha256(data).hexdigest(), data, picture.size, (), picture)
    return ViewContext(ModelRequest(SHAPES), loaded, vit_core.run_with_capture(loaded, picture), image)


@pytest.fixture(scope="module")
def concepts_dir(tmp_path_factory) -> Path:
    return shapes_concepts(tmp_path_factory.mktemp("shapes"), tmp_path_factory.mktemp("concepts"), 18, 2, 128, 8, 3)


def view_script() -> None:
    from app import test_concepts_tab
    from dashboard.views.concepts import concepts_view

    concepts_view(test_concepts_tab.shapes_context())


def run_view() -> AppTest:
    at = AppTest.from_function(view_script, default_timeout=APP_TIMEOUT)
    at.run()
    assert_healthy(at)
    return at


def test_the_tab_is_among_the_research_tools():
    assert "Concepts" in RESEARCH_VIEWS and "Concepts" not in LESSON_VIEWS


@pytest.fixture
def offered(concepts_dir, monkeypatch) -> str:
    """The test's concepts offered as a teacher's folder (VIT_LENS_CONCEPTS): their name in the tab's list."""
    monkeypatch.setenv("VIT_LENS_CONCEPTS", str(concepts_dir))
    return concepts_dir.name


@pytest.fixture
def single_user(monkeypatch):
    """A server on loopback alone with the single-user defaults: the one place a typed path is offered."""
    from streamlit import config

    before = config.get_option("server.address")
    config.set_option("server.address", "127.0.0.1")
    monkeypatch.delenv("VIT_LENS_WEIGHTS_UPLOADS", raising=False)
    monkeypatch.delenv("VIT_LENS_ANY_MODEL", raising=False)
    yield
    config.set_option("server.address", before)


def test_the_bundled_concepts_open_with_the_shapes_vit_and_none_says_how_to_make_more():
    ctx = shapes_context()
    at = run_view()
    assert at.selectbox(key=session.K_CONCEPTS).value == BUNDLED_NAME
    assert not at.error and not at.text_input  # a server that others may reach: no path box
    seen = image_concepts(load_concepts(BUNDLED_DIR), ctx.cap)
    assert at.metric[0].value == f"{seen.error:.3f}" and len(seen.strongest)
    at.selectbox(key=session.K_CONCEPT_REMOVED).set_value(int(seen.strongest[0])).run()
    assert_healthy(at)
    assert any(f"After removing feature #{int(seen.strongest[0])}" in m.value for m in at.markdown)
    at.selectbox(key=session.K_CONCEPTS).set_value(None).run()
    assert any("vit-lens concepts FOLDER" in m.value for m in at.markdown)


def test_the_tab_shows_the_images_features_and_removes_one(concepts_dir, offered):
    ctx = shapes_context()
    at = run_view()
    assert TYPED not in at.selectbox(key=session.K_CONCEPTS).options
    at.selectbox(key=session.K_CONCEPTS).set_value(offered).run()
    assert_healthy(at)
    assert not at.error, [e.value for e in at.error]
    found = load_concepts(concepts_dir)
    seen = image_concepts(found, ctx.cap)
    assert at.metric[0].value == f"{seen.error:.3f}"
    assert len(at.get("image")) >= 2 * len(seen.strongest)  # each feature's map and its top patches
    captions = " ".join(c.value for c in at.caption)
    assert all(f"#{f}" in captions for f in seen.strongest.tolist())
    summary = json.loads((concepts_dir / "concepts.json").read_text())
    assert all(feature_marks(summary["features"][f], summary) in captions for f in seen.strongest.tolist())
    feature = int(seen.strongest[0])
    at.selectbox(key=session.K_CONCEPT_REMOVED).set_value(feature).run()
    assert_healthy(at)
    after = vit_core.analyses.top_k(logits_with_concept_removed(ctx.loaded, ctx.cap, found, feature), ctx.loaded.labels, 5)
    shown = " ".join(m.value for m in at.markdown)
    assert f"After removing feature #{feature}" in shown and f"1. {after[0].label} ({after[0].prob:.1%})" in shown


def test_a_feature_is_marked_unstable_at_cosine_0_9_or_less_and_says_whether_it_steers():
    assert feature_marks({}) == ""
    assert feature_marks({"stability": 0.9}).startswith(" **Unstable**") and "0.90" in feature_marks({"stability": 0.9})
    assert feature_marks({"stability": 0.95, "steers": True}) == (
        " Stable: a second dictionary (seed + 1) has it at cosine 0.95. Removing it changes the top-1 of some held-out "
        "image.")
    assert feature_marks({"steers": False}) == " Removing it changed no held-out image's top-1."
    assert feature_marks({"steers": False}, {"steering_images": 200, "held_out_images": 200}) == (
        " Removing it changed no held-out image's top-1.")
    assert feature_marks({"steers": False}, {"steering_images": 64, "held_out_images": 1200}) == (
        " Removing it changed the top-1 of none of the 64 held-out images tried (of 1,200).")


def test_a_class_server_takes_no_path(monkeypatch, single_user):
    """Weights uploads off (the class settings) on loopback, or any address but loopback: names only."""
    from streamlit import config

    monkeypatch.setenv("VIT_LENS_WEIGHTS_UPLOADS", "off")
    assert TYPED not in run_view().selectbox(key=session.K_CONCEPTS).options
    monkeypatch.delenv("VIT_LENS_WEIGHTS_UPLOADS")
    config.set_option("server.address", "0.0.0.0")
    assert TYPED not in run_view().selectbox(key=session.K_CONCEPTS).options


def typed(at: AppTest, path: str) -> AppTest:
    at.selectbox(key=session.K_CONCEPTS).set_value(TYPED).run()
    at.text_input(key=f"{session.K_CONCEPTS}_path").set_value(path).run()
    assert_healthy(at)
    return at


def test_a_single_user_types_a_path_and_hostile_ones_are_refused_in_one_sentence(concepts_dir, tmp_path, single_user,
                                                                                  monkeypatch):
    import os

    at = typed(run_view(), str(concepts_dir))
    assert not at.error and at.metric, [e.value for e in at.error]
    os.mkfifo(tmp_path / "concepts.safetensors")
    monkeypatch.chdir(tmp_path.parent)
    for path, said in ((tmp_path.name, "concepts.safetensors is not a regular file."),  # relative: the server's folder
                       (str(tmp_path / "nothing"), "no such file or directory"),
                       ("/" + "x" * 5000, "not a path this machine can have"),
                       ("/dev", "no such file")):
        at = typed(run_view(), path)
        assert len(at.error) == 1 and said in at.error[0].value, (path, [e.value for e in at.error])
        assert "Error" not in at.error[0].value and "\n" not in at.error[0].value


def test_concepts_of_another_model_are_said_in_one_line(concepts_dir, tmp_path, single_user):
    other = load_concepts(concepts_dir)
    from vit_core.concepts import Concepts, concepts_bytes

    renamed = Concepts(other.sae, other.normalisation, "vit_tiny_patch16_224", "", other.layer)
    (tmp_path / "concepts.safetensors").write_bytes(concepts_bytes(renamed))
    at = typed(run_view(), str(tmp_path))
    assert "vit_tiny_patch16_224" in at.warning[0].value


def test_concepts_learned_elsewhere_still_show_their_maps(concepts_dir, tmp_path, monkeypatch):
    """A concepts folder copied from another machine: its FOLDER is not here, so the crops can't be shown (said in
    a caption); the maps and the removal still work."""
    import json
    import shutil

    moved = tmp_path / "moved"
    moved.mkdir()
    shutil.copy(concepts_dir / "concepts.safetensors", moved)
    summary = json.loads((concepts_dir / "concepts.json").read_text())
    (moved / "concepts.json").write_text(json.dumps({**summary, "folder": "/nowhere/shapes"}))
    monkeypatch.setenv("VIT_LENS_CONCEPTS", str(moved))
    at = run_view()
    at.selectbox(key=session.K_CONCEPTS).set_value("moved").run()
    assert_healthy(at)
    assert not at.error
    assert any("/nowhere/shapes" in c.value and "not on this server" in c.value for c in at.caption)


def test_damaged_concepts_show_one_sentence_not_an_exception(concepts_dir, tmp_path, monkeypatch):
    import json
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(concepts_dir, bad, ignore=shutil.ignore_patterns("tokens"))
    summary = json.loads((concepts_dir / "concepts.json").read_text())
    summary["features"][0]["top"] = [{"file": "x.png", "row": 99, "col": 0, "activation": 1.0}]
    (bad / "concepts.json").write_text(json.dumps(summary))
    monkeypatch.setenv("VIT_LENS_CONCEPTS", str(bad))
    at = run_view()
    at.selectbox(key=session.K_CONCEPTS).set_value("bad").run()
    assert_healthy(at)
    assert len(at.error) == 1 and "grid" in at.error[0].value and not at.exception


@pytest.fixture(scope="module")
def circuit_dir(tmp_path_factory) -> Path:
    """`vit-lens concepts --layer 1,2` on 18 drawn Shapes: DIR/layer-1, DIR/layer-2 and DIR/circuit.json."""
    from PIL import Image

    from vit_core import __main__ as core_cli
    from vit_core.teaching.data import LABELS, draw_set

    images, out = tmp_path_factory.mktemp("circuit_images"), tmp_path_factory.mktemp("circuit") / "run"
    drawn = draw_set(18, seed=5)
    for i, image in enumerate(drawn.images):
        (images / LABELS[drawn.labels[i]]).mkdir(exist_ok=True)
        Image.fromarray(image).save(images / LABELS[drawn.labels[i]] / f"{i:02d}.png")
    assert core_cli.main(["concepts", str(images), "--model", SHAPES, "--layer", "1,2", "--features", "64", "--k", "4",
                          "--epochs", "2", "--workers", "0", "--out", str(out)]) == 0
    return out


def test_the_circuits_view_shows_and_an_edge_shows_its_removal_on_the_image(circuit_dir, monkeypatch):
    from dashboard.session import K_CIRCUIT_EDGE
    from vit_core.concepts.circuit import image_circuit, image_removal
    from vit_core.explain import model_input

    monkeypatch.setenv("VIT_LENS_CONCEPTS", str(circuit_dir / "layer-2"))
    ctx = shapes_context()
    at = run_view()
    at.selectbox(key=session.K_CONCEPTS).set_value("layer-2").run()
    assert_healthy(at)
    assert not at.error, [e.value for e in at.error]
    shown = " ".join(m.value for m in at.markdown)
    assert "Circuit across blocks 1, 2" in shown
    dictionaries = [load_concepts(circuit_dir / "layer-1"), load_concepts(circuit_dir / "layer-2")]
    seen = image_circuit(ctx.loaded, dictionaries, model_input(ctx.loaded, ctx.cap))
    options = at.selectbox(key=K_CIRCUIT_EDGE).options
    assert len(options) == 1 + len(seen.strongest[0]) * len(seen.strongest[1])
    strongest = np.unravel_index(np.argmax(np.abs(seen.attribution[0])), seen.attribution[0].shape)
    r, c = int(strongest[0]), int(strongest[1])
    u, v = int(seen.strongest[0][c]), int(seen.strongest[1][r])
    pictures = len(at.get("image"))
    at.selectbox(key=K_CIRCUIT_EDGE).set_value(at.selectbox(key=K_CIRCUIT_EDGE).options[1]).run()  # the largest first
    assert_healthy(at)
    plain, removed = image_removal(ctx.loaded, *dictionaries, model_input(ctx.loaded, ctx.cap), u, v)
    captions = " ".join(c.value for c in at.caption)
    fires = plain > 0
    change = 1 - removed[fires].sum() / plain[fires].sum()
    assert (f"feature #{v}'s activation over the patches where it fires goes from {plain[fires].sum():.3g} to "
            f"{removed[fires].sum():.3g} without #{u} (a removal effect of {change:.2f})") in captions, captions
    assert len(at.get("image")) == pictures + 2  # v's map as it is and without u


def test_a_damaged_circuit_is_said_in_one_sentence(circuit_dir, tmp_path, monkeypatch):
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(circuit_dir, copy, ignore=shutil.ignore_patterns("tokens"))
    circuit = json.loads((copy / "circuit.json").read_text())
    circuit["edges"][0]["to"]["layer"] = 1  # from block 1 to block 1
    (copy / "circuit.json").write_text(json.dumps(circuit))
    monkeypatch.setenv("VIT_LENS_CONCEPTS", str(copy / "layer-2"))
    at = run_view()
    at.selectbox(key=session.K_CONCEPTS).set_value("layer-2").run()
    assert_healthy(at)
    said = [e.value.replace("\\", "") for e in at.error]  # md() escapes the colons
    assert said == ["The circuit beside these concepts can't be shown: circuit.json is damaged: edge 0 is not one from a "
                    "feature of a listed block to one of the next, with its attribution and removal effect."]
