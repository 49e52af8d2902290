"""The classroom load test: N sessions at once on one dashboard server, each checked against the same
images analysed alone (see tools/loadtest/sessions.py for what it does and reports).

    .venv/bin/python -m tools.loadtest --sessions 5 --model test-tiny

`sessions` holds the server start/stop, the sessions (chromium pages or protocol clients), the comparison
and the report; `client` the protocol client (`StreamlitSession`); `attacker` the one session of `--attacker` that
sends hostile files. The names the tests and the benchmark
use are re-exported here."""

from .sessions import (
    APP_IDLE,
    ATOL,
    CHROMIUM_ARGS,
    EXACT,
    RTOL,
    CpuMeter,
    DownloadStore,
    RssSampler,
    SessionResult,
    compare,
    download_path,
    drive,
    free_port,
    main,
    prepare_images,
    reference_model,
    run,
    session_image,
    start_server,
    stop_server,
    summarise,
    wait_healthy,
)

__all__ = [
    "APP_IDLE", "ATOL", "CHROMIUM_ARGS", "EXACT", "RTOL", "CpuMeter", "DownloadStore", "RssSampler", "SessionResult",
    "compare", "download_path", "drive", "free_port", "main", "prepare_images", "reference_model", "run",
    "session_image", "start_server", "stop_server", "summarise", "wait_healthy",
]
