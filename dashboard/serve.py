"""Start the dashboard server with the slow start-up work done before the first visitor arrives.

    vit-lens dashboard [--device D] [--concepts DIR ...] [streamlit options]   # the installed command (dashboard/cli.py)
    python -m dashboard.serve [--device D] [--concepts DIR ...] [streamlit options]   # the same

It is `streamlit run <this package's app.py> [streamlit options]`, from any working directory: the
server settings live beside app.py in dashboard/.streamlit/config.toml, which Streamlit reads as the
app's own config file (command-line flags and STREAMLIT_* variables still override it).

`streamlit run dashboard/app.py` imports torch and timm (seconds) inside the first page load, and
loads the start-up model there too. Here the server process imports them first, sets torch's thread
count once from the CPU quota, and loads the start-up model ($VIT_LENS_MODEL, else ViT-B/16) into
the dashboard's shared cache in the background while Streamlit starts, with the capture of the
default example image. Offline, that attempt fails
fast and is remembered (dashboard.models.FailureMemory), so the first page says why at once and shows the
bundled model, which is loaded here too. The start-up model is pinned (dashboard.models.pinned_startup_model).

The models run on one device for the whole server: `--device D` (auto, cpu, cuda, cuda:N or mps) sets
$VIT_LENS_DEVICE (dashboard.models.server_device), checked here before anything starts: a device this
machine doesn't have stops the server with one line, not a traceback on every page.

`--concepts DIR` (again for each folder; or $VIT_LENS_CONCEPTS) names a concept folder the Concepts tabs offer by its
name, beside the bundled ones: a server that others reach takes no path from a page (dashboard.views.concepts).

With weights uploads off (`VIT_LENS_WEIGHTS_UPLOADS=off`, docs/serving.md), the server's own
upload cap drops from the weights size (400 MB) to the image size (25 MB), unless a
`--server.maxUploadSize` option says otherwise: no uploader of any session can then send more.

With `VIT_LENS_HUGE_PAGES=on` (Linux with glibc), the server first starts itself again with glibc's malloc asking
for transparent huge pages (dashboard.server.launch); by default malloc is left as the C library has it.

Before numpy is imported, OPENBLAS_NUM_THREADS defaults to 1 (numpy's OpenBLAS threads spin against torch's on a
small machine: docs/performance.md, "One BLAS thread"). Settings are read
through `vit_core.settings`, which imports nothing heavy, so the restart happens before torch is imported.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import time
from pathlib import Path

from dashboard.server import launch  # light: no torch, no numpy

APP = Path(__file__).resolve().parent / "app.py"  # the installed copy, wherever the package lives
_logger = logging.getLogger("vit_lens.serve")


server_stopped = threading.Event()  # set when Streamlit's server has returned, before the interpreter shuts down


def warm_up() -> None:
    """Fill the shared caches with what the first page needs: the start-up model (or, if it can't be
    had, the fallback), the capture of the default example image, and a first figure (matplotlib's
    fonts and first draw cost about a second)."""
    import vit_core
    from dashboard import caches, examples, models
    from dashboard.figures import pipeline as pipeline_figures
    from dashboard.server import process
    from vit_core import settings
    from vit_core.runtime import onednn

    started = time.perf_counter()
    request = models.ModelRequest(settings.MODEL.text())
    try:
        try:
            loaded = caches.load(request)
        except vit_core.ViTLensError as e:
            _logger.warning("start-up model %s unavailable (%s); loading the fallback", request.name, e)
            request = models.fallback_request()[0]
            loaded = caches.load(request)
        example = examples.default_example(loaded.name)
        cap = caches.shared_capture(request, loaded, caches.decode(example, caches.example_bytes(example), in_session=False))
        pipeline_figures.token_matrix_png(cap.tokens[-1], "warm-up", cap.geometry.num_prefix_tokens)
        import plotly.graph_objects  # noqa: F401 - the first interactive figure
    except vit_core.ViTLensError as e:  # the page will say so
        _logger.warning("warm-up: %s", e)
    except Exception:  # never take the server down from a warm-up; logged, and the page will show it
        if server_stopped.is_set():  # stopped mid-warm-up (Ctrl+C): the interpreter's exit closed the forward lanes
            _logger.info("warm-up cut short: the server stopped")
            return
        _logger.exception("warm-up failed")
    process.freeze_long_lived_heap()  # the libraries, the model and its first capture: see its docstring
    _logger.info("warm-up done in %.1f s", time.perf_counter() - started)
    _logger.info("%s", onednn.choices_line(onednn.choices()))  # made by the first capture, for a burst's thread count


def offered_concepts() -> list[str]:
    """The names of the concept folders the Concepts tabs offer (the bundled ones, then --concepts and
    $VIT_LENS_CONCEPTS), each folder checked now: one that is not a concepts folder stops the server with one line."""
    from vit_core import settings
    from vit_core.concepts import ConceptsError
    from vit_core.concepts.folders import offered_folders

    try:
        return list(offered_folders(settings.CONCEPTS.text()))
    except ConceptsError as e:
        raise SystemExit(f"vit-lens dashboard: --concepts or {settings.CONCEPTS.name}: {e}") from None


def upload_cap_flags(argv: list[str]) -> list[str]:
    """Streamlit options to add to `argv`: the server-wide upload cap at the image size when no session
    may upload weights (and `argv` sets no cap of its own)."""
    from dashboard.image_choice import MAX_IMAGE_MB
    from dashboard.models import weights_uploads_allowed

    if weights_uploads_allowed() or any(a.startswith("--server.maxUploadSize") for a in argv):
        return []
    return [f"--server.maxUploadSize={MAX_IMAGE_MB}"]


def main(argv: list[str] | None = None, *, whole_process: bool | None = None) -> None:
    """Start the server with `argv` (default: this process's command line). `whole_process` (default: no
    `argv` given) says that this call is all the process is for, so that it may replace itself
    (launch.restart_with_huge_pages): a caller that passes `argv` from elsewhere, a test say, keeps its process."""
    if whole_process is None:
        whole_process = argv is None
    argv = sys.argv[1:] if argv is None else argv
    device, argv = launch.prepare_launch(argv, whole_process)  # before numpy is imported: see the module's docstring
    import vit_core  # noqa: F401 - torch and timm, imported once for every session
    from dashboard import models
    from dashboard.server import process
    from dashboard.upload_limits import upload_limits
    from vit_core.runtime.devices import DEVICE_CHOICES, DeviceError, describe_device

    if device is not None and not device.strip():
        raise SystemExit(f"vit-lens dashboard: --device needs a value: {DEVICE_CHOICES}.")
    try:
        _logger.info("models run on %s", describe_device(models.server_device()))
    except DeviceError as e:
        raise SystemExit(f"vit-lens dashboard: {e}") from None  # one line on stderr, exit status 1
    _logger.info("concepts offered: %s", ", ".join(offered_concepts()) or "none")
    process.prepare_process(upload_limits)  # once per process: the app's own call is then a no-op
    threading.Thread(target=warm_up, name="vit-lens-warm-up", daemon=True).start()
    from streamlit.web import cli

    sys.argv = ["streamlit", "run", str(APP), *argv, *upload_cap_flags(argv)]
    try:
        sys.exit(cli.main())
    finally:
        server_stopped.set()


def run_as_process(argv: list[str]) -> int:
    """The server as all this process is for (`vit-lens dashboard`, `python -m dashboard.serve`, the huge-pages
    restart): its exit status, the one-line message of a refused start, and a quiet end (`_end_quietly`)."""
    status: list[int] = []  # the server's exit status, once it has stopped
    atexit.register(_end_quietly, status)  # before the server imports anything: it runs after their handlers
    try:
        main(argv, whole_process=True)
    except SystemExit as stop:  # how the server returns (Streamlit's own stop on Ctrl-C or SIGTERM included)
        status.append(stop.code if isinstance(stop.code, int) else 0 if stop.code is None else 1)
        raise
    except KeyboardInterrupt:  # Ctrl-C before Streamlit's server has started (it takes Ctrl-C itself after)
        print("vit-lens dashboard: interrupted", file=sys.stderr)
        status.append(130)
        return 130
    return 0


def _end_quietly(status: list[int]) -> None:
    """The server process's last exit handler: once the server has stopped, its threads are joined and the other
    exit handlers have run, the process ends with the server's status before the interpreter tears its modules down.
    That teardown has nothing of ours to write; it is where triton's nanobind bindings (imported with timm, through
    torch) list the objects still alive, some thirty lines of "nanobind: leaked ..." on every stop. After anything
    other than the server's own exit (an uncaught exception: status unknown) the interpreter ends as usual."""
    if not status:
        return
    logging.shutdown()  # registered before this handler, so it would run after it: flushed here instead
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken stream: nothing more can reach it
            pass
    os._exit(status[0])


if __name__ == "__main__":
    sys.exit(run_as_process(sys.argv[1:]))
