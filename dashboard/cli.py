"""The installed `vit-lens` command.

    vit-lens analyze IMAGE ... [options]      exactly `python -m vit_core analyze ...` (same parser, same output)
    vit-lens dashboard [--device D] [streamlit options]
                                              start the dashboard: `python -m dashboard.serve [...]`

Every subcommand of vit_core's own parser is offered as it is (a new one there appears here), plus
`dashboard`, whose arguments all go to `streamlit run` untouched (e.g. `--server.port 8502`), except
`--device D` (auto, cpu, cuda, cuda:N or mps; Streamlit has no such option): the device the server's
models run on, as `--device` does for vit_core's own commands (dashboard.server.launch.split_device_option).
Dependencies stay one way: this module imports vit_core, never the reverse. OPENBLAS_NUM_THREADS defaults to 1
before numpy is imported (see dashboard.serve).
"""

from __future__ import annotations

import atexit
import logging
import os
import sys

from vit_core.runtime import one_blas_thread  # a light module: no torch, no numpy

DASHBOARD = "dashboard"


def main(argv: list[str] | None = None) -> int:
    whole_process = argv is None  # the `vit-lens` command itself, not a caller inside another program
    argv = sys.argv[1:] if argv is None else argv
    one_blas_thread()  # before numpy is imported
    if argv[:1] == [DASHBOARD]:
        # Streamlit's own option parser takes everything after `dashboard` (argparse would refuse
        # `--server.port`). Imported here: `vit-lens analyze` need not load Streamlit.
        from dashboard import serve

        if not whole_process:
            serve.main(argv[1:], whole_process=False)
            return 0
        status: list[int] = []  # the server's exit status, once it has stopped
        atexit.register(_end_quietly, status)  # before the server imports anything: it runs after their handlers
        try:
            serve.main(argv[1:], whole_process=True)
        except SystemExit as stop:  # how the server returns (Streamlit's own stop on Ctrl-C or SIGTERM included)
            status.append(stop.code if isinstance(stop.code, int) else 0 if stop.code is None else 1)
            raise
        except KeyboardInterrupt:  # Ctrl-C before Streamlit's server has started (it takes Ctrl-C itself after)
            print("vit-lens dashboard: interrupted", file=sys.stderr)
            status.append(130)
            return 130
        return 0

    from vit_core import __main__ as core_cli

    parser, commands = core_cli.build_parser(prog="vit-lens")
    commands.add_parser(DASHBOARD, add_help=False, help="start the dashboard; --device D picks the models' device, other "
                        "options go to `streamlit run` (e.g. --server.port 8502); the server settings come with the package")
    return core_cli.run(parser.parse_args(argv))


def _end_quietly(status: list[int]) -> None:
    """The dashboard process's last exit handler: once the server has stopped, its threads are joined and the other
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
    sys.exit(main())
