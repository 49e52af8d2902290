"""The Many images page's Concepts section on the Shapes ViT: concepts learned by `vit-lens concepts` from a few drawn
images (a small autoencoder), offered by the server by name; Find over a drawn Shapes set shows the set's strongest features (its
error checked against vit_core.concepts), and removing one shows the share of top-1s unchanged over the set."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import assert_healthy, run_app
from dashboard import image_sets, session
from dashboard.models import build_named_model
from support.dataset_folder import shapes_concepts
from vit_core import TEACHING_MODEL
from vit_core.concepts import load_concepts, removal_agreement, set_concepts, set_logits_with_concept_removed, set_tokens
from vit_core.concepts.folders import BUNDLED_NAME
from vit_core.loading import teaching_model_available

PAGE = "page_scripts/many_images.py"  # relative to dashboard/app.py
COUNT = 4

pytestmark = pytest.mark.skipif(not teaching_model_available(), reason="the bundled Shapes ViT's weights are not here")


@pytest.fixture(scope="module")
def concepts_dir(tmp_path_factory) -> Path:
    return shapes_concepts(tmp_path_factory.mktemp("shapes"), tmp_path_factory.mktemp("concepts"), 9, 4, 32, 4, 1)


def test_the_section_finds_a_shapes_sets_concepts_and_removes_one(concepts_dir, monkeypatch):
    monkeypatch.setenv("VIT_LENS_MODEL", TEACHING_MODEL)
    monkeypatch.setenv("VIT_LENS_CONCEPTS", str(concepts_dir))  # a teacher's folder, offered by name
    at = run_app()
    at.switch_page(PAGE).run()
    assert_healthy(at)
    assert at.selectbox(key=session.K_MANY_CONCEPTS).value == BUNDLED_NAME  # the Shapes ViT's own, out of the box
    at.number_input(key=session.K_MANY_COUNT).set_value(COUNT).run()
    at.selectbox(key=session.K_MANY_CONCEPTS).set_value(concepts_dir.name).run()
    assert_healthy(at)
    at.button(key=session.K_MANY_CONCEPTS_FIND).click().run()
    assert_healthy(at)
    assert not at.error, [e.value for e in at.error]

    loaded = build_named_model(TEACHING_MODEL, False)
    found = load_concepts(concepts_dir)
    pictures, _ = image_sets.set_pictures(loaded, image_sets.shapes_set(loaded, COUNT, 0))
    seen = set_concepts(found, set_tokens(loaded, pictures, found.layer))
    metric = next(m for m in at.metric if m.label.startswith("The set's reconstruction error"))
    assert metric.value == f"{seen.error:.3f}"
    shown = " ".join(m.value for m in at.markdown)
    assert all(f"Feature **#{f}**" in shown for f in seen.strongest.tolist())
    assert len(at.get("image")) >= 2 * len(seen.strongest)  # the set's crops and the folder's, per feature

    feature = int(seen.strongest[0])
    at.selectbox(key=session.K_MANY_CONCEPT_REMOVED).set_value(feature).run()
    at.button(key=session.K_MANY_CONCEPT_REMOVE).click().run()
    assert_healthy(at)
    agreement, kl = removal_agreement(*set_logits_with_concept_removed(loaded, pictures, found, feature))
    unchanged = next(m for m in at.metric if m.label.startswith(f"Top-1 unchanged without feature #{feature}"))
    assert unchanged.value == f"{agreement:.0%}"
    assert next(m for m in at.metric if m.label.startswith("Mean KL")).value == f"{kl:.3g} nats"
    # A second feature: the plain logits the first removal kept serve again, the result is the library's.
    second = int(seen.strongest[1])
    at.selectbox(key=session.K_MANY_CONCEPT_REMOVED).set_value(second).run()
    at.button(key=session.K_MANY_CONCEPT_REMOVE).click().run()
    assert_healthy(at)
    agreement, kl = removal_agreement(*set_logits_with_concept_removed(loaded, pictures, found, second))
    assert next(m for m in at.metric if m.label.startswith("Mean KL")).value == f"{kl:.3g} nats"
    assert set(session_concepts(at).removed) == {feature, second}


def session_concepts(at):
    """The set's concepts the page keeps in the session (session.keep_many_concepts's)."""
    return at.session_state[session._MANY_CONCEPTS]
