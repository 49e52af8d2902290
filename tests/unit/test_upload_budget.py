"""The server's upload budget: Streamlit's upload manager bounded (streamlit_internals), with the app's limits
(dashboard.upload_limits). A live server under `streamlit run dashboard/app.py`: tests/live."""

from __future__ import annotations

import pytest
from starlette.exceptions import HTTPException
from streamlit.runtime.memory_uploaded_file_manager import MemoryUploadedFileManager
from streamlit.runtime.uploaded_file_manager import UploadedFileRec

from dashboard import upload_limits as limits_of_the_app
from dashboard.server import streamlit_internals, uploads

MB = 2**20


def _limits(**changes) -> uploads.UploadLimits:
    base = dict(image_bytes=4 * MB, zip_bytes=6 * MB, labels_bytes=1 * MB, weights_bytes=0, session_bytes=10 * MB,
                total_bytes=16 * MB, server_mb=6)
    return uploads.UploadLimits(**{**base, **changes})


class Clock:
    """The manager's time.monotonic, moved on by the test (`pass_`): ages compared with the grace are the test's own,
    not what a busy machine's scheduler lets pass between two lines."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def pass_(self, seconds: float) -> None:
        self.now += seconds


clock = Clock()


@pytest.fixture
def manager(monkeypatch):
    monkeypatch.setattr(streamlit_internals, "_upload_limits", _limits())
    monkeypatch.setattr(streamlit_internals, "UNCLAIMED_GRACE_S", 0.2)
    monkeypatch.setattr(streamlit_internals, "time", clock)
    return streamlit_internals._make_bounded(MemoryUploadedFileManager("/_stcore/upload_file"))


def _file(file_id: str, name: str, mb: float) -> UploadedFileRec:
    return UploadedFileRec(file_id=file_id, name=name, type="application/octet-stream", data=b"x" * int(mb * MB))


def test_a_file_over_its_kinds_cap_is_refused_with_413(manager):
    manager.add_file("s", _file("a", "small.png", 3.5))
    manager.add_file("s", _file("b", "set.zip", 5))
    manager.add_file("s", _file("c", "labels.json", 0.5))
    for name, mb in (("big.png", 4.5), ("labels.txt", 2), ("weights.safetensors", 0.1), ("set.zip", 7)):
        with pytest.raises(HTTPException) as refused:
            manager.add_file("s", _file(name, name, mb))
        assert refused.value.status_code == 413
    assert sorted(f.file_id for f in manager.get_files("s", ["a", "b", "c", "big.png", "set.zip"])) == ["a", "b", "c"]


def test_session_and_total_budgets_refuse_what_would_go_over(manager):
    for i in range(3):
        manager.add_file("s1", _file(f"f{i}", "a.png", 3))  # 9 MB held
    with pytest.raises(HTTPException) as refused:
        manager.add_file("s1", _file("f3", "a.png", 3))  # 12 MB > 10 MB for one session
    assert refused.value.status_code == 413
    manager.add_file("s1", _file("f0", "a.png", 3))  # the same file again replaces it: still 9 MB
    for i in range(2):
        manager.add_file("s2", _file(f"g{i}", "a.png", 3))  # 15 MB on the server
    with pytest.raises(HTTPException):
        manager.add_file("s3", _file("h", "a.png", 3))  # 18 MB > 16 MB in total
    assert manager.held_bytes() == 15 * MB
    manager.remove_session_files("s1")
    manager.add_file("s3", _file("h", "a.png", 3))
    assert manager.held_bytes() == 9 * MB


def test_files_no_uploader_claimed_go_after_the_next_full_run_that_began_after_them(manager):
    manager.add_file("s", _file("kept", "a.png", 1))
    manager.add_file("s", _file("junk", "b.png", 1))
    clock.pass_(0.25)  # older than the grace
    manager.add_file("s", _file("fresh", "c.png", 1))  # PUT just before the run: its claim may be the next rerun's
    manager.run_started("s")
    assert [f.file_id for f in manager.get_files("s", ["kept"])] == ["kept"]  # the uploader's widget claims it
    manager.add_file("s", _file("late", "d.png", 1))  # PUT while the run is under way: this run can't claim it
    manager.run_finished("s", completed=True)
    assert manager.unclaimed("s") == ["fresh", "late"]  # "junk" went at once
    clock.pass_(0.25)
    manager.run_started("s")
    manager.run_finished("s", completed=True)  # the next full run didn't claim them either
    assert manager.unclaimed("s") == []
    assert manager.held_bytes("s") == 1 * MB  # "kept" only


def test_a_claim_made_before_the_run_lasts_for_every_later_run(manager):
    """An uploader with on_change reads its files while Streamlit dispatches callbacks, before the script (and
    `run_started`) begins, and later runs reuse that value without reading again: the file must stay through all of
    them (the first version of this budget dropped a student's photo at the first tab click)."""
    manager.add_file("s", _file("photo", "photo.png", 1))
    clock.pass_(0.25)
    manager.get_files("s", ["photo"])  # the callbacks' read, before the run
    for _ in range(3):  # the run, then two tab clicks: no uploader reads again
        manager.run_started("s")
        manager.run_finished("s", completed=True)
        clock.pass_(0.05)
    assert manager.held_bytes("s") == 1 * MB and manager.unclaimed("s") == []


def test_a_run_that_stopped_early_drops_nothing_and_a_disconnect_only_the_unclaimed(manager):
    manager.add_file("s", _file("a", "a.png", 1))
    manager.add_file("s", _file("held", "h.png", 1))
    manager.get_files("s", ["held"])
    clock.pass_(0.25)
    manager.run_started("s")
    manager.run_finished("s", completed=False)  # a rerun asked for mid-run: not every uploader was drawn
    assert manager.held_bytes("s") == 2 * MB
    manager.remove_unclaimed("s")  # the browser went away: what no uploader holds goes now
    assert manager.held_bytes("s") == 1 * MB
    manager.remove_session_files("s")  # the reconnect window closed
    assert manager.held_bytes() == 0


def test_limits_follow_the_pages_numbers(monkeypatch):
    from dashboard import image_sets, models
    from dashboard.image_choice import MAX_IMAGE_MB
    from dashboard.views.attention import MAX_BATCH_IMAGES

    assert limits_of_the_app.BATCH_IMAGES_HELD == MAX_BATCH_IMAGES
    monkeypatch.setenv("VIT_LENS_WEIGHTS_UPLOADS", "off")
    off = limits_of_the_app.upload_limits(memory_bytes=8 * 2**30)
    assert (off.server_mb, off.image_bytes, off.weights_bytes) == (MAX_IMAGE_MB, MAX_IMAGE_MB * MB, 0)
    assert off.zip_bytes == image_sets.upload_limit_mb(off.server_mb) * MB  # what the Many images page says
    assert off.file_cap("w.safetensors") == 0 and off.file_cap("x.JPG") == MAX_IMAGE_MB * MB
    monkeypatch.setenv("VIT_LENS_WEIGHTS_UPLOADS", "on")
    on = limits_of_the_app.upload_limits(memory_bytes=64 * 2**30)
    assert on.server_mb == models.MAX_WEIGHTS_MB and on.file_cap("w.pth") == models.MAX_WEIGHTS_MB * MB
    assert on.file_cap("l.txt") == models.MAX_LABELS_MB * MB and on.zip_bytes == image_sets.MAX_ZIP_MB * MB
    assert on.total_bytes == uploads.MAX_UPLOADS_TOTAL_MB * MB and on.session_bytes <= on.total_bytes
    assert limits_of_the_app.upload_limits(memory_bytes=2**30).total_bytes == on.session_bytes  # never under one session


def test_the_docs_say_the_budgets_enforced(monkeypatch):
    from conftest import REPO

    text = (REPO / "docs" / "serving.md").read_text()
    for weights in ("on", "off"):
        monkeypatch.setenv("VIT_LENS_WEIGHTS_UPLOADS", weights)
        assert f"{limits_of_the_app.upload_limits().session_bytes // MB} MB" in text
    assert f"{uploads.MIN_UPLOADS_TOTAL_MB} MB to {uploads.MAX_UPLOADS_TOTAL_MB // 1024} GB" in text
