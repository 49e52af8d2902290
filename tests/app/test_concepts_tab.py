"""The Concepts tab on the Shapes ViT: concepts learned by `vit-lens concepts` from a small drawn folder, given by
path; the image's strongest features (maps and top patches), its reconstruction error (checked against
vit_core.concepts), and "remove this concept" with the prediction before and after. A file of another model, or no
file, is said in one line and the tab keeps working."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

import vit_core
from conftest import assert_healthy, encoded
from dashboard import session
from dashboard.image_choice import ImageChoice
from dashboard.models import ModelRequest
from dashboard.views import VIEWS
from dashboard.views.context import ViewContext
from support.dataset_folder import shapes_concepts
from vit_core.concepts import image_concepts, load_concepts, logits_with_concept_removed
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
    at = AppTest.from_function(view_script, default_timeout=120)
    at.run()
    assert_healthy(at)
    return at


def test_the_tab_is_among_the_research_tools():
    assert list(VIEWS)[-1] == "Concepts"


def test_without_concepts_the_tab_says_how_to_make_them():
    at = run_view()
    assert any("vit-lens concepts FOLDER" in m.value for m in at.markdown)


def test_the_tab_shows_the_images_features_and_removes_one(concepts_dir):
    ctx = shapes_context()
    at = run_view()
    at.text_input(key=session.K_CONCEPTS).set_value(str(concepts_dir)).run()
    assert_healthy(at)
    assert not at.error, [e.value for e in at.error]
    found = load_concepts(concepts_dir)
    seen = image_concepts(found, ctx.cap)
    assert at.metric[0].value == f"{seen.error:.3f}"
    assert len(at.get("image")) >= 2 * len(seen.strongest)  # each feature's map and its top patches
    captions = " ".join(c.value for c in at.caption)
    assert all(f"#{f}" in captions for f in seen.strongest.tolist())
    feature = int(seen.strongest[0])
    at.selectbox(key=session.K_CONCEPT_REMOVED).set_value(feature).run()
    assert_healthy(at)
    after = vit_core.analyses.top_k(logits_with_concept_removed(ctx.loaded, ctx.cap, found, feature), ctx.loaded.labels, 5)
    shown = " ".join(m.value for m in at.markdown)
    assert f"After removing feature #{feature}" in shown and f"1. {after[0].label} ({after[0].prob:.1%})" in shown


def test_concepts_of_another_model_or_no_file_are_said_in_one_line(concepts_dir, tmp_path):
    at = run_view()
    at.text_input(key=session.K_CONCEPTS).set_value(str(tmp_path / "nothing")).run()
    assert_healthy(at)
    assert len(at.error) == 1 and "nothing" in at.error[0].value
    other = load_concepts(concepts_dir)
    from vit_core.concepts import Concepts, concepts_bytes

    renamed = Concepts(other.sae, other.normalisation, "vit_tiny_patch16_224", "", other.layer)
    (tmp_path / "concepts.safetensors").write_bytes(concepts_bytes(renamed))
    at.text_input(key=session.K_CONCEPTS).set_value(str(tmp_path)).run()
    assert_healthy(at)
    assert "vit_tiny_patch16_224" in at.warning[0].value


def test_concepts_learned_elsewhere_still_show_their_maps(concepts_dir, tmp_path):
    """A concepts folder copied from another machine: its FOLDER is not here, so the crops can't be shown (said in
    a caption); the maps and the removal still work."""
    import json
    import shutil

    moved = tmp_path / "moved"
    moved.mkdir()
    shutil.copy(concepts_dir / "concepts.safetensors", moved)
    summary = json.loads((concepts_dir / "concepts.json").read_text())
    (moved / "concepts.json").write_text(json.dumps({**summary, "folder": "/nowhere/shapes"}))
    at = run_view()
    at.text_input(key=session.K_CONCEPTS).set_value(str(moved)).run()
    assert_healthy(at)
    assert not at.error
    assert any("/nowhere/shapes" in c.value and "not on this server" in c.value for c in at.caption)
