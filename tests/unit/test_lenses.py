"""Lenses (vit_core.lenses): a researcher's lens file from outside the checkout in `analyze`, its failures said in one
line, and the built-in attention-logits lens against its definition (analyses.md, "Attention logits")."""

from __future__ import annotations

import hashlib
import json
import os
import textwrap
from pathlib import Path

import numpy as np
import pytest

from conftest import drawn_image
from vit_core import analyses, load_model, run_with_capture
from vit_core.__main__ import main
from vit_core.lenses import LensError, arrays_of, lenses_of, settings_key, sites_of
from vit_core.lenses.attention_logits import attention_scores, key_norm_fit, query_row

MODEL = ["--model", "vit-lens/shapes-vit"]  # bundled, offline, small

QK_LENS = '''
import numpy as np
from vit_core.lenses import lens

@lens("qk", sites=["blocks.*.attn.q", "blocks.*.attn.k"])
def qk(cap):
    q, k = cap.site("blocks.*.attn.q"), cap.site("blocks.*.attn.k")  # (L, H, T, d_head)
    return {"scores": q @ k.swapaxes(-1, -2), "q_norms": np.linalg.norm(q, axis=-1)}

@lens("broken")
def broken(cap):
    raise ValueError("no luck on this image")
'''


@pytest.fixture
def lens_file(tmp_path_factory):
    """The lens file, in a folder of its own outside the checkout."""
    path = tmp_path_factory.mktemp("researcher") / "my_lenses.py"
    path.write_text(QK_LENS)
    return path


def analyze(tmp_path, capsys, *args):
    drawn_image(3).save(tmp_path / "scene.png")
    drawn_image(4).save(tmp_path / "other.png")
    status = main(["analyze", str(tmp_path / "scene.png"), str(tmp_path / "other.png"), *MODEL, "--out",
                   str(tmp_path / "out"), *map(str, args)])
    return status, capsys.readouterr()


def test_analyze_writes_every_lens_array_and_says_the_failing_lens_per_image(tmp_path, capsys, lens_file):
    status, said = analyze(tmp_path, capsys, "--lens", lens_file)
    assert status == 2
    errors = said.err.strip().splitlines()
    assert len(errors) == 2 and all("lens 'broken' failed: ValueError: no luck on this image" in e for e in errors)
    assert "scene.png" in errors[0] and "other.png" in errors[1] and "Traceback" not in said.err

    arrays = np.load(tmp_path / "out" / "scene.npz")
    assert {"logits", "pattern", "rollout", "filters_pca"} <= set(arrays.files)  # today's keys stay
    assert {"qk.scores", "qk.q_norms"} == {k for k in arrays.files if "." in k}
    loaded = load_model("vit-lens/shapes-vit")
    cap = run_with_capture(loaded, drawn_image(3), sites=["blocks.*.attn.q", "blocks.*.attn.k"])
    q, k = cap.site("blocks.*.attn.q"), cap.site("blocks.*.attn.k")
    np.testing.assert_array_equal(arrays["qk.scores"], q @ k.swapaxes(-1, -2))
    np.testing.assert_array_equal(arrays["pattern"], cap.pattern)
    g = loaded.geometry
    assert arrays["qk.q_norms"].shape == (g.num_layers, g.num_heads, g.num_tokens)

    described = json.loads((tmp_path / "out" / "scene.json").read_text())
    sha = hashlib.sha256(lens_file.read_bytes()).hexdigest()
    assert [(e["name"], e["sha256"], e["source"]) for e in described["lenses"]] == [("qk", sha, str(lens_file)),
                                                                                     ("broken", sha, str(lens_file))]
    assert "failed" not in described["lenses"][0] and "no luck" in described["lenses"][1]["failed"]


def test_analyze_without_lens_keeps_todays_files(tmp_path, capsys):
    status, _ = analyze(tmp_path, capsys)
    assert status == 0
    assert not any("." in k for k in np.load(tmp_path / "out" / "scene.npz").files)
    assert "lenses" not in json.loads((tmp_path / "out" / "scene.json").read_text())


