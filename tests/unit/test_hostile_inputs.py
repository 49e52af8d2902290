"""One student must not be able to take the server down: crafted weights, archives and label files.

Each attack is crafted here and sent through the command line (`python -m vit_core analyze`, in a
child process whose peak memory is measured for the size attacks) and through the app (AppTest):
refused with one sentence, no traceback, and for the size attacks a peak memory close to a normal run's.
"""

from __future__ import annotations

import io
import json
import re
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from conftest import assert_healthy, choose_weights, drawn_image, run_app
from tools.hostile import archives as hostile
from vit_core import WeightsError, load_model
from vit_core.loading.labels import MAX_CLASSES, MAX_LABEL_FILE_BYTES
from vit_core.loading.weights import SAFETENSORS_MAX_TENSORS

ARCH = "vit_tiny_patch16_224"
TINY = dict(depth=2)


# ---------------------------------------------------------------------------------- crafted files


def safetensors_header_only(tensors: dict[str, tuple[str, tuple[int, ...], int]]) -> bytes:
    """A .safetensors file from its header alone: name -> (dtype, shape, bytes of data really present)."""
    header, data, offset = {}, b"", 0
    for name, (dtype, shape, nbytes) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        data += b"\0" * nbytes
        offset += nbytes
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + data


def huge_head() -> bytes:
    """88-byte-class attack: a head of 4,000,000 classes, each of zero features (zero bytes of data)."""
    return safetensors_header_only({"head.weight": ("F32", (4_000_000, 0), 0)})


def npy_header(shape: tuple[int, ...], dtype: str = "<f4") -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": dtype, "fortran_order": False, "shape": shape})
    return buffer.getvalue()


