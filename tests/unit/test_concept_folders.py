"""Opening a concepts folder (vit_core.concepts.folders): the offered list (the bundled concepts, the teacher's
folders by name), typed paths, and every damaged or hostile file refused in one sentence before it costs memory or
blocks: FIFOs, oversized files, F beyond the machine's bound, NaN weights, norm_scale 0, a layer out of range,
concepts.json of wrong types, nesting or rows; top-patch files outside the folder never read."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save

from unit.test_concepts import random_concepts
from vit_core.concepts import ConceptsError, concepts_bytes, load_concepts
from vit_core.concepts.folders import (
    BUNDLED_DIR,
    BUNDLED_NAME,
    FEATURE_COPIES,
    MAX_FEATURES_PER_WIDTH,
    check_for_model,
    image_path,
    max_features,
    offered_folders,
    open_folder,
    read_regular,
    typed_folder,
)
from vit_core.concepts.sae import concepts_tensors
from vit_core.teaching.model import TEACHING_MODEL


def write_concepts(folder: Path, concepts=None, summary: object | None = None, **changes) -> Path:
    """A concepts folder from `concepts` (random by default), its tensors or metadata changed by `changes`."""
    folder.mkdir(parents=True, exist_ok=True)
    tensors, metadata = concepts_tensors(concepts or random_concepts())
    for key, value in changes.items():
        if key in tensors:
            tensors[key] = value
        else:
            metadata[key] = value
    (folder / "concepts.safetensors").write_bytes(save(tensors, metadata=metadata))
    if summary is not None:
        (folder / "concepts.json").write_text(summary if isinstance(summary, str) else json.dumps(summary))
    return folder


def refusal(folder: Path, memory: int | None = None) -> str:
    with pytest.raises(ConceptsError) as caught:
        open_folder(folder, memory)
    message = str(caught.value)
    assert "\n" not in message and "Traceback" not in message
    return message


def test_the_bundled_concepts_ship_with_the_package_and_fit_the_shapes_vit():
    import vit_core

    opened = open_folder(BUNDLED_DIR)
    loaded = vit_core.load_model(TEACHING_MODEL, device="cpu")
    assert opened.concepts.model == TEACHING_MODEL and opened.concepts.sae.d_model == loaded.geometry.embed_dim
    check_for_model(opened, loaded.geometry.num_layers, loaded.geometry.grid)
    files = {t["file"] for f in opened.summary["features"] for t in f["top"]}
    assert files and all((opened.images / name).is_file() for name in files)  # every top patch's drawing ships
    assert opened.images.resolve().is_relative_to(BUNDLED_DIR)
    size = sum(p.stat().st_size for p in BUNDLED_DIR.rglob("*") if p.is_file())
    assert size < 5 * 2**20  # a few MB at most


def test_the_offered_folders_are_the_bundled_ones_and_the_teachers_by_name(tmp_path):
    a, b = write_concepts(tmp_path / "birds"), write_concepts(tmp_path / "x" / "cars")
    offered = offered_folders(os.pathsep.join([str(a), "", str(b)]))
    assert list(offered) == [BUNDLED_NAME, "birds", "cars"]
    assert offered["cars"] == b.resolve()
    for setting, said in ((str(tmp_path / "nothing"), "no concepts.safetensors"),
                          (os.pathsep.join([str(a), str(write_concepts(tmp_path / "y" / "birds"))]), "two concept")):
        with pytest.raises(ConceptsError, match=said):
            offered_folders(setting)


def test_a_typed_path_is_resolved_against_the_servers_folder_and_long_or_nul_paths_are_refused(tmp_path):
    assert typed_folder("concepts", tmp_path) == tmp_path / "concepts"
    assert typed_folder("concepts/concepts.safetensors", tmp_path) == tmp_path / "concepts"
    assert typed_folder("/abs/dir", tmp_path) == Path("/abs/dir")
    assert typed_folder("~", tmp_path) == Path.home()
    for text in ("x" * 5000, "a\0b"):
        with pytest.raises(ConceptsError, match="not a path"):
            typed_folder(text, tmp_path)


def test_a_fifo_is_refused_at_once_not_waited_on(tmp_path):
    folder = tmp_path / "fifo"
    folder.mkdir()
    os.mkfifo(folder / "concepts.safetensors")
    result: list[str] = []
    reader = threading.Thread(target=lambda: result.append(refusal(folder)), daemon=True)
    reader.start()
    reader.join(timeout=60)  # a blocking open would wait for a writer forever
    assert result == ["concepts.safetensors is not a regular file."]
    os.mkfifo(folder / "concepts.json")
    write_concepts(folder.with_name("ok"))
    (folder / "concepts.safetensors").unlink()
    (folder / "concepts.safetensors").write_bytes((folder.with_name("ok") / "concepts.safetensors").read_bytes())
    assert refusal(folder) == "concepts.json is not a regular file."
    with pytest.raises(ConceptsError, match="not a regular file"):
        read_regular(Path("/dev/zero"), 100)
    (tmp_path / "dir" / "concepts.safetensors").mkdir(parents=True)
    assert refusal(tmp_path / "dir") == "concepts.safetensors is not a regular file."
    assert refusal(tmp_path / "gone") == "concepts.safetensors: no such file or directory."


def test_the_feature_bound_comes_from_the_width_and_the_machine(tmp_path):
    assert max_features(256, memory=2**40) == MAX_FEATURES_PER_WIDTH * 256
    memory = 2**30
    bound = max_features(768, memory)
    assert bound == memory // (FEATURE_COPIES * 4 * 768) and bound * FEATURE_COPIES * 4 * 768 <= memory
    folder = write_concepts(tmp_path / "big", random_concepts(d_model=16, num_features=40))
    assert "declares 40 features" in refusal(folder, memory=20 * FEATURE_COPIES * 4 * 16)  # the bound is 20
    open_folder(folder, memory=40 * FEATURE_COPIES * 4 * 16)


def test_a_header_that_declares_more_than_the_file_holds_is_refused_before_reading(tmp_path):
    folder = write_concepts(tmp_path / "padded")
    with open(folder / "concepts.safetensors", "ab") as f:
        f.write(b"\0" * 2**21)  # bytes beyond what its 40 features need
    assert "more than the" in refusal(folder)
    (folder / "concepts.safetensors").write_bytes(b"\xff" * 8 + b"{}")
    assert "not a concepts file" in refusal(folder)


@pytest.mark.parametrize("change, said", [
    ({"W_dec": torch.full((16, 40), float("nan"))}, "not finite"),
    ({"norm_mean": torch.full((16,), float("inf"))}, "not finite"),
    ({"norm_scale": torch.tensor(0.0, dtype=torch.float64)}, "norm_scale is 0"),
    ({"norm_scale": torch.tensor(-2.0, dtype=torch.float64)}, "norm_scale is -2"),
    ({"layer": "-1"}, "out of range"),
    ({"k": "41"}, "out of range"),
    ({"layer": "x"}, "damaged"),
    ({"b_enc": torch.zeros(3)}, "b_enc"),
    ({"format": "other"}, "not a ViT Lens concepts file"),
])
def test_damaged_weights_are_refused_in_one_sentence(tmp_path, change, said):
    assert said in refusal(write_concepts(tmp_path / "bad", **change))


def test_a_layer_beyond_the_models_blocks_is_refused(tmp_path):
    opened = open_folder(write_concepts(tmp_path / "deep", layer="99"))
    with pytest.raises(ConceptsError, match="block 99; this model has blocks 0..3"):
        check_for_model(opened, 4, (12, 12))


GOOD_TOP = {"file": "a.png", "row": 1, "col": 2, "activation": 0.5}


@pytest.mark.parametrize("summary, said", [
    ("[1, 2]", "not a JSON object"),
    ({"fvu": "0.1"}, "fvu"),
    ({"fvu": float("nan")}, "fvu"),
    ({"spliced_top1_agreement": 3}, "spliced_top1_agreement"),
    ({"folder": 7}, "folder"),
    ({"features": {"0": {}}}, "features"),
    ({"features": [{"index": 0, "top": []}] * 41}, "at most 40"),
    ({"features": [{"index": 5, "top": []}]}, "feature 0"),
    ({"features": [{"index": 0, "firing_rate": float("nan"), "top": []}]}, "feature 0"),
    ({"features": [{"index": 0, "top": [{**GOOD_TOP, "file": 3}]}]}, "top patch of feature 0"),
    ({"features": [{"index": 0, "top": [{**GOOD_TOP, "row": -1}]}]}, "top patch of feature 0"),
    ({"features": [{"index": 0, "top": [{**GOOD_TOP, "activation": "big"}]}]}, "top patch of feature 0"),
    ("[" * 100_000 + "]" * 100_000, "levels deep"),
    ("{not json", "not JSON"),
])
def test_damaged_summaries_are_refused_in_one_sentence(tmp_path, summary, said):
    assert said in refusal(write_concepts(tmp_path / "bad", summary=summary))


def test_rows_out_of_the_models_grid_are_refused_when_checked_against_the_model(tmp_path):
    opened = open_folder(write_concepts(tmp_path / "rows", summary={"features": [{"index": 0, "top": [
        {**GOOD_TOP, "row": 12}]}]}))
    check_for_model(opened, 4, (13, 13))
    with pytest.raises(ConceptsError, match="grid"):
        check_for_model(opened, 4, (12, 12))


def test_a_summary_larger_than_its_features_need_is_refused_unread(tmp_path):
    folder = write_concepts(tmp_path / "huge", summary={"features": []})
    (folder / "concepts.json").write_text(" " * (2**20 + 40 * 8 * 2**10 + 1) + "{}")
    assert "more than the" in refusal(folder)


def test_top_patch_files_resolve_inside_the_image_folder_only(tmp_path):
    images = tmp_path / "images"
    assert image_path(images, "a/b.png") == images / "a/b.png"
    for name in ("/etc/passwd", "../x.png", "a/../../x.png", "", "a\0b", "x" * 5000):
        assert image_path(images, name) is None
    assert image_path(None, "a.png") is None


def test_relative_image_folders_are_under_the_concepts_folder_and_outside_files_are_never_read(tmp_path):
    from PIL import Image

    import vit_core
    from vit_core.concepts import top_crops

    folder = tmp_path / "c"
    (folder / "images").mkdir(parents=True)
    Image.new("RGB", (96, 96), (200, 10, 10)).save(folder / "images" / "in.png")
    Image.new("RGB", (96, 96), (10, 200, 10)).save(tmp_path / "secret.png")
    tops = [{**GOOD_TOP, "file": "../secret.png"}, {**GOOD_TOP, "file": str(tmp_path / "secret.png")},
            {**GOOD_TOP, "file": "in.png"}]
    opened = open_folder(write_concepts(folder, summary={"folder": "images", "features": [{"index": 0, "top": tops}]}))
    assert opened.images == folder / "images"
    loaded = vit_core.load_model(TEACHING_MODEL, device="cpu")
    crops = top_crops(loaded, opened.images, tops, 8)
    assert len(crops) == 1 and tuple(crops[0][0][32, 32]) == (200, 10, 10)  # only the image inside the folder


def test_load_concepts_is_the_checked_reader(tmp_path):
    folder = write_concepts(tmp_path / "nan", W_enc=torch.full((40, 16), float("nan")))
    with pytest.raises(ConceptsError, match="not finite"):
        load_concepts(folder)
    (tmp_path / "ok").mkdir()
    (tmp_path / "ok" / "concepts.safetensors").write_bytes(concepts_bytes(random_concepts()))
    assert load_concepts(tmp_path / "ok").sae.num_features == 40
    assert np.isfinite(load_concepts(tmp_path / "ok").normalisation.scale)


def test_the_dashboards_concepts_option_joins_the_setting_and_a_bad_folder_stops_the_server(tmp_path, monkeypatch):
    from dashboard import serve
    from dashboard.server.launch import prepare_launch, split_concepts_option

    assert split_concepts_option(["--concepts", "a", "--server.port", "1", "--concepts=b"]) == (
        ["a", "b"], ["--server.port", "1"])
    with pytest.raises(SystemExit, match="needs a folder"):
        split_concepts_option(["--concepts", "--server.port", "1"])
    good = write_concepts(tmp_path / "good")
    monkeypatch.setenv("VIT_LENS_CONCEPTS", str(good))
    monkeypatch.chdir(tmp_path)
    _, rest = prepare_launch(["--concepts", "other", "--server.port", "1"], whole_process=False)
    assert rest == ["--server.port", "1"]
    assert os.environ["VIT_LENS_CONCEPTS"] == os.pathsep.join([str(good), str(tmp_path / "other")])
    with pytest.raises(SystemExit, match=r"^vit-lens dashboard: --concepts or VIT_LENS_CONCEPTS: \S*other: not a folder"):
        serve.offered_concepts()
    monkeypatch.setenv("VIT_LENS_CONCEPTS", str(good))
    assert serve.offered_concepts() == [BUNDLED_NAME, "good"]
