"""The server process's first steps, before anything heavy is imported: numpy's BLAS threads, the settings checked,
a restart with transparent huge pages where asked for, the `--device` option taken into the environment, and the
log's format.

Light on purpose (`vit_core.settings` and `vit_core.runtime` import no torch, no numpy): the restart must come before
torch is imported, and numpy's BLAS reads its thread count when it loads (docs/performance.md, "One BLAS thread").
What the process needs once torch is there is `dashboard.server.process`'s.
"""

from __future__ import annotations

import logging
import os
import platform
import sys
from pathlib import Path
from typing import Mapping

from vit_core import settings  # a leaf module: no torch, no numpy
from vit_core.runtime import no_triton_without_a_gpu, one_blas_thread  # light too

SERVER_MODULE = "dashboard.serve"  # what a restart runs again: `python -m dashboard.serve ARGV`


def prepare_launch(argv: list[str], whole_process: bool) -> tuple[str | None, list[str]]:
    """Before numpy and torch are imported: one BLAS thread unless the environment says otherwise, every
    `VIT_LENS_*` setting checked (a bad one stops the server with one line, exit status 1), the process started
    again with huge pages where they are asked for and `whole_process` says it may replace itself, and a
    `--device D` option set as $VIT_LENS_DEVICE (read by dashboard.models.server_device in this process), and the
    log's format set.
    Each `--concepts DIR` is added to $VIT_LENS_CONCEPTS (the concept folders the server offers).
    Returns (the device option's value, None if not given; the other arguments, for `streamlit run`)."""
    one_blas_thread()
    no_triton_without_a_gpu()
    try:
        settings.check_all()
    except settings.SettingError as e:
        raise SystemExit(f"vit-lens dashboard: {e}") from None  # one line on stderr, exit status 1
    if whole_process:
        restart_with_huge_pages(argv)
    device, argv = split_device_option(argv)
    if device is not None:
        os.environ[settings.DEVICE.name] = device
    folders, argv = split_concepts_option(argv)
    if folders:  # added to the setting's own, as absolute paths: the server's working folder is the one they meant
        given = [entry for entry in settings.CONCEPTS.text().split(os.pathsep) if entry]
        os.environ[settings.CONCEPTS.name] = os.pathsep.join([*given, *(os.path.abspath(f) for f in folders)])
    argv = lenses_checked(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return device, argv


# Transparent huge pages for the server's large buffers, on request ($VIT_LENS_HUGE_PAGES=on): they made fresh memory
# 2.7x cheaper on one VM and a student's image 40-110 ms of CPU dearer on the Zen 3 VM CI runs on, where their cost
# depends on what the machine freed before, so no short measurement at start can choose (docs/performance.md, "Huge
# pages off"). glibc (2.35+) reads the setting only when a process starts: with it on, the server
# starts itself again (same process id) with it in the environment.
HUGE_PAGES_TUNABLE = "glibc.malloc.hugetlb=1"  # madvise(MADV_HUGEPAGE) on malloc's own mappings
THP_MODE_FILE = Path("/sys/kernel/mm/transparent_hugepage/enabled")  # "always [madvise] never": [] marks the mode


def huge_pages_environment(env: Mapping[str, str], thp_mode: str, libc: str) -> dict[str, str] | None:
    """The environment to restart the server with so that malloc uses transparent huge pages: `env` with
    GLIBC_TUNABLES extended; None where it is set already, not asked for ($VIT_LENS_HUGE_PAGES off, the default), the C
    library is not glibc (`libc`, as platform.libc_ver() names it) or the kernel's mode (`thp_mode`, the text of
    THP_MODE_FILE, "" if none) gives no huge pages to a program that asks."""
    tunables = env.get("GLIBC_TUNABLES", "")
    off = not settings.HUGE_PAGES.on(env)  # vit_core.settings imports no torch: read before the restart
    if off or "glibc.malloc.hugetlb" in tunables or libc != "glibc" or not ("[always]" in thp_mode or "[madvise]" in thp_mode):
        return None
    return {**env, "GLIBC_TUNABLES": f"{tunables}:{HUGE_PAGES_TUNABLE}" if tunables else HUGE_PAGES_TUNABLE}


def restart_with_huge_pages(argv: list[str]) -> None:
    """Before anything heavy is imported: replace this process by `python -m dashboard.serve ARGV` with
    huge_pages_environment(), where that applies (Linux with glibc); else return and carry on as is."""
    if sys.platform != "linux":
        return
    try:
        thp_mode = THP_MODE_FILE.read_text()
    except OSError:
        thp_mode = ""
    env = huge_pages_environment(os.environ, thp_mode, platform.libc_ver()[0])
    if env is not None:
        os.execve(sys.executable, [sys.executable, "-m", SERVER_MODULE, *argv], env)


DEVICE_OPTION = "--device"


LENS_OPTION = "--lens"


def lenses_checked(argv: list[str]) -> list[str]:
    """The arguments without `--lens X` (each added to $VIT_LENS_LENSES, which the pages read), after every lens file
    of that setting is imported once: one that can't be, or declares no lens, stops the start in one line (exit 1)."""
    from vit_core.lenses import LensError, configured, lenses_of  # no torch: the lens names and their checks are light

    given, rest, i = [], [], 0
    while i < len(argv):
        if argv[i] == LENS_OPTION and i + 1 < len(argv):  # a file as an absolute path: the folder the user meant
            given.append(os.path.abspath(argv[i + 1]) if argv[i + 1].endswith(".py") else argv[i + 1])
            i += 2
            continue
        rest.append(argv[i])
        i += 1
    if given:
        os.environ[settings.LENSES.name] = os.pathsep.join([*configured(), *given])
    try:
        lenses_of(configured())
    except LensError as e:
        raise SystemExit(f"vit-lens dashboard: {e}") from None
    return rest


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


CONCEPTS_OPTION = "--concepts"


def split_concepts_option(argv: list[str]) -> tuple[list[str], list[str]]:
    """(the folders of every `--concepts DIR` / `--concepts=DIR`, in order; the other arguments): Streamlit has no
    such option. A `--concepts` without a folder stops the server with one line."""
    folders, rest = [], []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == CONCEPTS_OPTION:
            if i + 1 == len(argv) or argv[i + 1].startswith("--"):
                raise SystemExit(f"vit-lens dashboard: {CONCEPTS_OPTION} needs a folder that `vit-lens concepts` wrote.")
            folders.append(argv[i + 1])
            i += 2
            continue
        if arg.startswith(CONCEPTS_OPTION + "="):
            folders.append(arg.split("=", 1)[1])
        else:
            rest.append(arg)
        i += 1
    return folders, rest
