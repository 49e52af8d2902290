"""The "Many images" page (dashboard/page_scripts/many_images.py), run in-process with Streamlit's AppTest, and its set
building (uploads, zips and their bounds, Shapes batches) on its own.

The app runs the tiny random-init test model (`tiny_env`); the bundled Shapes ViT where a test needs
the Shapes' classes. The downloads are read through one shared runtime (tests/support/shared_runtime.py) and
compared with `vit_core.dataset.analyze_dataset` run here on the same images.
"""

from __future__ import annotations

import io
import json
import re
import zipfile

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from conftest import assert_healthy, drawn_image, encoded, run_app
from dashboard import image_sets, session
from dashboard.image_sets import SetError, shapes_set, uploaded_set, zip_members
from dashboard.models import ModelRequest, build_named_model
from support.shared_runtime import download, shared_runtime
from tools.hostile import archives as hostile
from vit_core import TEACHING_MODEL, dataset, load_image
from vit_core.loading import teaching_model_available
from vit_core.teaching import data as shapes

PAGE = "page_scripts/many_images.py"  # relative to dashboard/app.py


@pytest.fixture(scope="module")
def runtime():
    """One media-file manager for every AppTest of this module: a download button's bytes can be read."""
    with shared_runtime() as shared:
        yield shared


@pytest.fixture(scope="module")
def tiny_model():
    """The test-tiny model as the app builds it (random init, seed 0: the same weights)."""
    return build_named_model("test-tiny", False)


def png(seed: int, size: tuple[int, int] = (60, 80)) -> bytes:
    return encoded(drawn_image(seed, size))


def zipped(members: dict[str, bytes], compression: int = zipfile.ZIP_DEFLATED) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def one_sentence(text: str) -> bool:
    """A single sentence: ends with a full stop, and no '. ' (the end of another sentence) inside."""
    return text.endswith(".") and ". " not in text.rstrip(".")


def as_written(markdown: str) -> str:
    """A message as the user reads it: without markdown_literal's backslash escapes."""
    return re.sub(r"\\(.)", r"\1", markdown)


def open_page(runtime) -> AppTest:
    at = run_app()
    at.switch_page(PAGE).run()
    assert_healthy(at)
    assert at.button(key=session.K_MANY_RUN)
    return at


def session_run(at: AppTest):
    """The run the page keeps in the session (session.keep_many_run's)."""
    return at.session_state[session._MANY_LATEST_RUN]


def run_clicked(at: AppTest) -> AppTest:
    at.button(key=session.K_MANY_RUN).click().run()
    assert_healthy(at)
    return at


def upload(at: AppTest, *files: tuple[str, bytes]) -> AppTest:
    at.radio(key=session.K_MANY_SOURCE).set_value(image_sets.UPLOADS).run()
    at.file_uploader(key=session.K_MANY_FILES).set_value([(name, data, "application/octet-stream") for name, data in files])
    at.run()
    assert_healthy(at)
    return at


def downloaded_npz(at: AppTest, runtime) -> dict[str, np.ndarray]:
    return dict(np.load(io.BytesIO(download(runtime, at, "dataset.npz"))))


