"""The Lenses tab: the built-in attention logits, and a researcher's lens file from outside the checkout given to the
server ($VIT_LENS_LENSES, as `vit-lens dashboard --lens` sets it), each lens picked by name, each array drawn by its
shape and downloadable."""

from __future__ import annotations

import pytest

from conftest import run_app

LENS_FILE = '''
import numpy as np
from vit_core.lenses import lens

@lens("shapes", sites=["blocks.*.attn.q", "blocks.*.attn.k", "blocks.0.mlp.hidden"])
def shapes(cap):
    g = cap.geometry
    p = g.num_prefix_tokens
    q, k = cap.site("blocks.*.attn.q"), cap.site("blocks.*.attn.k")  # (L, H, T, d_head)
    hidden = cap.site("blocks.0.mlp.hidden")  # (T, D_mlp)
    return {
        "neuron": hidden[p:, 3].reshape(g.grid),               # (gh, gw): a map over the crop
        "patch_norms": np.linalg.norm(cap.site("embed"), axis=-1),  # (N,): a map too
        "q_mean_norm": np.linalg.norm(q, axis=-1).mean(-1),    # (L, H): a heatmap
        "scores": q @ k.swapaxes(-1, -2),                      # (L, H, T, T): layer, head, query controls
        "logits": cap.site("logits"),                          # (C,): bars
        "odd": np.zeros((3, 5)),                               # a table
    }

@lens("broken")
def broken(cap):
    raise ValueError("nothing to see")
'''


def downloads(at) -> list[str]:
    return [b.proto.label for b in at.get("download_button") if b.proto.label.endswith(".npy")]  # the sidebar has others


def test_the_attention_logits_tab_shows_a_querys_row_and_its_key_norm_part(tiny_env):
    at = run_app(view="Lenses")
    assert not at.error, [e.value for e in at.error]
    assert len(at.get("image")) >= 2
    captions = " ".join(c.value for c in at.caption)
    assert "the built-in lens `attention_logits`" in captions and "R² =" in captions
    pictures = [url for im in at.get("image") for url in im.value]
    at.slider(key="lens_attention_logits.scores_query").set_value(5).run()
    assert not at.exception and any("query 5: the key norms alone explain R² =" in c.value for c in at.caption)
    assert [url for im in at.get("image") for url in im.value] != pictures
    labels = downloads(at)
    assert {"attention_logits.scores.npy", "attention_logits.key_norms.npy", "attention_logits.key_norm_r2.npy"} <= set(labels)


@pytest.fixture
def lens_server(tiny_env, tmp_path_factory, monkeypatch):
    path = tmp_path_factory.mktemp("researcher") / "lab_lenses.py"
    path.write_text(LENS_FILE)
    monkeypatch.setenv("VIT_LENS_LENSES", str(path))
    return path


def pick(at, name: str):
    at.pills(key="lens_choice").set_value(name).run()
    return at


def test_a_lens_file_gives_each_lens_of_it_a_choice_each_array_drawn_by_its_shape(lens_server):
    at = run_app(view="Lenses")
    assert at.pills(key="lens_choice").options == ["attention_logits", "shapes", "broken"]
    pick(at, "shapes")
    assert not at.error, [e.value for e in at.error]
    assert downloads(at) == [f"shapes.{key}.npy" for key in ("neuron", "patch_norms", "q_mean_norm", "scores", "logits", "odd")]
    assert len(at.get("image")) >= 5  # 2 per map, the heatmap, the query's row
    assert at.get("arrow_vega_lite_chart") or at.get("vega_lite_chart")  # the bars of (C,)
    assert at.dataframe  # the table of the (3, 5) array
    assert {"lens_shapes.scores_layer", "lens_shapes.scores_head", "lens_shapes.scores_query"} <= {s.key for s in at.slider}


def test_a_lens_that_raises_says_so_in_its_tab(lens_server):
    at = pick(run_app(view="Lenses"), "broken")
    assert [e.value for e in at.error] == ["lens 'broken' failed: ValueError: nothing to see"]


def test_a_lens_file_that_cant_be_imported_is_one_sentence_in_a_tab(tiny_env, tmp_path, monkeypatch):
    bad = tmp_path / "bad_lens.py"
    bad.write_text("raise RuntimeError('half written')\n")
    monkeypatch.setenv("VIT_LENS_LENSES", str(bad))
    at = run_app(view="Lenses")
    assert [e.value for e in at.error] == [f"--lens {bad}: can't import it (RuntimeError: half written)."]


SETTINGS_FILE = '''
import numpy as np
from vit_core.lenses import lens

@lens("block_norms", settings={"block": -1, "squared": False, "scale": 1.0, "note": "x", "limit": None})
def block_norms(cap, block, squared, scale, note, limit):
    g = cap.geometry
    norms = np.linalg.norm(cap.tokens[block][g.num_prefix_tokens:], axis=-1) * scale  # (N,)
    return {"norms": (norms ** 2 if squared else norms).reshape(g.grid)}  # (gh, gw)
'''


def test_a_lenss_settings_get_a_control_each_and_each_value_its_own_result(tiny_env, tmp_path, monkeypatch):
    path = tmp_path / "settings_lens.py"
    path.write_text(SETTINGS_FILE)
    monkeypatch.setenv("VIT_LENS_LENSES", str(path))
    at = pick(run_app(view="Lenses"), "block_norms")
    assert not at.error, [e.value for e in at.error]
    keys = {w.key for kind in ("number_input", "toggle", "text_input") for w in at.get(kind)}
    assert {f"lens_block_norms_setting_{name}" for name in ("block", "squared", "scale", "note", "limit")} <= keys
    last = [url for im in at.get("image") for url in im.value]
    at.number_input(key="lens_block_norms_setting_block").set_value(0).run()
    first = [url for im in at.get("image") for url in im.value]
    assert not at.error and first != last  # block 0's norms, not the last block's
    at.toggle(key="lens_block_norms_setting_squared").set_value(True).run()
    assert not at.error and [url for im in at.get("image") for url in im.value] != first
    at.number_input(key="lens_block_norms_setting_block").set_value(99).run()  # the tiny model has 2 blocks
    assert [e.value for e in at.error] == ["lens 'block_norms' failed: IndexError: index 99 is out of bounds for axis 0 "
                                           "with size 3"]
