"""`vit-lens export-web`: the static lesson's folder (vit_core.web.site), its refusals, and the lesson text it carries
(web/lesson.json: the Streamlit lesson's step titles and concept check, the same words)."""

from __future__ import annotations

import json
import os
import re

import pytest

from conftest import REPO
from vit_core.__main__ import main
from vit_core.web import site

pytest.importorskip("onnxruntime")
ORT_INSTALLED = (site.WEB_ROOT / "node_modules" / site.ORT_PACKAGE / "dist" / site.ORT_FILES[-1]).is_file()
if not ORT_INSTALLED and os.environ.get("CI"):
    raise RuntimeError("CI must run the static lesson's tests: tools/setup installs onnxruntime-web with npm, and it is missing")
needs_ort = pytest.mark.skipif(not ORT_INSTALLED, reason="onnxruntime-web is not installed (bash tools/setup)")
SITE_LIMIT = 30 * 2**20  # the budget for the Shapes ViT's site


def test_the_lesson_text_is_the_streamlit_lessons():
    from dashboard.lesson.quiz import CONCEPT_CHECK
    from dashboard.lesson.steps import STEPS

    lesson = json.loads((REPO / "web" / "lesson.json").read_text())
    assert lesson["steps"] == [step.title for step in STEPS]
    assert lesson["concept_check"] == [{"prompt": q.prompt, "options": list(q.options), "answer": q.answer, "why": q.why}
                                       for q in CONCEPT_CHECK]


def test_the_lesson_says_what_the_dashboard_says_of_an_image_outside_the_teaching_models_world():
    from dashboard import text
    from dashboard.views.header import UNSURE_BELOW
    from vit_core import TEACHING_MODEL

    outside = json.loads((REPO / "web" / "lesson.json").read_text())["outside"]
    assert outside == {"model": TEACHING_MODEL, "other_class": text.OTHER_CLASS, "unsure_below": UNSURE_BELOW,
                       "other": text.OUTSIDE_SHAPES_OTHER, "unsure": text.OUTSIDE_SHAPES_UNSURE}


def test_the_page_refers_to_no_other_origin():
    """Every file of the page: no absolute URL that a browser would fetch (the lesson works offline once loaded)."""
    sources = [REPO / "web" / "index.html", REPO / "web" / "style.css", *sorted((REPO / "web" / "src").glob("*.js"))]
    for path in sources:
        text = path.read_text().replace("http://www.w3.org/2000/svg", "")  # SVG's namespace: a name, never fetched
        assert not re.search(r"""(src|href|import|fetch|url)\s*[=(]?\s*["'`]?(https?:)?//""", text, re.I), path
        assert "http://" not in text and "https://" not in text, path


@pytest.fixture(scope="module")
def shapes_site(tmp_path_factory):
    if not ORT_INSTALLED:
        pytest.skip("onnxruntime-web is not installed (bash tools/setup)")
    out = tmp_path_factory.mktemp("site")
    assert main(["export-web", "--out", str(out)]) == 0
    return out


@needs_ort
def test_export_web_writes_the_site(shapes_site, capsys):
    files = {str(p.relative_to(shapes_site)) for p in shapes_site.rglob("*") if p.is_file()}
    assert {"index.html", "model.onnx", "model-logits.onnx", "model.weights", "model.json", "figures.json", "lesson.json",
            "style.css", "src/main.js",
            "ort/ort.wasm.min.mjs", "ort/ort-wasm-simd-threaded.wasm", f"ort/{site.ORT_LICENCE}"} <= files
    assert sum(p.stat().st_size for p in shapes_site.rglob("*") if p.is_file()) <= SITE_LIMIT
    info = json.loads((shapes_site / "model.json").read_text())
    assert info["name"] == "vit-lens/shapes-vit" and info["geometry"]["grid"] == [12, 12]
    assert len(info["examples"]) == 8 and all((shapes_site / e).is_file() for e in info["examples"])
    assert len(info["deletion"]["random_orders"]) == 8 and sorted(info["deletion"]["random_orders"][0]) == list(range(144))
    figures = json.loads((shapes_site / "figures.json").read_text())
    assert figures["pos_embed_similarity"]["shape"] == [144, 12, 12]
    assert figures["filters_pca"]["shape"] == [28, 8, 8, 3]


@needs_ort
def test_a_model_too_big_for_a_browser_is_refused_in_one_line(tmp_path, capsys):
    assert main(["export-web", "--model", "vit_base_patch16_224", "--random-init", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "330 MB, above the 100 MB" in err, err
    assert not (tmp_path / "index.html").exists()


# ----------------------------------------------------------------------------------------------
# Where it writes (issue 53: `--out ~` deleted ~/src, `--out web` the page's own sources; a full disk left no lesson)


def test_a_folder_export_web_did_not_write_is_refused_and_kept(tmp_path, capsys):
    from vit_core.web.target import target_refused

    mine = tmp_path / "home"
    (mine / "src").mkdir(parents=True)
    (mine / "src" / "thesis.tex").write_text("years of work")
    (mine / "index.html").write_text("my page")
    assert main(["export-web", "--out", str(mine)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "a folder that export-web did not write" in err[0], err
    assert (mine / "src" / "thesis.tex").read_text() == "years of work" and (mine / "index.html").read_text() == "my page"
    for inside in (site.WEB_ROOT, site.WEB_ROOT / "src", site.WEB_ROOT / "new"):
        assert "inside the checkout's web/" in target_refused(inside, site.WEB_ROOT)
        assert main(["export-web", "--out", str(inside)]) == 2
        assert "inside the checkout's web/" in capsys.readouterr().err
    assert not (site.WEB_ROOT / "new").exists()
    (tmp_path / "file").write_text("x")
    assert "a file" in target_refused(tmp_path / "file", site.WEB_ROOT)
    (tmp_path / "link").symlink_to(mine)
    assert "symbolic link" in target_refused(tmp_path / "link", site.WEB_ROOT)
    assert target_refused(tmp_path / "new", site.WEB_ROOT) is None
    (tmp_path / "empty").mkdir()
    assert target_refused(tmp_path / "empty", site.WEB_ROOT) is None


def digests(folder):
    import hashlib

    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*"))
            if p.is_file()}


@needs_ort
def test_a_re_export_replaces_a_previous_lesson_whole(shapes_site, tmp_path):
    import shutil

    from vit_core.web.target import MARKER

    assert (shapes_site / MARKER).is_file()
    lesson = tmp_path / "lesson"
    shutil.copytree(shapes_site, lesson)
    (lesson / "stale.js").write_text("from an older export")
    assert main(["export-web", "--out", str(lesson)]) == 0
    assert not (lesson / "stale.js").exists() and digests(lesson) == digests(shapes_site)  # same bits, nothing left over
    assert [p.name for p in tmp_path.iterdir()] == ["lesson"]  # no staging or old folder left beside it


@needs_ort
@pytest.mark.parametrize("fail_in", ["png", "check_graphs"])
def test_a_failure_mid_write_leaves_the_old_lesson_whole(shapes_site, tmp_path, monkeypatch, capsys, fail_in):
    """A disk that fills while the examples are written (after the graphs, the page and ONNX Runtime Web), or a graph
    that doesn't check: the old lesson is byte for byte as it was, and no half-written folder is left."""
    import errno
    import shutil

    lesson = tmp_path / "lesson"
    shutil.copytree(shapes_site, lesson)
    before = digests(lesson)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(site, fail_in, full)
    assert main(["export-web", "--out", str(lesson)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "No space left on device" in err[0], err
    assert digests(lesson) == before
    assert [p.name for p in tmp_path.iterdir()] == ["lesson"]
