"""`dataset --lens`: a lens file from outside the checkout reduced over a folder, each array's mean and std over images
in dataset.npz, the same bits in one process and in two shards, its SHA-256 in the manifest."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from conftest import drawn_image
from vit_core import load_model, run_with_capture
from vit_core.__main__ import main
from vit_core.dataset.totals import ExactMoments, Totals

LENS_FILE = '''
import numpy as np
from vit_core.lenses import lens

@lens("qk", sites=["blocks.*.attn.q", "blocks.*.attn.k"])
def qk(cap):
    q, k = cap.site("blocks.*.attn.q"), cap.site("blocks.*.attn.k")  # (L, H, T, d_head)
    return {"q_norms": np.linalg.norm(q, axis=-1), "first_row": (q @ k.swapaxes(-1, -2))[:, :, 0]}

@lens("picky")
def picky(cap):
    if cap.logits.argmax() == 1:
        raise ValueError("not this class")
    return {"top": cap.logits.max()}
'''


@pytest.fixture(scope="module")
def folder_and_lens(tmp_path_factory):
    folder = tmp_path_factory.mktemp("images")
    for i in range(5):
        drawn_image(10 + i, size=(120, 150)).save(folder / f"img{i}.png")
    lens_file = tmp_path_factory.mktemp("researcher") / "lab.py"
    lens_file.write_text(LENS_FILE)
    return folder, lens_file


def run_dataset(folder, out, lens_file, *extra):
    return main(["dataset", str(folder), "--model", "vit-lens/shapes-vit", "--out", str(out), "--workers", "0",
                 "--batch-size", "2", "--lens", str(lens_file), *extra])


def test_dataset_reduces_every_lens_array_the_same_in_one_process_and_in_shards(folder_and_lens, tmp_path, capsys):
    folder, lens_file = folder_and_lens
    status = run_dataset(folder, tmp_path / "one", lens_file)
    said = capsys.readouterr()
    one = np.load(tmp_path / "one" / "dataset.npz")
    loaded = load_model("vit-lens/shapes-vit")
    caps = [run_with_capture(loaded, drawn_image(10 + i, size=(120, 150)), sites=["blocks.*.attn.q"]) for i in range(5)]
    picky_fails = [i for i, cap in enumerate(caps) if cap.logits.argmax() == 1]
    assert status == (2 if picky_fails else 0)
    assert said.err.count("lens 'picky' failed: ValueError: not this class") == len(picky_fails)

    norms = np.stack([np.linalg.norm(cap.site("blocks.*.attn.q"), axis=-1) for cap in caps])  # (5, L, H, T)
    np.testing.assert_allclose(one["qk.q_norms"], norms.astype(np.float64).mean(0), rtol=1e-6)
    np.testing.assert_allclose(one["qk.q_norms_std"], norms.astype(np.float64).std(0), rtol=1e-4, atol=1e-6)
    assert one["qk.first_row"].shape == (4, 8, 145) and one["qk.first_row"].dtype == np.float32
    if len(picky_fails) < 5:
        kept = [float(cap.logits.max()) for i, cap in enumerate(caps) if i not in picky_fails]
        assert float(one["picky.top"]) == pytest.approx(np.mean(kept), rel=1e-6)

    manifest = json.loads((tmp_path / "one" / "parts" / "manifest.json").read_text())
    sha = hashlib.sha256(lens_file.read_bytes()).hexdigest()
    assert manifest["lenses"] == [{"name": "qk", "source": str(lens_file), "sha256": sha},
                                  {"name": "picky", "source": str(lens_file), "sha256": sha}]

    run_dataset(folder, tmp_path / "two", lens_file, "--shards", "2")
    two = np.load(tmp_path / "two" / "dataset.npz")
    assert set(two.files) == set(one.files) and {"qk.q_norms", "qk.q_norms_std", "mean_attention_distance"} <= set(one.files)
    for key in one.files:
        np.testing.assert_array_equal(two[key], one[key], err_msg=key)  # same bits, whatever the shards


def test_a_rerun_with_another_lens_file_is_refused_naming_the_option(folder_and_lens, tmp_path, capsys):
    folder, lens_file = folder_and_lens
    run_dataset(folder, tmp_path / "out", lens_file, "--shard", "1/2")
    other = tmp_path / "other.py"
    other.write_text(LENS_FILE.replace('"top"', '"best"'))
    assert run_dataset(folder, tmp_path / "out", other, "--shard", "2/2") == 2
    assert "--lens" in capsys.readouterr().err


def test_lens_arrays_of_another_shape_on_some_image_get_no_mean_and_the_totals_travel_as_arrays():
    totals, other = Totals(), Totals()
    for target, shape in ((totals, (3,)), (totals, (3,)), (other, (4,))):
        moments = ExactMoments()
        moments.add(np.ones((1, *shape)))
        target.add_lensed("odd.v", moments)
        moments = ExactMoments()
        moments.add(np.full((1, 2), 0.1))
        target.add_lensed("even.v", moments)
    other.lens_failures.append(("img3.png", "lens 'odd' failed: ValueError: no"))
    totals.merge(other)
    assert set(totals.lensed) == {"even.v"} and totals.lens_varying == {"odd.v"}
    back = Totals.from_arrays(totals.arrays())
    assert back.lens_varying == {"odd.v"} and back.lens_failures == totals.lens_failures
    np.testing.assert_array_equal(back.lensed["even.v"].mean, totals.lensed["even.v"].mean)
    assert back.lensed["even.v"].count == 3