def assert_same_arrays(got: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    assert set(got) == set(expected)
    for key, value in expected.items():
        assert got[key].dtype == value.dtype and got[key].shape == value.shape, key
        np.testing.assert_allclose(got[key], value, rtol=1e-5, atol=1e-6, err_msg=key)


def frame_with(at: AppTest, column: str):
    """The page's one table (st.dataframe) that has `column`, as a pandas DataFrame."""
    (frame,) = [f.value for f in at.dataframe if column in f.value.columns]
    return frame


def successes(at: AppTest) -> list[str]:
    return [s.value for s in at.success]


# ----------------------------------------------------------------------------------------------
# The page


def test_a_shapes_batch_shows_the_figure_and_downloads_the_cli_files(tiny_env, runtime, tiny_model, monkeypatch):
    """A Shapes batch runs on Run only; the figure, the high-norm chart and the three files appear; the .npz
    equals analyze_dataset on the same drawn images; changing a widget afterwards recomputes nothing."""
    at = open_page(runtime)
    assert not at.get("image") and not successes(at)  # nothing runs before Run
    at.number_input(key=session.K_MANY_COUNT).set_value(10).run()
    assert not successes(at)
    run_clicked(at)
    assert successes(at) and successes(at)[0].startswith("10 images analysed (10 drawn Shapes (seed 0))")
    assert "vit_tiny_patch16_224" in successes(at)[0] and "on CPU" in successes(at)[0]
    assert len(at.get("image")) == 1  # Fig. 7 right for the set
    assert any("Share of high-norm" in c.proto.spec for c in at.get("plotly_chart"))
    assert [b.proto.label for b in at.get("download_button")] == [
        "dataset.npz", "dataset.json", "mean_attention_distance.png", "images.csv"]
    table = frame_with(at, "file")  # one row per image, in the set's order
    assert list(table["file"]) == [f"shape_{i:03d}_{shapes.LABELS[k]}.png" for i, k in enumerate(shapes.draw_set(10, 0).labels)]
    assert set(table.columns) >= {"label", "predicted", "predicted_name", "probability", "correct"}
    lens_axis = next(c.proto.spec for c in at.get("plotly_chart") if "Share of high-norm" in c.proto.spec)
    assert "tokens after block (emb = the embeddings entering block 0)" in lens_axis and '"emb"' in lens_axis

    expected = dataset.analyze_dataset(tiny_model, shapes_set(tiny_model, 10, 0).sources, None, batch_size=4)
    assert_same_arrays(downloaded_npz(at, runtime), expected.arrays())
    summary = json.loads(download(runtime, at, "dataset.json"))
    assert summary["num_images"] == 10 and summary["device"] == "CPU" and summary["accuracy"] is None
    assert download(runtime, at, ".png").startswith(b"\x89PNG")

    calls = []
    monkeypatch.setattr(dataset, "analyze_dataset", lambda *a, **k: calls.append(a))
    at.number_input(key=session.K_MANY_SEED).set_value(3).run()  # a widget changes: the result stays, no new run
    assert_healthy(at)
    assert not calls and successes(at)[0].startswith("10 images analysed (10 drawn Shapes (seed 0))")
    assert len(at.get("image")) == 1


def test_several_uploaded_images(tiny_env, runtime, tiny_model):
    files = [(f"drawn_{i}.png", png(i)) for i in range(3)]
    at = run_clicked(upload(open_page(runtime), *files))
    assert successes(at)[0].startswith("3 images analysed (3 uploaded images)")
    assert not at.error and not at.warning
    assert any("No labels" in c.value for c in at.caption)
    expected = dataset.analyze_dataset(tiny_model, files)
    assert_same_arrays(downloaded_npz(at, runtime), expected.arrays())


def test_a_zip_with_class_folders_gives_accuracy(tiny_env, runtime, tiny_model):
    """Class folders one level down (a zip of `myset/`): index names 0 and 1 label the images; a nested zip and
    a text file are skipped and named; a member named .png that is no image is listed as a failure."""
    members = {"myset/0/a.png": png(0), "myset/0/b.png": png(1), "myset/1/c.png": png(2),
               "myset/1/broken.png": b"not an image", "myset/notes.txt": b"hello", "myset/inner.zip": zipped({"x.png": png(3)}),
               "__MACOSX/myset/._a.png": b"junk"}
    at = run_clicked(upload(open_page(runtime), ("myset.zip", zipped(members))))
    assert successes(at)[0].startswith("3 images analysed (4 uploaded images)")
    skipped = next(c.value for c in at.caption if c.value.startswith("Skipped 2"))
    assert "inner.zip" in skipped and "notes.txt" in skipped and "MACOSX" not in skipped
    assert any("1 image(s) could not be used" in w.value for w in at.warning)
    assert "broken.png" in "".join(m.value for m in at.markdown)
    metric = next(m for m in at.metric if m.label.startswith("Top-1 accuracy"))
    assert metric.label == "Top-1 accuracy over 3 labelled images"
    assert any("Logit-lens" in c.proto.spec for c in at.get("plotly_chart"))
    assert any("Confusion matrix" in c.proto.spec for c in at.get("plotly_chart"))

    sources = [("myset.zip/" + name, members[name]) for name in ("myset/0/a.png", "myset/0/b.png", "myset/1/c.png",
                                                                  "myset/1/broken.png")]
    expected = dataset.analyze_dataset(tiny_model, sources, [0, 0, 1, 1])
    got = downloaded_npz(at, runtime)
    assert_same_arrays(got, expected.arrays())
    assert "accuracy" in got and got["logit_lens_accuracy"].shape == (3,)  # 2 blocks: L + 1 rows
    classes = frame_with(at, "accuracy")
    assert list(classes["class"]) == [0, 1] and list(classes["images"]) == [2, 1]
    assert list(classes["correct"]) == [int(got["class_correct"][0]), int(got["class_correct"][1])]
    table = frame_with(at, "file")
    assert list(table["file"]) == [name for name, _ in sources[:3]] and list(table["label"]) == [0, 0, 1]
    assert [b.proto.label for b in at.get("download_button")][-2:] == ["images.csv", "classes.csv"]
    assert download(runtime, at, "images.csv") == dataset.dataset_files(expected, tiny_model.geometry)["images.csv"]


@pytest.mark.parametrize("case", ["zip bomb", "too many files", "non-image zip", "path traversal", "no readable image"])
def test_a_refused_set_says_why_in_one_sentence_and_keeps_the_previous_result(tiny_env, runtime, monkeypatch, case):
    at = run_clicked(upload(open_page(runtime), ("good.png", png(0))))
    before = successes(at)
    assert before[0].startswith("1 images analysed")
    if case == "zip bomb":  # 26 MB of zeros: a small file that unpacks beyond the 25 MB an image may have
        files = [("bomb.zip", zipped({"bomb.png": bytes(26 * 2**20)}))]
        said = "bomb.zip: bomb.png unpacks to 26 MB"
    elif case == "too many files":
        monkeypatch.setattr(image_sets, "MAX_IMAGES", 3)
        files = [(f"drawn_{i}.png", png(i)) for i in range(4)]
        said = "These uploads hold 4 images; one run takes at most 3."
    elif case == "non-image zip":
        files = [("papers.zip", zipped({"a.txt": b"text", "b.zip": zipped({"c.png": png(1)})}))]
        said = "There is no image in these uploads (only 2 file(s) that are not images: papers.zip/a.txt, papers.zip/b.zip)."
    elif case == "path traversal":
        files = [("evil.zip", zipped({"../../etc/evil.png": png(1)}))]
        said = "evil.zip holds a member named '../../etc/evil.png' that points outside the archive"
    else:  # refused by analyze_dataset itself (DatasetError), after decoding
        files = [("fake.png", b"not an image"), ("empty.jpg", b"")]
        said = "None of the 2 images could be read (first: fake.png: "
    upload(at, *files)
    run_clicked(at)
    errors = [as_written(e.value) for e in at.error]
    assert len(errors) == 1 and said in errors[0], errors
    if case != "no readable image":  # that message is vit_core.dataset's, and quotes the decoder's own reason
        assert one_sentence(errors[0]), errors[0]
    assert successes(at) == before  # nothing lost: the previous result is still shown, with its downloads
    assert len(at.get("download_button")) == 4 and len(at.get("image")) == 1


@pytest.mark.parametrize("folder", ["\u00b2", "7" * 5_000])
def test_class_folders_named_by_digits_int_refuses_say_no_value_error(tiny_env, runtime, folder):
    """`str.isdigit()` accepts '²' and 5,000 digits, `int()` refuses them: such a folder names no class (the run goes
    on, its images unlabelled), or the zip is refused in one sentence; never a ValueError on the page."""
    at = run_clicked(upload(open_page(runtime), ("digits.zip", zipped({f"{folder}/a.png": png(0), "0/b.png": png(1)}))))
    shown = [e.value for e in at.error] + [w.value for w in at.warning] + [m.value for m in at.markdown]
    assert not any("ValueError" in text or "int()" in text for text in shown)
    errors = [as_written(e.value) for e in at.error]
    if errors:
        assert len(errors) == 1 and errors[0].startswith("digits.zip ") and one_sentence(errors[0]), errors
    else:
        assert successes(at)[0].startswith("2 images analysed")
        assert next(m for m in at.metric if m.label.startswith("Top-1 accuracy")).label == (
            "Top-1 accuracy over 1 labelled images")


def test_a_folder_name_the_label_rules_choke_on_refuses_the_zip_in_one_sentence(tiny_model, monkeypatch):
    def choke(*args):
        raise ValueError("invalid literal for int() with base 10: '\u00b2'")

    monkeypatch.setattr(dataset, "folder_labels", choke)
    with pytest.raises(SetError) as refused:
        uploaded_set(tiny_model, [("digits.zip", zipped({"\u00b2/a.png": png(0)}))])
    assert str(refused.value) == "digits.zip has a class folder whose name can't be read as a class, so it is refused."


@pytest.mark.parametrize("make", [hostile.zip_with_decoy_zip64_record, hostile.zip_with_signature_in_end_record])
def test_a_zip_hiding_its_directory_is_refused_on_the_page_in_one_sentence(tiny_env, runtime, make):
    at = run_clicked(upload(open_page(runtime), ("good.png", png(0))))
    before = successes(at)
    run_clicked(upload(at, ("hidden.zip", make(2_000))))
    errors = [as_written(e.value) for e in at.error]
    assert len(errors) == 1 and errors[0].startswith("hidden.zip ") and one_sentence(errors[0]), errors
    assert successes(at) == before


@pytest.mark.skipif(not teaching_model_available(), reason="the bundled Shapes ViT's weights are not here")
def test_the_shapes_vit_on_a_shapes_batch_shows_accuracy_and_the_logit_lens(monkeypatch, runtime):
    monkeypatch.setenv("VIT_LENS_MODEL", TEACHING_MODEL)
    at = open_page(runtime)
    at.number_input(key=session.K_MANY_COUNT).set_value(18).run()
    run_clicked(at)
    loaded = build_named_model(TEACHING_MODEL, False)
    image_set = shapes_set(loaded, 18, 0)
    assert image_set.labels == tuple(int(k) for k in shapes.draw_set(18, 0).labels)  # the model's classes = LABELS
    expected = dataset.analyze_dataset(loaded, image_set.sources, image_set.labels)
    metric = next(m for m in at.metric if m.label.startswith("Top-1 accuracy"))
    assert metric.value == f"{expected.accuracy:.1%}"
    assert any("Logit-lens" in c.proto.spec for c in at.get("plotly_chart"))
    assert_same_arrays(downloaded_npz(at, runtime), expected.arrays())


@pytest.mark.skipif(not teaching_model_available(), reason="the bundled Shapes ViT's weights are not here")
def test_judging_a_shapes_batch_says_which_explanation_to_trust_against_the_silhouettes(monkeypatch, runtime):
    """With the toggle on, every image's maps are judged, the drawn shapes' against their silhouettes: the page's table
    is the result's folder judgement, whose localisation means are those of explain.judge image by image."""
    from dashboard.views import many_images
    from vit_core import explain
    from vit_core.export import EXPORT_TESTS

    monkeypatch.setenv("VIT_LENS_MODEL", TEACHING_MODEL)
    at = open_page(runtime)
    at.number_input(key=session.K_MANY_COUNT).set_value(9).run()
    at.toggle(key=session.K_MANY_EXPLAIN).set_value(True).run()
    run_clicked(at)
    assert "Which explanation to trust over the set" in [h.value for h in at.subheader]
    loaded = build_named_model(TEACHING_MODEL, False)
    image_set = shapes_set(loaded, 9, 0)
    assert len(image_set.masks) == 8  # the one "other" drawing has no object
    expected = {}
    for name, data in image_set.sources:
        image = load_image(data, loaded.decode_min_side)
        relevance = explain.relevance_maps(loaded, image)
        mask = image_set.masks.get(name)
        objects = None if mask is None else explain.object_patches(loaded, mask, image.size)
        judged = explain.judge(loaded, image, relevance.maps, relevance.target, mask=objects, tests=EXPORT_TESTS)
        for key, value in explain.judgement_scalars(judged).items():
            expected.setdefault(key, []).append(value)
    assert len(expected["relevance_mass_chefer"]) == 8 and len(expected["deletion_auc_chefer"]) == 9
    result = session_run(at).result
    assert set(result.explained) == set(expected)
    for key, values in expected.items():
        assert result.explained[key] == pytest.approx(np.mean(values), abs=1e-6), key
    shown = next(m.value for m in at.markdown if m.value.startswith("| method |"))
    assert shown == many_images.trust_table(result.which_to_trust())


# ----------------------------------------------------------------------------------------------
# Sets and zips on their own


def test_zip_members_checks_the_directory_before_extracting(monkeypatch):
    assert zip_members("ok.zip", zipped({"a/x.png": b"1", "a/y.txt": b"2", ".DS_Store": b"3"})) == (
        [("a/x.png", b"1")], ["a/y.txt"])
    with pytest.raises(SetError, match="not a readable zip file"):
        zip_members("no.zip", b"PK not really")
    with pytest.raises(SetError, match="points outside the archive"):
        zip_members("abs.zip", zipped({"/etc/x.png": b"1"}))
    monkeypatch.setattr(image_sets, "MAX_ZIP_MEMBERS", 5)
    with pytest.raises(SetError, match="has 6 entries; a zip here may have at most 5"):
        zip_members("many.zip", zipped({f"{i}.txt": b"" for i in range(6)}))
    monkeypatch.setattr(image_sets, "MAX_SET_MB", 1)
    with pytest.raises(SetError, match="unpacks to 2 MB of images; a set may have at most 1 MB"):
        zip_members("big.zip", zipped({"a.png": bytes(2**20), "b.png": bytes(2**20)}))


@pytest.mark.parametrize("entries", [500_000, 70_000, 1_001])
def test_a_zips_entry_count_is_refused_from_its_end_record_before_zipfile_reads_the_directory(entries, monkeypatch):
    """A hostile zip's directory costs zipfile seconds and hundreds of MB to read: its count is refused first."""
    def no_parse(*args, **kwargs):
        raise AssertionError("zipfile parsed the directory")

    data = hostile.zip_claiming_entries(entries)
    monkeypatch.setattr(zipfile, "ZipFile", no_parse)
    with pytest.raises(SetError, match=rf"^big\.zip has {entries:,} entries; a zip here may have at most 1000\.$"):
        zip_members("big.zip", data)


def test_a_real_directory_of_many_entries_is_refused_from_its_end_record(monkeypatch):
    data = hostile.zip_of_many_entries(70_000)  # zip64: more than 65,535 entries
    monkeypatch.setattr(zipfile, "ZipFile", None)  # never reached
    with pytest.raises(SetError, match=r"has 70,000 entries"):
        zip_members("many.zip", data)


def test_a_directory_larger_than_its_entries_need_is_refused(monkeypatch):
    """zipfile walks the directory's declared bytes, whatever count the record gives."""
    data = bytearray(hostile.zip_claiming_entries(3))
    at = data.rfind(b"PK\x05\x06")
    data[at + 12:at + 16] = (50 * 2**20).to_bytes(4, "little")
    with pytest.raises(SetError, match=r"has a directory of 50\.0 MB; a zip here may have at most 1000 entries\.$"):
        zip_members("wide.zip", bytes(data))


def test_duplicate_and_overlapping_entries_are_refused_before_anything_is_inflated():
    with pytest.raises(SetError, match=r"^dup\.zip holds 'a/x\.png' twice, so it is refused\.$"):
        zip_members("dup.zip", hostile.zip_with_duplicate("a/x.png", png(0), png(1)))
    with pytest.raises(SetError, match=r"^bomb\.zip: the entries 'a\.png' and 'b\.png' share their data \(a zip "
                                       r"bomb's trick\), so it is refused\.$"):
        zip_members("bomb.zip", hostile.zip_with_overlap(["a.png", "b.png", "c.png"], bytes(2**20)))


def test_a_member_larger_than_it_declares_is_refused():
    """A zip whose directory understates a member's size (a bomb hiding from the size checks): reading stops at
    the declared size, the data then fails its checksum, and the zip is refused; nothing beyond is read."""
    honest = zipped({"a.png": bytes(10_000)})
    archive = zipfile.ZipFile(io.BytesIO(honest))
    info = archive.infolist()[0]
    lying = bytearray(honest)
    size = info.file_size.to_bytes(4, "little")
    for at in [m.start() for m in re.finditer(re.escape(size), bytes(lying))]:
        lying[at:at + 4] = (100).to_bytes(4, "little")  # local header and central directory: "100 bytes"
    with pytest.raises(SetError, match="a.png can't be unpacked"):
        zip_members("liar.zip", bytes(lying))


def test_uploaded_set_labels_and_bounds(tiny_model, monkeypatch):
    image_set = uploaded_set(tiny_model, [("p.png", png(0)), ("c.zip", zipped({"0/a.png": png(1), "x/b.png": png(2)}))])
    assert [name for name, _ in image_set.sources] == ["p.png", "c.zip/0/a.png", "c.zip/x/b.png"]
    assert image_set.labels == (None, 0, None)  # 'x' names no class
    assert image_set.no_labels_reason == ""
    assert uploaded_set(tiny_model, [("p.png", png(0))]).labels is None
    with pytest.raises(SetError, match="Upload some images"):
        uploaded_set(tiny_model, [])
    monkeypatch.setattr(image_sets, "MAX_IMAGE_MB", 1)  # a single image over the cap: skipped, and said
    kept = uploaded_set(tiny_model, [("big.png", bytes(2 * 2**20)), ("small.png", png(0))])
    assert [name for name, _ in kept.sources] == ["small.png"] and kept.notes == ("Skipped 1 image(s) over 1 MB: big.png.",)
    with pytest.raises(SetError, match=re.escape("There is no image in these uploads (only 1 image(s) over 1 MB: big.png).")):
        uploaded_set(tiny_model, [("big.png", bytes(2 * 2**20))])
    monkeypatch.setattr(image_sets, "MAX_IMAGES", 3)  # a zip counts against what the other uploads hold
    with pytest.raises(SetError, match=re.escape("c.zip holds 2 (and the other uploads 2) images; one run takes at most 3.")):
        uploaded_set(tiny_model, [("p.png", png(0)), ("q.png", png(1)), ("c.zip", zipped({"a.png": png(2), "b.png": png(3)}))])
    monkeypatch.setattr(image_sets, "MAX_SET_MB", 1)
    with pytest.raises(SetError, match="These uploads hold 2 MB; a set may have at most 1 MB"):
        uploaded_set(tiny_model, [("a.png", bytes(2 * 2**20))])


def test_shapes_set_is_drawn_by_the_generator_with_the_model_s_labels(tiny_model):
    drawn = shapes.draw_set(9, 4)
    image_set = shapes_set(tiny_model, 9, 4)
    assert len(image_set.sources) == 9 and image_set.description == "9 drawn Shapes (seed 4)"
    first = np.asarray(load_image(image_set.sources[0][1]))
    np.testing.assert_array_equal(first, drawn.images[0])  # PNG: lossless
    assert image_set.labels is None and "not the Shapes' classes" in image_set.no_labels_reason  # ImageNet-sized head
    with pytest.raises(SetError, match="1 to"):
        shapes_set(tiny_model, image_sets.MAX_IMAGES + 1, 0)


def test_a_kept_result_names_its_model_when_the_sidebar_changes(tiny_env, runtime):
    at = open_page(runtime)
    at.number_input(key=session.K_MANY_COUNT).set_value(4).run()
    run_clicked(at)
    before = successes(at)
    at.selectbox(key=session.K_MODEL).set_value(TEACHING_MODEL).run()
    assert_healthy(at)
    assert successes(at) == before  # kept, not recomputed for the new model
    assert [as_written(i.value) for i in at.info] == [
        "This result is for vit_tiny_patch16_224; press Run for the model in the sidebar."]


def test_run_set_reports_progress_to_the_end(tiny_model):
    calls = []
    run = image_sets.run_set(ModelRequest("test-tiny"), tiny_model, shapes_set(tiny_model, 5, 1),
                              progress=lambda done, total: calls.append((done, total)))
    assert calls and calls[-1] == (5, 5) and all(b == 5 for _, b in calls)
    assert run.result.num_images == 5 and run.model_name == "vit_tiny_patch16_224" and run.seconds > 0
    assert set(run.files) == {"dataset.npz", "dataset.json", "mean_attention_distance.png", "images.csv"}


# ----------------------------------------------------------------------------------------------
# A run's budget, and the limits the page states


def test_a_run_in_parts_gives_the_same_result_as_one_pass(tiny_model, monkeypatch):
    monkeypatch.setattr(image_sets, "RUN_CHUNK", 4)
    drawn = shapes_set(tiny_model, 10, 0)
    sources = (*drawn.sources[:5], ("broken.png", b"not an image"), *drawn.sources[5:])
    labels = (3, None, 7, 3, 3, 0, None, 1, 2, 3, 4)
    run = image_sets.run_set(ModelRequest("test-tiny"), tiny_model, image_sets.ImageSet("parts", sources, labels))
    expected = dataset.analyze_dataset(tiny_model, sources, labels)
    assert run.result.num_images == 10 and run.result.num_labelled == expected.num_labelled and not run.stopped
    assert run.result.failures == expected.failures and run.result.accuracy == pytest.approx(expected.accuracy)
    for key, value in expected.arrays().items():
        np.testing.assert_allclose(run.result.arrays()[key], value, rtol=1e-5, atol=1e-6, err_msg=key)


def test_a_run_over_its_budget_stops_and_keeps_what_it_finished(tiny_model, monkeypatch):
    """256 costly files can each pass every check: the run's budget bounds how long they hold the server."""
    monkeypatch.setattr(image_sets, "RUN_CHUNK", 4)
    ticks = iter(range(0, 10_000, 100))  # each look at the clock: 100 s later
    image_set = shapes_set(tiny_model, 20, 0)
    run = image_sets.run_set(ModelRequest("test-tiny"), tiny_model, image_set, budget_s=250, clock=lambda: next(ticks))
    assert run.result.num_images == 8  # the clock read 100 and 200 s before the first two parts of 4, then 300
    assert re.fullmatch(r"The run stopped after \d+ s, the time one run may take here: 8 of 20 images were "
                        r"analysed, the others not; the results below are for those\.", run.stopped)
    expected = dataset.analyze_dataset(tiny_model, image_set.sources[:8])
    np.testing.assert_allclose(run.result.mean_attention_distance, expected.mean_attention_distance, rtol=1e-5)
    assert run.files["dataset.json"] and json.loads(run.files["dataset.json"])["num_images"] == 8


def test_the_budget_is_looked_at_after_every_judged_image_and_every_chunk(tiny_model, monkeypatch):
    """A judged image on ViT-B/16 takes seconds: the red team's 32-image run went 140 s over its 300 s when the budget
    was looked at every 16 images. Unjudged, after every chunk of RUN_CHUNK."""
    monkeypatch.setattr(image_sets, "RUN_CHUNK", 3)
    image_set = shapes_set(tiny_model, 8, 0)
    for explain, analysed in ((True, 2), (False, 6)):
        ticks = iter(range(0, 10_000, 100))
        run = image_sets.run_set(ModelRequest("test-tiny"), tiny_model, image_set, budget_s=250,
                                 clock=lambda ticks=ticks: next(ticks), explain=explain)
        assert run.result.num_images == analysed  # started at 0; 100 and 200 s before the first two chunks, then 300


@pytest.mark.parametrize("server_mb, shown_mb", [(25, 25), (400, 100)])
def test_the_page_states_the_upload_limit_the_server_enforces(tiny_env, runtime, server_mb, shown_mb):
    """The limit the page states is the server's (class mode: server.maxUploadSize 25 MB), or a larger zip gets a 413."""
    from streamlit import config

    before = config.get_option("server.maxUploadSize")
    config.set_option("server.maxUploadSize", server_mb)
    try:
        at = open_page(runtime)
        at.radio(key=session.K_MANY_SOURCE).set_value(image_sets.UPLOADS).run()
        limits = next(c.value for c in at.caption if c.value.startswith("At most"))
    finally:
        config.set_option("server.maxUploadSize", before)
    assert f"an image up to {min(shown_mb, 25)} MB, a .zip up to {shown_mb} MB" in as_written(limits)
    assert at.file_uploader(key=session.K_MANY_FILES).proto.max_upload_size_mb == shown_mb


# ----------------------------------------------------------------------------------------------
# The page's figures on their own


def test_the_confusion_matrix_shows_the_most_frequent_true_classes_and_lumps_the_other_predictions():
    from dashboard.figures.many_images import confusion_figure, confusion_matrix

    cells = np.array([[0, 0, 5], [0, 3, 1], [2, 2, 4], [2, 0, 2], [7, 9, 1], [3, 3, 3]])  # (true, predicted, images)
    matrix, shown, cut = confusion_matrix(cells, max_classes=3)
    assert shown == [0, 2, 3] and cut  # class 7 has the fewest images: left out
    expected = np.zeros((3, 4), dtype=np.int64)  # columns: 0, 2, 3, then any other class
    for true, predicted, count in cells.tolist():
        if true in shown:
            expected[shown.index(true), shown.index(predicted) if predicted in shown else 3] += count
    np.testing.assert_array_equal(matrix, expected)
    assert matrix[0].tolist() == [5, 0, 1, 0] and matrix[1].tolist() == [2, 4, 0, 0]
    figure = confusion_figure(cells, ["tench, Tinca tinca", "goldfish", "shark", "crane"])  # all 4 true classes fit
    assert list(figure.data[0].x) == ["0: tench", "2: shark", "3: crane", "7: class 7", "other"]
    assert list(figure.data[0].y) == ["0: tench", "2: shark", "3: crane", "7: class 7"]
    assert figure.layout.title.text == "Confusion matrix"
