"""The dashboard's modules that hold no Streamlit state, tested without a running Streamlit; and which module owns
the caches, the session state and Streamlit's private API."""

from __future__ import annotations

import concurrent.futures
import io
import itertools
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from PIL import Image

from conftest import COMMAND_TIMEOUT
from dashboard import examples, models, serve
from dashboard.image_choice import PREVIEW_MAX_SIDE, check_file_size, preview_copy
from dashboard.server import launch, process, streamlit_internals, uploads
from support import shared_runtime
from vit_core import ImageError, OfflineError, settings
from vit_core.loading import TEACHING_MODEL
from vit_core.loading.model import Geometry

PLAIN_MODULES = ("examples", "figure_keys", "figures", "figures.base", "figures.pipeline", "figures.embeddings",
                 "figures.attention", "figures.prediction", "figures.why", "figures.interventions", "figures.lens",
                 "figures.registers", "figures.many_images", "image_choice", "image_sets", "models", "server",
                 "server.byte_budget", "server.launch", "server.process", "serve", "server.uploads")


def test_the_plain_modules_do_not_import_streamlit():
    imports = "; ".join(f"import dashboard.{name}" for name in PLAIN_MODULES)
    code = f"import sys; {imports}; print('streamlit' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_examples_are_images_and_the_teaching_model_opens_on_a_shape():
    for name in examples.example_names()[:3]:
        image = Image.open(io.BytesIO(examples.example_bytes(name)))
        assert image.size[0] >= 64 and image.mode in ("RGB", "L")
    assert examples.default_example("vit_base_patch16_224") == examples.GRACE_HOPPER
    assert examples.default_example(TEACHING_MODEL).startswith(examples.SHAPE_PREFIX)
    assert examples.example_bytes(examples.SYNTHETIC_SCENE) == examples.synthetic_scene()


def test_stored_uploads_are_named_by_digest_and_written_once(tmp_path):
    path, digest = uploads.store(b"weights", ".SafeTensors", folder=tmp_path)
    assert path == str(tmp_path / f"{digest[:32]}.safetensors")
    os.utime(path, (1000, 1000))
    assert uploads.store(b"weights", ".safetensors", folder=tmp_path) == (path, digest)
    assert os.stat(path).st_mtime == 1000  # not written again
    assert [f.name for f in tmp_path.iterdir()] == [os.path.basename(path)]  # no .part left behind


def test_saved_weights_uploads_are_pruned_oldest_first(tmp_path):
    for i in range(5):
        (tmp_path / f"old{i}.safetensors").write_bytes(b"x" * 1000)
        os.utime(tmp_path / f"old{i}.safetensors", (1000 + i, 1000 + i))
    (tmp_path / "busy.part").write_bytes(b"x" * 1000)  # another session is writing it
    new = tmp_path / "new.safetensors"
    new.write_bytes(b"x" * 1000)
    uploads.prune(tmp_path, keep=new, max_bytes=3000)
    assert sorted(f.name for f in tmp_path.iterdir()) == ["busy.part", "new.safetensors", "old3.safetensors", "old4.safetensors"]


def test_a_failed_model_load_is_remembered_for_a_while():
    now = [0.0]
    memory = models.FailureMemory(seconds=60, clock=lambda: now[0])
    error = OfflineError("no network")
    memory.remember(("a",), error)
    now[0] = 59.0
    assert memory.recent(("a",)) is error and memory.recent(("b",)) is None
    now[0] = 60.0
    assert memory.recent(("a",)) is None
    memory.remember(("b",), error)  # forgets the expired one
    assert list(memory._failures) == [("b",)]


def test_model_requests_key_the_weights_they_load(monkeypatch):
    monkeypatch.delenv("VIT_LENS_RANDOM_INIT", raising=False)
    assert models.ModelRequest("vit_small_patch16_224").key == "vit_small_patch16_224|pretrained"
    assert models.ModelRequest("vit_small_patch16_224", "/tmp/w.safetensors", weights_id="abc").key == "vit_small_patch16_224|abc"
    monkeypatch.setenv("VIT_LENS_RANDOM_INIT", "1")
    assert models.ModelRequest("vit_small_patch16_224").key == "vit_small_patch16_224|random"
    assert not models.ModelRequest(models.TEST_TINY).random_init  # random anyway: not forced
    monkeypatch.setenv("VIT_LENS_MODEL", models.TEST_TINY)
    assert list(models.model_choices())[0] == models.TEST_TINY