@pytest.mark.parametrize("text, says", [
    ("import no_such_package_here\n", "can't import it (ModuleNotFoundError: No module named 'no_such_package_here')"),
    ("def f(:\n", "can't import it (SyntaxError: "),
    ("x = 1\n", "it declares no lens"),
    ("from vit_core.lenses import lens\n@lens('bad', sites=['blocks.*.attn.scores'])\ndef f(cap):\n    return {}\n",
     "no site 'blocks.*.attn.scores'"),
])
def test_a_lens_file_that_cant_be_used_is_one_line_before_any_model_loads(tmp_path, capsys, monkeypatch, text, says):
    import vit_core.loading

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(vit_core.loading, "load_model", no_model)
    bad = tmp_path / f"bad_{abs(hash(text))}.py"
    bad.write_text(text)
    status, said = analyze(tmp_path, capsys, "--lens", bad)
    assert status == 2 and said.out == ""
    assert said.err.count("\n") == 1 and says in said.err and str(bad) in said.err and "Traceback" not in said.err
    assert not (tmp_path / "out").exists()


def test_a_missing_lens_file_or_module_is_said(tmp_path, capsys):
    for given, says in ((tmp_path / "nowhere.py", "no such file"), ("no_such_lens_module", "can't import it")):
        status, said = analyze(tmp_path, capsys, "--lens", given)
        assert status == 2 and f"--lens {given}: {says}" in said.err


def test_a_lens_returning_no_dict_of_numbers_is_refused_in_one_sentence(tiny, tmp_path):
    (tmp_path / "odd.py").write_text(textwrap.dedent('''
        from vit_core.lenses import lens
        @lens("odd")
        def odd(cap):
            return {"names": ["a", "b"]}
        @lens("listy")
        def listy(cap):
            return [1, 2]
    '''))
    odd, listy = lenses_of([str(tmp_path / "odd.py")])
    cap = run_with_capture(tiny, drawn_image(0))
    with pytest.raises(LensError, match=r"lens 'odd' failed: TypeError: 'names' is <U1, not numbers"):
        arrays_of(odd, cap)
    with pytest.raises(LensError, match=r"lens 'listy' failed: TypeError: it returned list, not a dict of arrays"):
        arrays_of(listy, cap)


def naive_fit(row, norms):
    """The least-squares line and R^2 by numpy's polyfit, one row at a time."""
    slope, intercept = np.polyfit(norms.astype(np.float64), row.astype(np.float64), 1)
    fitted = intercept + slope * norms
    r2 = 1 - ((row - fitted) ** 2).sum() / ((row - row.mean()) ** 2).sum()
    return fitted, r2


def test_attention_logits_are_the_pre_softmax_scores_and_their_key_norm_part(tiny):
    (built_in,) = lenses_of(["attention_logits"])
    assert sites_of([built_in]) == ["blocks.*.attn.q", "blocks.*.attn.k"]
    cap = run_with_capture(tiny, drawn_image(2), sites=built_in.sites)
    out = arrays_of(built_in, cap)
    scores, norms, r2 = out["attention_logits.scores"], out["attention_logits.key_norms"], out["attention_logits.key_norm_r2"]
    g, p = tiny.geometry, tiny.geometry.num_prefix_tokens
    assert scores.shape == (g.num_layers, g.num_heads, g.num_tokens, g.num_tokens) and scores.dtype == np.float32
    np.testing.assert_allclose(analyses.softmax(scores), cap.pattern, atol=1e-6)  # softmax of the logits: the pattern
    k = cap.site("blocks.*.attn.k")
    np.testing.assert_allclose(norms, np.sqrt((k.astype(np.float64) ** 2).sum(-1)), rtol=1e-6)
    for layer, head, query in ((0, 0, 0), (1, 2, 5), (1, 1, 100)):
        row, fitted, one_r2 = query_row(scores[layer, head], norms[layer, head], query, p, g.grid)
        want_fit, want_r2 = naive_fit(scores[layer, head, query, p:], norms[layer, head, p:])
        np.testing.assert_allclose(fitted.ravel(), want_fit, rtol=1e-4, atol=1e-5)
        assert one_r2 == pytest.approx(want_r2, abs=1e-5) and r2[layer, head, query] == pytest.approx(want_r2, abs=1e-5)
        np.testing.assert_array_equal(row.ravel(), scores[layer, head, query, p:])
    again = arrays_of(built_in, run_with_capture(tiny, drawn_image(2), sites=built_in.sites))
    for key in out:
        np.testing.assert_array_equal(again[key], out[key])  # same input, same bits


