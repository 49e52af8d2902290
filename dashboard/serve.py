"""Start the dashboard server with the slow start-up work done before the first visitor arrives.

    vit-lens dashboard [--device D] [streamlit options]         # the installed command (dashboard/cli.py)
    python -m dashboard.serve [--device D] [streamlit options]  # the same; what `bash scripts/dashboard` runs

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

With weights uploads off (`VIT_LENS_WEIGHTS_UPLOADS=off`, the README's "Serving a class"), the server's own
upload cap drops from the weights size (400 MB) to the image size (25 MB), unless a
`--server.maxUploadSize` option says otherwise: no uploader of any session can then send more.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from pathlib import Path

APP = Path(__file__).resolve().parent / "app.py"  # the installed copy, wherever the package lives
_logger = logging.getLogger("vit_lens.serve")


def warm_up() -> None:
    """Fill the shared caches with what the first page needs: the start-up model (or, if it can't be
    had, the fallback), the capture of the default example image, and a first figure (matplotlib's
    fonts and first draw cost about a second)."""
    import vit_core
    from dashboard import examples, figures, models, process, state

    started = time.perf_counter()
    request = models.ModelRequest(vit_core.loading.env_default_model())
    try:
        try:
            loaded = state.load(request)
        except vit_core.ViTLensError as e:
            _logger.warning("start-up model %s unavailable (%s); loading the fallback", request.name, e)
            request = models.fallback_request()[0]
            loaded = state.load(request)
        example = examples.default_example(loaded.name)
        cap = state.shared_capture(request, loaded, state.decode(example, state.example_bytes(example)))
        figures.token_matrix_png(cap.tokens[-1], "warm-up", cap.geometry.num_prefix_tokens)
        import plotly.graph_objects  # noqa: F401 - the first interactive figure
    except vit_core.ViTLensError as e:  # the page will say so
        _logger.warning("warm-up: %s", e)
    except Exception:  # never take the server down from a warm-up; logged, and the page will show it
        _logger.exception("warm-up failed")
    process.freeze_long_lived_heap()  # the libraries, the model and its first capture: see its docstring
    _logger.info("warm-up done in %.1f s", time.perf_counter() - started)


def upload_cap_flags(argv: list[str]) -> list[str]:
    """Streamlit options to add to `argv`: the server-wide upload cap at the image size when no session
    may upload weights (and `argv` sets no cap of its own)."""
    from dashboard.image_choice import MAX_IMAGE_MB
    from dashboard.models import weights_uploads_allowed

    if weights_uploads_allowed() or any(a.startswith("--server.maxUploadSize") for a in argv):
        return []
    return [f"--server.maxUploadSize={MAX_IMAGE_MB}"]


DEVICE_OPTION = "--device"


def split_device_option(argv: list[str]) -> tuple[str | None, list[str]]:
    """(the value of `--device D` / `--device=D`, the other arguments): Streamlit has no such option,
    so it is taken out before the rest goes to `streamlit run`. The last one given wins; "" if it has no
    value (at the end, or followed by another option)."""
    device, rest = None, []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == DEVICE_OPTION:
            has_value = i + 1 < len(argv) and not argv[i + 1].startswith("--")
            device = argv[i + 1] if has_value else ""
            i += 2 if has_value else 1
            continue
        if arg.startswith(DEVICE_OPTION + "="):
            device = arg.split("=", 1)[1]
        else:
            rest.append(arg)
        i += 1
    return device, rest


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    device, argv = split_device_option(argv)
    if device is not None:
        os.environ["VIT_LENS_DEVICE"] = device  # read by dashboard.models.server_device in this process
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import vit_core  # noqa: F401 - torch and timm, imported once for every session
    from dashboard import models, process
    from vit_core.devices import DEVICE_CHOICES, DeviceError, describe_device

    if device is not None and not device.strip():
        raise SystemExit(f"vit-lens dashboard: --device needs a value: {DEVICE_CHOICES}.")
    try:
        _logger.info("models run on %s", describe_device(models.server_device()))
    except DeviceError as e:
        raise SystemExit(f"vit-lens dashboard: {e}") from None  # one line on stderr, exit status 1
    process.configure_torch_threads()  # once per process: the app's own call is then a no-op
    threading.Thread(target=warm_up, name="vit-lens-warm-up", daemon=True).start()
    from streamlit.web import cli

    sys.argv = ["streamlit", "run", str(APP), *argv, *upload_cap_flags(argv)]
    sys.exit(cli.main())


if __name__ == "__main__":
    main()
