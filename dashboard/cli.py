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

import sys

from vit_core.runtime import no_triton_without_a_gpu, one_blas_thread  # a light module: no torch, no numpy

DASHBOARD = "dashboard"


def main(argv: list[str] | None = None) -> int:
    whole_process = argv is None  # the `vit-lens` command itself, not a caller inside another program
    argv = sys.argv[1:] if argv is None else argv
    one_blas_thread()  # before numpy is imported
    no_triton_without_a_gpu()  # before torch is
    if argv[:1] == [DASHBOARD]:
        # Streamlit's own option parser takes everything after `dashboard` (argparse would refuse
        # `--server.port`). Imported here: `vit-lens analyze` need not load Streamlit.
        from dashboard import serve

        if not whole_process:
            serve.main(argv[1:], whole_process=False)
            return 0
        return serve.run_as_process(argv[1:])

    from vit_core import __main__ as core_cli

    parser, commands = core_cli.build_parser(prog="vit-lens")
    commands.add_parser(DASHBOARD, add_help=False, help="start the dashboard; --device D picks the models' device, other "
                        "options go to `streamlit run` (e.g. --server.port 8502); the server settings come with the package")
    code = core_cli.run(parser.parse_args(argv))
    if whole_process:
        core_cli.exit_process(code)  # without tearing torch's modules down (vit_core.__main__.exit_process)
    return code


if __name__ == "__main__":
    sys.exit(main())
