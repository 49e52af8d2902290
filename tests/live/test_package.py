"""The package as a user gets it: a wheel built from the sources, installed (not editable) into a
scratch virtual environment, and its `vit-lens` command run from a directory that has nothing to do
with the repository.

The scratch environment has no copy of torch & co.: a .pth file lends it the test environment's
site-packages, which Python appends after the environment's own (and whose own .pth files, such as
the editable install's import hook, are not run), so `vit_core` and `dashboard` come from the wheel.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import socket
import subprocess
import sys
import time
import venv
import zipfile
from pathlib import Path

import numpy as np
import pytest
import requests

from conftest import REPO, drawn_image
from tools import loadtest

SOURCES = ("pyproject.toml", "README.md", "vit_core", "dashboard")  # what the build reads
NOT_SHIPPED = ("tools", "tests")  # beside them in a checkout: the build must leave them out
ASSETS = ("model.safetensors", "config.json", "labels.txt", "MODEL_CARD.md")
SETTINGS = "dashboard/.streamlit/config.toml"


def _run(*args, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=180, **kwargs)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel of the current sources, built offline from a copy (the build leaves nothing in the checkout)."""
    source = tmp_path_factory.mktemp("source")
    for name in SOURCES + NOT_SHIPPED:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "artifacts"))
        else:
            shutil.copy2(REPO / name, source / name)
    out = tmp_path_factory.mktemp("wheel")
    _run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-index", "--no-build-isolation",
         "--wheel-dir", out, source)
    (built,) = out.glob("vit_lens-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """bin/ of a scratch venv with the wheel installed in it (a real install, not an editable one)."""
    env = tmp_path_factory.mktemp("venv")
    venv.create(env, with_pip=False)
    scratch_site = Path(_run(env / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))")
                        .stdout.strip())
    (scratch_site / "test-env-deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    _run(sys.executable, "-m", "pip", "--python", env / "bin" / "python", "install", "--quiet", "--no-deps",
         "--no-index", wheel)
    return env / "bin"


def test_wheel_holds_both_packages_the_bundled_model_the_settings_and_the_command(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        settings = z.read(SETTINGS)
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        scripts = z.read(entry_points).decode()
    modules = {p.relative_to(REPO).as_posix() for package in ("vit_core", "dashboard") for p in (REPO / package).rglob("*.py")}
    assert {"vit_core/__main__.py", "vit_core/teaching/__init__.py", "dashboard/app.py", "dashboard/cli.py"} <= modules
    assert modules <= names  # every module of both packages, subpackages included
    assert {f"vit_core/assets/shapes_vit/{name}" for name in ASSETS} <= names
    bundled = REPO / "vit_core" / "assets" / "shapes_concepts"  # the Concepts tab's concepts and their drawings
    assert {p.relative_to(REPO).as_posix() for p in bundled.rglob("*") if p.is_file()} <= names
    assert settings == (REPO / SETTINGS).read_bytes()  # the one copy of the server settings
    assert "vit-lens = dashboard.cli:main" in scripts
    assert not any(n.startswith(tuple(f"{folder}/" for folder in (*NOT_SHIPPED, "scripts"))) for n in names)


def test_installed_vit_lens_analyze_runs_the_bundled_model_from_anywhere(installed, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    drawn_image(5).save(elsewhere / "scene.png")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["HF_HUB_OFFLINE"] = "1"  # the bundled model needs no hub at all
    where = _run(installed / "python", "-c", "from importlib.util import find_spec as f; print(f('vit_core').origin, "
                 "f('dashboard').origin)", cwd=elsewhere, env=env).stdout.split()  # found, not imported: no torch import
    assert all(Path(p).is_relative_to(installed.parent) for p in where), where  # the wheel's copy, not the checkout

    _run(installed / "vit-lens", "analyze", "scene.png", "--model", "vit-lens/shapes-vit", "--out", "results",
         cwd=elsewhere, env=env)
    arrays = np.load(elsewhere / "results" / "scene.npz")
    bundled = json.loads((REPO / "vit_core" / "assets" / "shapes_vit" / "config.json").read_text())["model_args"]
    side, grid = bundled["img_size"], bundled["img_size"] // bundled["patch_size"]
    assert arrays["input_image"].shape == (side, side, 3) and arrays["grid"].tolist() == [grid, grid]
    summary = json.loads((elsewhere / "results" / "scene.json").read_text())
    assert summary["model"] == "vit-lens/shapes-vit" and summary["weights"].startswith("bundled")
    assert len(summary["topk"]) == 5 and summary["topk"][0]["index"] == int(np.argmax(arrays["probs"]))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _new_session_config(url: str):
    """The `Config` of the NewSession message the server sends a page when its first run starts."""
    from streamlit.proto.BackMsg_pb2 import BackMsg
    from streamlit.proto.ForwardMsg_pb2 import ForwardMsg
    from websockets.sync.client import connect

    with connect("ws" + url[len("http"):] + "/_stcore/stream", subprotocols=["streamlit"], origin=url,
                 max_size=None, open_timeout=30) as ws:
        rerun = BackMsg()
        rerun.rerun_script.query_string = ""
        ws.send(rerun.SerializeToString())
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            msg = ForwardMsg()
            msg.ParseFromString(ws.recv(timeout=deadline - time.monotonic()))
            if msg.WhichOneof("type") == "new_session":
                return msg.new_session.config
    raise AssertionError("no NewSession message within 30 s")


def _assert_huge_pages_where_possible(pid: int, env: dict[str, str]) -> None:
    """The server process `pid` runs with glibc's huge-page tunable exactly where dashboard.server.launch says it should."""
    import platform

    from dashboard.server import launch

    try:
        thp_mode = launch.THP_MODE_FILE.read_text()
    except OSError:
        thp_mode = ""
    expected = launch.huge_pages_environment(env, thp_mode, platform.libc_ver()[0])
    if sys.platform != "linux":
        return
    running = dict(v.split(b"=", 1) for v in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if b"=" in v)
    got = running.get(b"GLIBC_TUNABLES", b"").decode()
    assert got == (env if expected is None else expected).get("GLIBC_TUNABLES", ""), (got, thp_mode)


def _assert_fast_event_loop(pid: int) -> None:
    """The server process `pid` runs its event loop on uvloop and parses HTTP with httptools (both dependencies on
    Linux, see pyproject.toml): Streamlit and uvicorn pick them only when importable, and fall back silently."""
    if sys.platform != "linux":
        return
    mapped = Path(f"/proc/{pid}/maps").read_text()
    assert "/uvloop/" in mapped, "the server runs on asyncio's own event loop, not uvloop"
    assert "/httptools/" in mapped, "the server parses HTTP in Python (h11), not with httptools"


def test_installed_vit_lens_dashboard_serves_with_the_project_settings_from_anywhere(installed, tmp_path):
    from streamlit.proto.NewSession_pb2 import Config

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("STREAMLIT_")}
    # huge pages asked for (off by default): where this machine has them, the server starts itself again
    env.update(HF_HUB_OFFLINE="1", VIT_LENS_MODEL="vit-lens/shapes-vit", VIT_LENS_HUGE_PAGES="on")
    log = (tmp_path / "server.log").open("w")
    # A user flag for one setting the package also sets: the flag must win, the other settings stay.
    server = subprocess.Popen([str(installed / "vit-lens"), "dashboard", "--server.port", str(port),
                               "--server.address", "127.0.0.1", "--client.toolbarMode", "minimal"],
                              cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300  # generous: a busy machine's start took over 60 s
        while True:
            assert server.poll() is None, (tmp_path / "server.log").read_text()
            try:
                if requests.get(f"{url}/_stcore/health", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            assert time.monotonic() < deadline, (tmp_path / "server.log").read_text()
            time.sleep(0.3)
        config = _new_session_config(url)
        # Streamlit's defaults are gatherUsageStats = true and toolbarMode = "auto"; the package's file says
        # false and "viewer"; the command line said "minimal" (and reached the server through its restart with
        # huge pages, where this machine has them).
        assert config.gather_usage_stats is False
        assert config.toolbar_mode == Config.ToolbarMode.MINIMAL
        _assert_huge_pages_where_possible(server.pid, env)
        _assert_fast_event_loop(server.pid)
    finally:
        loadtest.stop_server(server)
        log.close()
    output = (tmp_path / "server.log").read_text()
    assert "Traceback" not in output, output