def test_key_norm_fit_known_values():
    norms = np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32)
    fitted, r2 = key_norm_fit(3 * norms - 1, norms)  # a row that is a line in the norms: all of it explained
    np.testing.assert_allclose(fitted, 3 * norms - 1, rtol=1e-6)
    assert r2 == pytest.approx(1.0)
    _, r2 = key_norm_fit(np.array([1.0, -1.0, -1.0, 1.0], dtype=np.float32), norms)  # orthogonal to the norms
    assert r2 == pytest.approx(0.0, abs=1e-7)
    _, r2 = key_norm_fit(np.full(4, 2.0, dtype=np.float32), norms)  # a constant row: nothing to explain
    assert r2 == 0.0
    q = np.eye(2, dtype=np.float32)[None]  # (1, 2, 2)
    np.testing.assert_allclose(attention_scores(q, q), np.eye(2)[None] / np.sqrt(2), rtol=1e-6)


def test_the_readmes_lens_file_runs_as_it_says(tmp_path, capsys):
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("## Your own lens", 1)[1].split("\n## ", 1)[0]
    example = section.split("```python\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "elsewhere" / "my_lenses.py"
    path.parent.mkdir()
    path.write_text(example)
    status, said = analyze(tmp_path, capsys, "--lens", path, "--lens", "attention_logits")
    assert status == 0, said.err
    arrays = np.load(tmp_path / "out" / "scene.npz")
    assert arrays["neuron.map"].shape == (12, 12) and arrays["qk.scores"].shape == (4, 8, 145, 145)
    np.testing.assert_allclose(arrays["qk.scores"], arrays["attention_logits.scores"], rtol=1e-5, atol=1e-5)
    assert analyses.softmax(arrays["qk.scores"]) == pytest.approx(arrays["pattern"], abs=1e-5)  # numpy and torch round apart


def test_the_dashboards_lens_option_sets_the_setting_and_a_bad_file_stops_the_start(tmp_path, monkeypatch, lens_file):
    from dashboard.server.launch import lenses_checked

    monkeypatch.setenv("VIT_LENS_LENSES", "")  # recorded, so the value lenses_checked sets is undone after the test
    rest = lenses_checked(["--server.port", "8599", "--lens", str(lens_file), "--lens", "attention_logits"])
    assert rest == ["--server.port", "8599"]
    assert os.environ["VIT_LENS_LENSES"] == os.pathsep.join([str(lens_file), "attention_logits"])
    bad = tmp_path / "half.py"
    bad.write_text("from vit_core.lenses import lens\n@lens('a b')\ndef f(cap):\n    return {}\n")
    with pytest.raises(SystemExit, match=r"^vit-lens dashboard: lens name 'a b': use letters, digits, _ and -"):
        lenses_checked(["--lens", str(bad)])


SETTINGS_LENS = '''
import numpy as np
from vit_core.lenses import lens

@lens("block_map", settings={"block": -1, "fusion": "mean"})
def block_map(cap, block, fusion):
    fuse = {"mean": np.mean, "max": np.max}[fusion]
    return {"map": fuse(cap.pattern[block], axis=0)}  # (T, T)
'''


def test_a_lens_declares_settings_its_defaults_run_and_a_key_a_cache_can_use(tmp_path, tiny):
    path = tmp_path / "settings_lens.py"
    path.write_text(SETTINGS_LENS)
    (one,) = lenses_of([str(path)])
    assert one.settings == (("block", -1), ("fusion", "mean")) and one.defaults == {"block": -1, "fusion": "mean"}
    assert settings_key(one) == (("block", -1), ("fusion", "mean"))
    assert settings_key(one, {"fusion": "max"}) == (("block", -1), ("fusion", "max"))  # declared order, hashable
    hash(settings_key(one, {"fusion": "max"}))
    cap = run_with_capture(tiny, drawn_image(2))
    np.testing.assert_array_equal(arrays_of(one, cap)["block_map.map"], cap.pattern[-1].mean(0))
    np.testing.assert_array_equal(arrays_of(one, cap, {"block": 0, "fusion": "max"})["block_map.map"], cap.pattern[0].max(0))
    with pytest.raises(LensError, match=r"^lens 'block_map' has no setting 'head' \(its settings: block, fusion\)\.$"):
        arrays_of(one, cap, {"head": 2})
    (plain,) = lenses_of(["attention_logits"])  # declared without settings: called as compute(cap), as before
    assert plain.settings == () and settings_key(plain) == ()


@pytest.mark.parametrize("settings, said", [
    ({"a b": 1}, r"setting 'a b' is not a Python name"),
    ({"layers": [1, 2]}, r"setting 'layers' defaults to a list; use None, a bool, an int, a float or a str\."),
])
def test_a_setting_that_cant_key_a_cache_is_refused_where_it_is_declared(settings, said):
    from vit_core.lenses import lens

    with pytest.raises(LensError, match=r"^lens 'x': " + said):
        lens("x", settings=settings)