@pytest.mark.parametrize("value, forced", [("", False), ("0", False), ("off", False), ("no", False), ("false", False),
                                           ("1", True), ("on", True), ("yes", True), ("TRUE", True)])
def test_random_init_is_forced_only_when_the_setting_is_on(monkeypatch, value, forced):
    """$VIT_LENS_RANDOM_INIT read as every flag is (vit_core.settings): `off` used to count as on."""
    monkeypatch.setenv("VIT_LENS_RANDOM_INIT", value)
    assert models.random_init_forced() is forced
    assert models.ModelRequest("vit_small_patch16_224").random_init is forced
    assert models.ModelRequest("vit_small_patch16_224").key.endswith("|random" if forced else "|pretrained")


def test_the_test_model_is_tiny_and_random():
    loaded = models.build_named_model(models.TEST_TINY)
    g = loaded.geometry
    assert (g.num_layers, g.embed_dim, g.grid) == (2, 192, (14, 14)) and loaded.weights.startswith("random init")


def test_an_image_file_over_the_cap_is_refused_before_decoding():
    with pytest.raises(ImageError, match="limited to 25 MB"):
        check_file_size(b"\0" * (25 * 2**20 + 1))


def test_the_preview_keeps_small_pictures_and_shrinks_large_ones():
    small = Image.new("RGB", (300, 200))
    assert preview_copy(small) is small
    preview = preview_copy(Image.new("RGB", (4000, 3000)))
    assert preview.size == (PREVIEW_MAX_SIDE, PREVIEW_MAX_SIDE * 3 // 4)


def test_default_query_token_is_the_class_token_else_the_centre_patch():
    from dashboard.views.attention import default_query_token
    from dashboard.views.embeddings import geometry_at

    args = dict(img_size=(224, 224), patch_size=(32, 32), grid=(7, 7), no_embed_class=False, has_pos_embed=True,
                num_layers=1, num_heads=1, embed_dim=8, num_classes=0)
    assert default_query_token(Geometry(prefix_names=("CLS",), **args)) == 0
    assert default_query_token(Geometry(prefix_names=(), **args)) == 24  # row 3, col 3 of 7 x 7
    wider = geometry_at(Geometry(prefix_names=(), **args), (4, 6))
    assert wider.center_patch == 2 * 6 + 3 and wider.img_size == (128, 192)


@pytest.mark.parametrize("traced, interval", [("on", 0.002), ("off", 0.0005)])
def test_the_server_process_runs_passes_at_once_and_hands_the_gil_over_often(traced, interval):
    """dashboard.server.process sets what a server of many sessions needs, in its own process (a subprocess here:
    the settings are process-wide): torch's threads, two capture passes at once on 2 threads, the traced forward
    unless turned off, and a GIL switch every 2 ms with it (it needs the GIL only to start and end), every
    0.5 ms without (an eager forward needs it between operations)."""
    code = ("import sys, torch; from dashboard.server import process; from vit_core import serving; "
            "process.prepare_process(); "
            "print(torch.get_num_threads(), serving.parallel_passes(), serving.traced_forward_enabled(), "
            "sys.getswitchinterval())")
    env = {**os.environ, "VIT_LENS_THREADS": "2", "VIT_LENS_TRACED_FORWARD": traced}
    env.pop("VIT_LENS_PARALLEL_PASSES", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    threads, passes, enabled, got = out.stdout.split()
    assert (int(threads), int(passes), enabled, float(got)) == (2, 2, str(traced == "on"), interval)


def test_the_server_runs_no_full_garbage_collection_after_every_run():
    """Streamlit's runner.postScriptGC (a gc.collect(2) after each run) holds the GIL for the whole collection:
    under 30 students' uploads it was the largest single holder of it, stalling every forward pass."""
    import tomllib

    config = tomllib.loads((Path(models.__file__).parent / ".streamlit" / "config.toml").read_text())
    assert config["runner"]["postScriptGC"] is False


def _nice_of_this_thread() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


@pytest.mark.skipif(sys.platform != "linux", reason="threads have nice values of their own on Linux")
def test_a_thread_is_lowered_by_a_step_from_the_process_once_however_often_and_wherever_it_was_started():
    """A pool's worker inherits the nice value of the thread that started it: lowered from a lowered thread, or
    lowered twice, it ends where one lowering from the process puts it."""
    from vit_core.serving import lower_this_threads_priority

    here = _nice_of_this_thread()

    def lowered_twice_then_a_thread_of_its_own() -> tuple[int, int]:
        lower_this_threads_priority(3)
        lower_this_threads_priority(3)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:  # started by this lowered thread
            child = pool.submit(lambda: (lower_this_threads_priority(3), _nice_of_this_thread())[1]).result()
        return _nice_of_this_thread(), child

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        assert pool.submit(lowered_twice_then_a_thread_of_its_own).result() == (min(19, here + 3),) * 2
    assert _nice_of_this_thread() == here


@pytest.mark.skipif(sys.platform != "linux", reason="the kernel's thread names are Linux's /proc")
def test_a_lane_carries_its_name_where_a_measurement_from_outside_reads_it():
    """The class load test reads the server's CPU by thread from /proc: a lane is named there (15 characters at most)
    and lowered, and the thread that made it keeps its own name and priority."""
    from vit_core.serving.priority import FORWARD_LANE_NAME, become_a_lane

    def kernel_name() -> str:
        return Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text().strip()

    here, own_name = _nice_of_this_thread(), kernel_name()
    with concurrent.futures.ThreadPoolExecutor(1, initializer=become_a_lane, initargs=(FORWARD_LANE_NAME, 3)) as pool:
        assert pool.submit(lambda: (kernel_name(), _nice_of_this_thread())).result() == (FORWARD_LANE_NAME, min(19, here + 3))
    with concurrent.futures.ThreadPoolExecutor(1, initializer=become_a_lane, initargs=("a-name-longer-than-15", 0)) as pool:
        assert pool.submit(kernel_name).result() == "a-name-longer-t"
    assert (kernel_name(), _nice_of_this_thread()) == (own_name, here)


@pytest.mark.skipif(sys.platform != "linux", reason="threads have nice values of their own on Linux")
def test_a_download_made_on_click_runs_below_the_pages_and_the_forward_lanes():
    """The `.npz` exports are made on a download lane: another thread, at a nice value the pages' threads and the
    forward lanes (vit_core.serving) are above, so a class's downloads take only the cores new images leave."""
    from vit_core import serving

    here = _nice_of_this_thread()
    tid, nice = process.low_priority(lambda: (threading.get_native_id(), _nice_of_this_thread()))()
    assert tid != threading.get_native_id() and _nice_of_this_thread() == here
    assert nice == min(19, here + process.DOWNLOAD_LANE_NICENESS)
    assert process.DOWNLOAD_LANE_NICENESS > serving.FORWARD_LANE_NICENESS

    def broken() -> bytes:
        raise ValueError("no such layer")

    with pytest.raises(ValueError, match="no such layer"):  # the caller (Streamlit) sees the failure
        process.low_priority(broken)()


@pytest.mark.skipif(sys.platform != "linux", reason="threads have nice values of their own on Linux")
def test_a_run_that_makes_a_new_capture_finishes_below_the_pages_and_one_that_finds_it_cached_does_not(tiny_env,
                                                                                                     monkeypatch):
    """A new image's figures come after other students' control changes (dashboard.server.process,
    NEW_IMAGE_RUN_NICENESS): the thread whose run made the capture ends at that nice value, the run that finds the
    capture cached keeps the pages' priority, and the main thread is never lowered. (The tiny model stands in for a
    large one: a light model's run is not lowered, tests/unit/test_light_pass.py.)"""
    from concurrent.futures import ThreadPoolExecutor

    from conftest import drawn_image, encoded
    from dashboard import caches
    from dashboard.models import TEST_TINY, ModelRequest
    from vit_core import serving

    monkeypatch.setattr(serving, "light_pass", lambda loaded: False)

    request = ModelRequest(TEST_TINY)
    loaded = caches.load(request)
    image = caches.decode("only_this_test.png", encoded(drawn_image(seed=4242)))

    def a_run() -> tuple[object, int]:
        return caches.shared_capture(request, loaded, image), _nice_of_this_thread()

    def on_a_new_thread() -> tuple[object, int]:
        with ThreadPoolExecutor(1) as pool:  # a new thread, as Streamlit starts for a session's runs
            return pool.submit(a_run).result()

    here = _nice_of_this_thread()
    made, made_at = on_a_new_thread()
    found, found_at = on_a_new_thread()
    assert found is made
    assert made_at == min(19, here + process.NEW_IMAGE_RUN_NICENESS) and process.NEW_IMAGE_RUN_NICENESS > 0
    assert found_at == here
    process.new_image_turn.made_a_capture()
    assert _nice_of_this_thread() == here


def _figures_of_runs_in_threads(runs: list[tuple[bool, float]]) -> list[tuple[float, float]]:
    """Each (made a capture, seconds its figures take) on a thread of its own, started together: when each one's
    figures began and ended (time.monotonic)."""
    start = threading.Barrier(len(runs))

    def a_run(made_a_capture: bool, figure_seconds: float) -> tuple[float, float]:
        if made_a_capture:
            process.new_image_turn.made_a_capture()
        start.wait()
        with process.new_image_turn:
            began = time.monotonic()
            time.sleep(figure_seconds)
            return began, time.monotonic()

    with concurrent.futures.ThreadPoolExecutor(len(runs)) as pool:
        return list(pool.map(lambda run: a_run(*run), runs))


def test_new_images_figures_are_drawn_one_run_at_a_time_and_a_cached_run_never_waits():
    """Three runs that made captures draw their figures one after another; a run that found its capture cached
    (a control change) draws at once, beside them."""
    spans = _figures_of_runs_in_threads([(True, 0.3), (True, 0.3), (True, 0.3), (False, 0.0)])
    new_images, cached = sorted(spans[:3]), spans[3]
    assert all(earlier[1] <= later[0] for earlier, later in itertools.pairwise(new_images))
    assert cached[0] < new_images[0][1]  # did not wait for the first turn to end


def test_a_run_waits_for_its_turn_only_so_long_and_a_run_that_raises_gives_the_turn_back(monkeypatch):
    monkeypatch.setattr(process, "NEW_IMAGE_TURN_WAIT_S", 0.2)
    turn_taken, done = threading.Event(), threading.Event()

    def a_long_run() -> None:
        process.new_image_turn.made_a_capture()
        with process.new_image_turn:
            turn_taken.set()
            done.wait(timeout=10)

    def a_run_after_it() -> float:
        turn_taken.wait(timeout=10)
        process.new_image_turn.made_a_capture()
        asked = time.monotonic()
        with process.new_image_turn:
            return time.monotonic() - asked

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        long_run, waited = pool.submit(a_long_run), pool.submit(a_run_after_it)
        assert 0.2 <= waited.result(timeout=10) < 5  # not until the long run ends
        done.set()
        long_run.result()

    process.new_image_turn.made_a_capture()
    with pytest.raises(RuntimeError, match="a figure failed"), process.new_image_turn:
        raise RuntimeError("a figure failed")
    assert process.new_image_turn._turn.acquire(timeout=0)  # given back
    process.new_image_turn._turn.release()


THP_MADVISE = "always [madvise] never\n"
ON = {settings.HUGE_PAGES.name: "on"}  # asked for: huge pages are off by default


@pytest.mark.parametrize("env, thp_mode, libc, tunables", [
    (ON, THP_MADVISE, "glibc", launch.HUGE_PAGES_TUNABLE),
    (ON, "[always] madvise never\n", "glibc", launch.HUGE_PAGES_TUNABLE),
    ({**ON, "GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, THP_MADVISE, "glibc",
     f"glibc.malloc.arena_max=2:{launch.HUGE_PAGES_TUNABLE}"),
    ({**ON, "GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, THP_MADVISE, "glibc", None),  # someone's own choice: kept
    ({settings.HUGE_PAGES.name: "off"}, THP_MADVISE, "glibc", None),
    ({}, THP_MADVISE, "glibc", None),  # not asked for: glibc's default
    (ON, "always madvise [never]\n", "glibc", None),  # the kernel gives none
    (ON, "", "glibc", None),  # no transparent huge pages in this kernel
    (ON, THP_MADVISE, "", None),  # not glibc (musl, say): the tunable means nothing
])
def test_the_server_restarts_with_huge_pages_only_where_malloc_can_get_them(env, thp_mode, libc, tunables):
    got = launch.huge_pages_environment({"PATH": "/bin", **env}, thp_mode, libc)
    assert (None if got is None else got["GLIBC_TUNABLES"]) == tunables
    if got is not None:
        assert got["PATH"] == "/bin"  # the rest of the environment as it was


# A server stopped while its warm-up still runs, in the order a real stop takes: Streamlit's server returns at once,
# the interpreter's exit closes the forward lanes (concurrent.futures' exit hook), and only then does the warm-up ask
# them for its forward. A non-daemon thread keeps the interpreter alive until the warm-up has logged.
STOPPED_MID_WARM_UP = """
import concurrent.futures.thread as executor_threads, sys, threading, time
from dashboard import caches
from dashboard import serve
from streamlit.web import cli as streamlit_cli
from vit_core import serving

streamlit_cli.main = lambda: 0  # the server stops as soon as it starts
serving.light_pass = lambda loaded: False  # the Shapes ViT's warm-up on a forward lane, as a large model's
real_load = caches.load

def load_once_the_lanes_are_closed(request):
    while not executor_threads._shutdown:  # the flag their exit hook sets; then submit() refuses
        time.sleep(0.01)
    return real_load(request)

caches.load = load_once_the_lanes_are_closed
real_thread_start = threading.Thread.start

def start(self):
    real_thread_start(self)
    if self.name == "vit-lens-warm-up":
        threading.Thread(target=self.join, name="wait-for-the-warm-up").start()

threading.Thread.start = start
serve.main(["--server.headless", "true"], whole_process=False)
"""


@pytest.mark.live  # starts the server's entry point (serve.main) in a process of its own
def test_a_server_stopped_mid_warm_up_logs_one_line_not_a_traceback(tmp_path):
    """Ctrl+C a second after the start (the installed-dashboard test stops its server that soon): the forward lanes
    refuse the warm-up's forward, and that is one line in the log, not a traceback."""
    env = {**os.environ, "VIT_LENS_MODEL": TEACHING_MODEL, "HF_HUB_OFFLINE": "1"}
    run = subprocess.run([sys.executable, "-c", STOPPED_MID_WARM_UP], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=COMMAND_TIMEOUT)
    assert run.returncode == 0, run.stderr
    assert "warm-up cut short: the server stopped" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr, run.stderr


def test_a_warm_up_that_fails_while_the_server_runs_logs_its_traceback(monkeypatch, caplog):
    from dashboard import caches

    def refused(request):
        raise RuntimeError("cannot schedule new futures after interpreter shutdown")

    monkeypatch.setattr(caches, "load", refused)
    monkeypatch.setattr(process, "freeze_long_lived_heap", lambda: None)  # pytest's heap stays collectable
    monkeypatch.setattr(serve, "server_stopped", threading.Event())  # a server still running
    with caplog.at_level("INFO", logger="vit_lens.serve"):
        serve.warm_up()
    assert [r.getMessage() for r in caplog.records if r.exc_info] == ["warm-up failed"]


def test_a_made_download_outlives_two_sweeps_for_a_while_then_goes(monkeypatch):
    """Streamlit drops a file a download button made on click at the second sweep after it was made, and every
    session's every run ends with a sweep: in a class the fetch came too late (HTTP 404). Kept MADE_DOWNLOAD_GRACE_S.
    (Streamlit's media-file manager is driven here as the server drives it: checked on the pinned version only.)"""
    reason = shared_runtime.unchecked_reason("this test of the made-download patch")
    if reason is not None:
        pytest.skip(reason)
    from streamlit.runtime import media_file_manager
    from streamlit.runtime.media_file_manager import MediaFileManager
    from streamlit.runtime.memory_media_file_storage import MemoryMediaFileStorage

    monkeypatch.setattr(media_file_manager, "MediaFileMetadata", media_file_manager.MediaFileMetadata)  # undone after
    streamlit_internals.shelve_made_downloads.cache_clear()
    assert streamlit_internals.shelve_made_downloads() is True
    now = [1000.0]
    monkeypatch.setattr(streamlit_internals.time, "monotonic", lambda: now[0])
    storage = MemoryMediaFileStorage("/media")
    manager = MediaFileManager(storage)
    placeholder = manager.add_deferred(lambda: b"the export", "application/zip", "coords", "x.npz")
    manager.add(b"a figure", "image/png", "figure coords")
    url = manager.execute_deferred(placeholder)
    made = url.rsplit("/", 1)[1].split(".")[0]
    manager.clear_session_refs()  # the session's next run shows neither
    manager.remove_orphaned_files()
    manager.remove_orphaned_files()
    assert storage.get_file(made).content == b"the export"  # Streamlit's own rule: gone by now
    assert len(storage._files_by_id) == 1  # the figure went at the first sweep, as before
    now[0] += streamlit_internals.MADE_DOWNLOAD_GRACE_S
    manager.remove_orphaned_files()
    assert not storage._files_by_id
    streamlit_internals.shelve_made_downloads.cache_clear()


class _Finalised:
    """Cyclic garbage with a finaliser: the collector runs Python code mid-allocation, so threads switch there."""

    def __del__(self):
        sum(range(2000))


def test_threads_parsing_python_at_once_take_turns_in_tests():
    """CPython 3.11 counts AST depth once per interpreter: threads that build ASTs at once (a session's compile,
    another's traceback underlining a frame) can fail with "AST constructor recursion depth mismatch", as a
    classroom test did in CI. With the collector running finalisers inside ast.parse, four threads reproduce it
    unpatched within a second; in tests (conftest) every ast.parse takes its turn, so none may fail."""
    import ast
    import gc

    if shared_runtime.unchecked_reason("compiles_take_turns") is not None:
        pytest.skip(shared_runtime.unchecked_reason("compiles_take_turns"))
    source, errors = (DASHBOARD / "app.py").read_text(), []
    thresholds = gc.get_threshold()
    gc.set_threshold(50, 1, 1)
    try:

        def parse_while_collecting() -> None:
            end = time.monotonic() + 1.5
            while time.monotonic() < end and not errors:
                for _ in range(20):
                    garbage = _Finalised()
                    garbage.cycle = garbage
                try:
                    ast.parse(source)
                except SystemError as error:
                    errors.append(error)

        threads = [threading.Thread(target=parse_while_collecting) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        gc.set_threshold(*thresholds)
        gc.collect()
    assert errors == []


def test_on_another_streamlit_the_server_patches_nothing_and_says_so_once(monkeypatch, caplog):
    """Streamlit's internals are used only on the minor version they were checked on (pyproject pins it): on any
    other the made-download patch is skipped with one warning in the log, and the tests' uses refuse with the reason."""
    import streamlit
    from streamlit.runtime import media_file_manager

    original = media_file_manager.MediaFileMetadata
    monkeypatch.setattr(media_file_manager, "MediaFileMetadata", original)  # undone after, whatever happens
    monkeypatch.setattr(streamlit, "__version__", "1.99.0")
    streamlit_internals.shelve_made_downloads.cache_clear()
    try:
        with caplog.at_level("WARNING", logger=streamlit_internals.__name__):
            assert streamlit_internals.shelve_made_downloads() is False
            assert streamlit_internals.shelve_made_downloads() is False
        assert media_file_manager.MediaFileMetadata is original
        assert len(caplog.records) == 1 and "1.99.0" in caplog.records[0].getMessage()
        reason = shared_runtime.unchecked_reason("the shared AppTest runtime")
        assert reason is not None and "1.67." in reason and "1.99.0" in reason
        with pytest.raises(shared_runtime.UncheckedStreamlit, match="1.99.0"):
            with shared_runtime.shared_apptest_runtime():
                pass
        with pytest.raises(shared_runtime.UncheckedStreamlit, match="1.99.0"):
            shared_runtime.compiles_take_turns()
    finally:
        streamlit_internals.shelve_made_downloads.cache_clear()
    assert streamlit_internals.checked("1.67.3") and not streamlit_internals.checked("1.68.0")


# ----------------------------------------------------------------------------------------------
# Who owns what: one module for the caches, one for the session, one for Streamlit's private API

DASHBOARD = Path(models.__file__).resolve().parent
_STREAMLIT_INTERNALS = re.compile(r"^\s*(from|import)\s+streamlit\.(runtime|components|web\.server|testing\.v1\.app_test)\b"
                                  r"|^\s*from\s+streamlit\s+import\s+config\b|\bapp_test_module\b|\bRuntime\._instance\b",
                                  re.MULTILINE)


def _dashboard_sources() -> dict[str, str]:
    return {p.relative_to(DASHBOARD).as_posix(): p.read_text() for p in sorted(DASHBOARD.rglob("*.py"))}


def test_caches_is_the_one_module_with_streamlit_caches():
    users = {name for name, text in _dashboard_sources().items()
             if re.search(r"\bst\.cache_(resource|data)\s*(\(|$)", text, re.MULTILINE)}
    assert users == {"caches.py"}


def test_session_is_the_one_module_with_session_state():
    users = {name for name, text in _dashboard_sources().items() if re.search(r"\bst\.session_state\b", text)}
    assert users == {"session.py"}


def test_streamlit_internals_is_the_one_place_with_streamlits_private_api():
    """The dashboard and the tests' shared code (conftest, support/) reach Streamlit's private modules only through
    dashboard/server/streamlit_internals.py (the server's) and tests/support/shared_runtime.py (the tests')."""
    tests = Path(__file__).resolve().parent.parent
    sources = {f"dashboard/{name}": text for name, text in _dashboard_sources().items()}
    sources |= {f"tests/{p.relative_to(tests).as_posix()}": p.read_text()
                for p in [tests / "conftest.py", *sorted((tests / "support").glob("*.py"))]}
    users = {name for name, text in sources.items() if _STREAMLIT_INTERNALS.search(text)}
    assert users == {"dashboard/server/streamlit_internals.py", "tests/support/shared_runtime.py"}
    assert "shared_runtime" in sources["tests/conftest.py"]
    assert "streamlit_internals" in sources["tests/support/shared_runtime.py"]  # the pinned version, one place


def test_no_page_imports_itself_and_every_page_gets_the_model_from_the_session():
    """app.py only navigates; each page script takes the sidebar's model the same way (session.chosen_model)."""
    pages = {p.name: p.read_text() for p in (DASHBOARD / "page_scripts").glob("*.py") if p.name != "__init__.py"}
    assert set(pages) == {"one_image.py", "many_images.py", "lesson.py"}
    for name, text in pages.items():
        assert "session.chosen_model()" in text, name
        assert "dashboard.page_scripts" not in text and "__main__" not in text, name
    app = (DASHBOARD / "app.py").read_text()
    assert 'st.Page("page_scripts/one_image.py"' in app and 'url_path="one-image", default=True' in app
    assert 'st.Page("page_scripts/many_images.py"' in app and 'url_path="many-images"' in app


def test_a_weights_file_for_the_teaching_or_tiny_model_is_used_or_refused_never_dropped(tmp_path, tiny):
    """The red team's case: a file of +inf weights for the bundled Shapes ViT showed its own "other (91.4%)"."""
    from safetensors.torch import save_file

    from dashboard import models
    from vit_core.errors import ModelError

    path = tmp_path / "w.safetensors"
    save_file({k: v.contiguous() for k, v in tiny.model.state_dict().items()}, str(path))
    with pytest.raises(ModelError, match="takes no weights file"):
        models.build_model(models.TEACHING_MODEL, str(path), "", False)
    loaded = models.build_model(models.TEST_TINY, str(path), "", False)
    assert loaded.weights == "file: w.safetensors"


@pytest.mark.parametrize("base, expected", [("", "'/'"), ("class/", "'/class/'"), ("/a/b", "'/a/b/'")])
def test_pages_name_the_servers_base_before_streamlits_scripts(base, expected):
    """A page such as /lesson finds its server at the server's base at once (no probe of /lesson/_stcore/health)."""
    from dashboard.server.streamlit_internals import index_html_with_backend_base

    html = '<!doctype html><html><head><script type="module" src="./static/js/index.js"></script></head></html>'
    out = index_html_with_backend_base(html, base)
    assert out.index("BACKEND_BASE_URL") < out.index("index.js")
    assert f"new URL({expected}, window.location.origin)" in out


@pytest.mark.parametrize("link, expected", [
    ({"view": "Attention", "head": "2", "query": "5"}, {"view": "5 Attention", "head": "head 2", "query": "patch 4"}),
    ({"view": "5 Attention", "head": "head 2", "query": "patch 4"}, {}),  # already in labels: nothing to rewrite
    ({"head": "-1"}, {"head": "mean of all heads"}), ({"head": "mean"}, {"head": "mean of all heads"}),
    ({"head": "12"}, {}), ({"head": "-2"}, {}), ({"head": "two"}, {}), ({"query": "197"}, {}),  # left to the widget
    ({"head": "²"}, {}), ({"query": "٣"}, {}), ({"head": "9" * 400}, {}), ({"query": "1e3"}, {}),  # odd links: ignored
])
def test_a_links_other_forms_are_rewritten_to_the_widgets_labels(link, expected):
    from dashboard import session
    from dashboard.views import RENAMED
    from dashboard.views.attention import head_label

    assert session.link_labels(link, RENAMED, head_label, lambda t: f"patch {t - 1}", 12, 197) == expected