def npz_bomb(path: Path, values: int) -> Path:
    """A JAX-style .npz whose first array inflates to `values` float32 zeros (a few hundred KB on disk)."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
        with archive.open("embedding/kernel.npy", "w", force_zip64=True) as member:
            member.write(npy_header((values,)))
            chunk = b"\0" * 2**24
            for _ in range(-(-values * 4 // len(chunk))):  # whole chunks: values is a multiple of 2**22
                member.write(chunk)
    return path


def npz_declared_only(path: Path, shape: tuple[int, ...]) -> Path:
    """A .npz whose array header declares `shape` over almost no data."""
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("embedding/kernel.npy", npy_header(shape) + b"\0" * 64)
    return path


# ---------------------------------------------------------------------------------- the library


def test_a_tiny_file_declaring_a_huge_head_is_refused_before_anything_is_built(tmp_path):
    path = tmp_path / "tiny.safetensors"
    path.write_bytes(huge_head())
    assert len(huge_head()) < 100
    with pytest.raises(WeightsError, match=r"4,000,000 classes"):
        load_model(ARCH, weights=path, **TINY)


def test_a_header_claiming_more_data_than_the_file_holds_is_refused(tmp_path):
    path = tmp_path / "liar.safetensors"
    raw = safetensors_header_only({"head.weight": ("F32", (10, 192), 40)})  # 7,680 bytes declared, 40 present
    path.write_bytes(raw)
    with pytest.raises(WeightsError, match=r"not a valid safetensors file .*head\.weight.*\(10, 192\)"):
        load_model(ARCH, weights=path, **TINY)


@pytest.mark.parametrize("suffix", [".safetensors", ".pth"])  # the header's declaration; a pickle's tensors once read
def test_the_class_count_is_capped(tmp_path, monkeypatch, suffix):
    from vit_core.loading import weights

    path = tmp_path / f"ft{suffix}"
    head = {"head.weight": torch.zeros(12, 192), "head.bias": torch.zeros(12)}
    if suffix == ".safetensors":
        save_file(head, str(path))
    else:
        torch.save(head, path)
    monkeypatch.setattr(weights, "MAX_CLASSES", 10)
    with pytest.raises(WeightsError, match=r"head of 12 classes; ViT Lens loads 1 to 10"):
        load_model(ARCH, weights=path, **TINY)
    assert MAX_CLASSES >= 21_843  # ImageNet-21k heads still load


HEADER_ATTACKS = [  # unchecked, each escapes as RecursionError or OverflowError, or is refused only after minutes and GBs
    ("deep", hostile.nested_header(100_000), r"not a valid safetensors file \(its header is not a table of tensors: "
                                              r"it nests 100,002 levels deep, more than the 8 allowed\)\.$"),
    ("1e400", hostile.overflowing_shape(), r"tensor 'x' is not described properly \(its shape and offsets must be whole"),
    ("negative", hostile.safetensors_from_header('{"x": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 0]}}'),
     r"whole numbers"),
    ("text-shape", hostile.safetensors_from_header('{"x": {"dtype": "F32", "shape": ["3"], "data_offsets": [0, 12]}}',
                                                   bytes(12)), r"whole numbers"),
    ("many-empty", hostile.empty_tensors_header(SAFETENSORS_MAX_TENSORS + 1),
     rf"declares {SAFETENSORS_MAX_TENSORS + 1:,} tensors; ViT Lens loads at most {SAFETENSORS_MAX_TENSORS:,}"),
]


@pytest.mark.parametrize("name, data, message", HEADER_ATTACKS, ids=[a[0] for a in HEADER_ATTACKS])
def test_hostile_safetensors_headers_are_one_weights_error(tmp_path, name, data, message):
    path = tmp_path / f"{name}.safetensors"
    path.write_bytes(data)
    with pytest.raises(WeightsError, match=message):
        load_model(ARCH, weights=path, **TINY)


def test_a_huge_header_is_refused_from_its_length_field_unread(tmp_path):
    """A 99 MB header (1.67 M empty tensors took 106-123 s and +2.5 GB to refuse): the length field alone refuses it.
    The file is sparse: a reader that trusted the field would read 99 MB of it."""
    path = hostile.sparse_safetensors(tmp_path / "huge.safetensors", 99_000_000)
    started = time.perf_counter()
    with pytest.raises(WeightsError, match=r"^huge\.safetensors has a safetensors header of 94\.4 MB; ViT Lens reads "
                                           r"headers of at most 4 MB \(a ViT's is under 100 KB\)\.$"):
        load_model(ARCH, weights=path, **TINY)
    assert time.perf_counter() - started < 30  # generous for a busy machine; reading the header took 106-123 s


def test_a_real_vits_header_is_far_below_the_caps():
    """The caps' margin: the largest timm ViT's header (built on 'meta', as a safetensors file of it would list it)."""
    from vit_core.loading.weights import SAFETENSORS_MAX_HEADER_BYTES

    with torch.device("meta"):
        import timm

        state = timm.create_model("vit_gigantic_patch14_clip_224", pretrained=False).state_dict()
    header = {k: {"dtype": "F32", "shape": list(v.shape), "data_offsets": [0, v.numel() * 4]} for k, v in state.items()}
    assert len(state) * 10 < SAFETENSORS_MAX_TENSORS and len(json.dumps(header)) * 50 < SAFETENSORS_MAX_HEADER_BYTES


def test_a_pickled_tensor_larger_than_its_storage_is_refused(tmp_path):
    path = tmp_path / "stride0.pth"
    torch.save({"head.weight": torch.zeros(1).expand(200_000, 192)}, path)  # one float, declared as 38M
    assert path.stat().st_size < 10_000
    with pytest.raises(WeightsError, match=r"over less data|200,000 classes"):
        load_model(ARCH, weights=path, **TINY)


def test_a_pytorch_checkpoint_with_compressed_records_is_refused_unread(tmp_path):
    plain = io.BytesIO()
    torch.save({"head.weight": torch.zeros(1000, 192)}, plain)  # 768 kB of zeros, stored as torch writes it
    path = tmp_path / "bomb.pth"
    with zipfile.ZipFile(plain) as source, zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as crafted:
        for member in source.infolist():
            crafted.writestr(member.filename, source.read(member))
    assert path.stat().st_size < 100_000  # the same records, deflated: torch would inflate them
    with pytest.raises(WeightsError, match=r"compressed records that would inflate to"):
        load_model(ARCH, weights=path, **TINY)


def test_an_npz_declaring_a_huge_array_is_refused_from_its_header(tmp_path):
    path = npz_declared_only(tmp_path / "ckpt.npz", (1_000_000_000,))
    with pytest.raises(WeightsError, match=r"embedding/kernel.*1,000,000,000 values"):
        load_model(ARCH, weights=path, **TINY)


def test_an_npz_that_is_not_an_archive_is_one_sentence(tmp_path):
    path = tmp_path / "ckpt.npz"
    path.write_bytes(b"not a zip at all")
    with pytest.raises(WeightsError, match=r"not a valid \.npz archive"):
        load_model(ARCH, weights=path, **TINY)


def test_weights_messages_name_the_file_not_the_servers_folder(tmp_path):
    with pytest.raises(WeightsError) as refused:
        load_model(ARCH, weights=tmp_path / "gone.safetensors", **TINY)
    assert str(tmp_path) not in str(refused.value)


LABEL_ATTACKS = [
    ("latin1.txt", "chat\nchien\n".encode() + "\xe9l\xe9phant\n".encode("latin-1"), r"not UTF-8 text"),
    ("broken.json", b'["cat", "dog"', r"is not JSON of the form"),
    ("number.json", b"42", r"is not JSON of the form"),
    ("keys.json", b'{"a": "cat", "b": "dog"}', r"is not JSON of the form"),
    ("nested.json", b'[["cat"], {"x": 1}]', r"is not JSON of the form"),
    ("deep.json", hostile.nested_labels(100_000).encode(), r"is not JSON of the form"),  # was a RecursionError
]


@pytest.mark.parametrize("name, data, message", LABEL_ATTACKS, ids=[a[0] for a in LABEL_ATTACKS])
def test_malformed_label_files_are_one_sentence(tmp_path, name, data, message):
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(WeightsError, match=message):
        load_model(ARCH, pretrained=False, labels=path, **TINY)


def test_label_files_are_capped_in_size_before_reading(tmp_path):
    path = tmp_path / "huge.txt"
    with path.open("wb") as f:
        f.truncate(MAX_LABEL_FILE_BYTES + 1)  # sparse: no disk, no memory
    with pytest.raises(WeightsError, match=r"label files are limited to"):
        load_model(ARCH, pretrained=False, labels=path, **TINY)


def test_a_utf8_label_file_with_a_byte_order_mark_still_loads(tmp_path):
    path = tmp_path / "names.txt"
    path.write_bytes(("\ufeff" + "\n".join(f"ding {i}" for i in range(1000))).encode())  # as Windows Notepad saves it
    assert load_model(ARCH, pretrained=False, labels=path, **TINY).labels[0] == "ding 0"


# ---------------------------------------------------------------------------------- the command line


def cli_peak(args: list[str], cwd: Path) -> tuple[int, str, int]:
    """(exit status, stderr, peak RSS in MB) of `python -m vit_core analyze ...` in a child process.

    The child is started by a small Python parent that reads RUSAGE_CHILDREN: the peak of its one child."""
    parent = ("import resource, subprocess, sys; "
              "r = subprocess.run([sys.executable, '-m', 'vit_core', 'analyze', *sys.argv[1:]], capture_output=True, text=True); "
              "sys.stderr.write(r.stderr); "
              "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)")
    done = subprocess.run([sys.executable, "-c", parent, *args], capture_output=True, text=True, cwd=cwd, timeout=300)
    status, peak_mb = (int(x) for x in done.stdout.split())
    return status, done.stderr, peak_mb


@pytest.fixture(scope="module")
def normal_run(tmp_path_factory):
    """A normal CLI run on the same architecture: the memory a run is allowed."""
    folder = tmp_path_factory.mktemp("normal")
    drawn_image(0).save(folder / "photo.png")
    status, err, peak = cli_peak(["photo.png", "--model", ARCH, "--random-init", "--out", "out"], folder)
    assert status == 0, err
    return folder, peak


def assert_one_sentence(err: str, pattern: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert re.search(pattern, lines[0]), lines[0]


def test_cli_refuses_a_huge_head_with_bounded_memory(normal_run):
    folder, normal_mb = normal_run
    (folder / "tiny.safetensors").write_bytes(huge_head())
    status, err, peak = cli_peak(["photo.png", "--model", ARCH, "--weights", "tiny.safetensors", "--out", "out"], folder)
    assert status == 2
    assert_one_sentence(err, r"4,000,000 classes")
    print(f"huge head: peak {peak} MB (normal run {normal_mb} MB)")
    assert peak <= normal_mb + 150, (peak, normal_mb)


def test_cli_refuses_an_npz_bomb_with_bounded_memory(normal_run):
    folder, normal_mb = normal_run
    npz_bomb(folder / "bomb.npz", values=48 * 2**22)  # 768 MiB inflated
    assert (folder / "bomb.npz").stat().st_size < 5_000_000
    status, err, peak = cli_peak(["photo.png", "--model", ARCH, "--weights", "bomb.npz", "--out", "out"], folder)
    assert status == 2
    assert_one_sentence(err, r"embedding/kernel.*values")
    print(f"npz bomb: peak {peak} MB (normal run {normal_mb} MB)")
    assert peak <= normal_mb + 150, (peak, normal_mb)


@pytest.mark.parametrize("name, data, message", LABEL_ATTACKS[:2], ids=[a[0] for a in LABEL_ATTACKS[:2]])
def test_cli_refuses_malformed_label_files_in_one_line(tmp_path, capsys, name, data, message):
    from vit_core.__main__ import main

    drawn_image(0).save(tmp_path / "photo.png")
    (tmp_path / name).write_bytes(data)
    status = main(["analyze", str(tmp_path / "photo.png"), "--model", ARCH, "--random-init",
                   "--labels", str(tmp_path / name), "--out", str(tmp_path / "out")])
    assert status == 2
    assert_one_sentence(capsys.readouterr().err, message)


# ---------------------------------------------------------------------------------- the app


@pytest.fixture
def load_calls(monkeypatch):
    """Every vit_core.load_model call the app makes (the models the dashboard builds go through it)."""
    import vit_core

    calls = []
    real = vit_core.load_model

    def counting(*args, **kwargs):
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(vit_core, "load_model", counting)
    return calls


def shown_image(at) -> str:
    """The name of the image the session shows, from the header line "Model **..** · image **name** · ..."."""
    header = next(m.value for m in at.markdown if m.value.startswith("Model **"))
    return header.split("image **")[1].split("**")[0]


def shown_model(at) -> str:
    """The name of the model the session shows, from the header line "Model **name** (weights) · ..."."""
    header = next(m.value for m in at.markdown if m.value.startswith("Model **"))
    return header.split("Model **")[1].split("**")[0]


def weights_of_small(num_classes: int, tmp_path: Path) -> bytes:
    import timm

    torch.manual_seed(0)
    model = timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=num_classes)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp_path / "w.safetensors"))
    return (tmp_path / "w.safetensors").read_bytes()


def test_app_refuses_a_huge_head_in_one_sentence_and_does_not_retry_it(tiny_env, load_calls):
    classmate = run_app()  # another session of the class, on the start-up model
    classmate_header = next(m.value for m in classmate.markdown if m.value.startswith("Model **"))
    at = run_app()
    image_before, model_before = shown_image(at), shown_model(at)
    choose_weights(at, "vit_small_patch16_224", "tiny.safetensors", huge_head())
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and "Traceback" not in errors[0], errors
    assert "tiny.safetensors declares a head of 4,000,000 classes" in errors[0], errors  # the name as uploaded
    assert shown_image(at) == image_before  # the session's image stays
    assert shown_model(at) == model_before  # and so does its model (not the bundled fallback)
    assert any("Still showing" in e for e in errors), errors
    tries = len([c for c in load_calls if c[1].get("weights")])
    assert tries == 1
    at.run()  # a rerun (any click) does not load the refused file again
    assert_healthy(at)
    assert len([c for c in load_calls if c[1].get("weights")]) == tries
    classmate.run()  # nothing else in the class is affected
    assert_healthy(classmate)
    assert not classmate.error and classmate_header in [m.value for m in classmate.markdown]


@pytest.mark.parametrize("name, data, message", LABEL_ATTACKS[:2], ids=[a[0] for a in LABEL_ATTACKS[:2]])
def test_app_refuses_malformed_label_files_in_one_sentence(tiny_env, load_calls, tmp_path, name, data, message):
    at = run_app()
    choose_weights(at, "vit_small_patch16_224", "ft.safetensors", weights_of_small(3, tmp_path), labels=(name, data))
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and re.search(message, errors[0]), errors
    tries = len(load_calls)
    at.run()
    assert_healthy(at)
    assert len(load_calls) == tries  # remembered, not retried on every rerun


def test_label_uploads_are_capped_and_the_cap_is_told(tiny_env):
    from dashboard import session
    from dashboard.models import MAX_LABELS_MB, UPLOAD_WEIGHTS

    assert MAX_LABELS_MB * 2**20 == MAX_LABEL_FILE_BYTES
    at = run_app()
    at.selectbox(key=session.K_MODEL).set_value(UPLOAD_WEIGHTS).run()
    uploader = at.file_uploader(key=session.K_LABELS)
    assert uploader.proto.max_upload_size_mb == MAX_LABELS_MB and f"{MAX_LABELS_MB} MB" in uploader.proto.label


def test_weights_uploads_only_where_the_server_allows_them(tiny_env, monkeypatch):
    from dashboard import serve, session
    from dashboard.image_choice import MAX_IMAGE_MB
    from dashboard.models import MODEL_CHOICES, TEST_TINY, UPLOAD_WEIGHTS

    offered = MODEL_CHOICES[UPLOAD_WEIGHTS]  # the selectbox lists the labels
    assert offered in run_app().selectbox(key=session.K_MODEL).options  # on for one user on their own machine
    assert serve.upload_cap_flags([]) == []
    monkeypatch.setenv("VIT_LENS_WEIGHTS_UPLOADS", "off")
    at = run_app()
    assert offered not in at.selectbox(key=session.K_MODEL).options
    at = run_app(model=UPLOAD_WEIGHTS)  # a shared link that asks for it: the start-up model, no error
    assert at.selectbox(key=session.K_MODEL).value == TEST_TINY and not at.error
    # ...and the server's own cap drops to the image size, unless the command sets one
    assert serve.upload_cap_flags(["--server.port", "8501"]) == [f"--server.maxUploadSize={MAX_IMAGE_MB}"]
    assert serve.upload_cap_flags(["--server.maxUploadSize", "50"]) == []


def test_user_strings_are_shown_literally_not_as_markdown(tiny_env):
    from dashboard import session

    at = run_app()
    name = "**big** [prize](http://example.com) $x^2$ :red[alert].png"
    at.file_uploader(key=session.K_UPLOAD).set_value((name, b"not an image", "image/png")).run()
    assert_healthy(at)
    errors = [e.value for e in at.error]
    assert len(errors) == 1, errors
    assert r"\*\*big\*\* \[prize\](http\://example.com) \$x^2\$ \:red\[alert\].png" in errors[0], errors


def test_user_strings_in_matplotlib_are_not_mathtext():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from dashboard.literal import mathtext_literal

    hostile = r"cat $\frac{1}{$ dog"
    fig, ax = plt.subplots()
    try:
        ax.set_title(hostile)
        with pytest.raises(ValueError):  # what an unescaped class name does to a figure
            fig.canvas.draw()
        ax.set_title(mathtext_literal(hostile))
        fig.canvas.draw()
        assert ax.get_title() == r"cat \$\frac{1}{\$ dog"
    finally:
        plt.close(fig)


def test_the_start_up_model_stays_when_students_hop_between_models(tiny_env):
    from dashboard import caches
    from dashboard.models import TEST_TINY, ModelRequest

    caches._cached_model.clear()  # an earlier test may have cached TEST_TINY while it was not the start-up model
    first = caches.load(ModelRequest(TEST_TINY))
    caches._cached_model.clear()  # what three other models do to the 3-entry cache
    assert caches.load(ModelRequest(TEST_TINY)) is first  # no reload for the class


# ---------------------------------------------------------------------------------- saved uploads


def test_saved_uploads_live_in_a_private_folder(tmp_path):
    import os
    import stat

    from dashboard.server import uploads

    folder = uploads.uploads_folder()
    assert folder.name != "vit_lens_uploads" and stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert folder.stat().st_uid == os.getuid()
    path, digest = uploads.store(b"weights", ".safetensors")
    assert Path(path).parent == folder and Path(path).read_bytes() == b"weights"


def test_a_failed_write_leaves_no_part_file_and_stale_ones_are_cleaned(tmp_path, monkeypatch):
    import os
    import time

    from dashboard.server import uploads

    def full_disk(*_args):
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(os, "replace", full_disk)
        with pytest.raises(OSError):
            uploads.store(b"weights", ".pth", folder=tmp_path)
    assert list(tmp_path.iterdir()) == []
    stale, fresh = tmp_path / "old.part", tmp_path / "writing.part"
    stale.write_bytes(b"x")
    fresh.write_bytes(b"x")
    long_ago = time.time() - uploads.STALE_PART_S - 60
    os.utime(stale, (long_ago, long_ago))
    uploads.store(b"weights", ".pth", folder=tmp_path)
    assert not stale.exists() and fresh.exists()
