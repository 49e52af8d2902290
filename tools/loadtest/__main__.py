"""`python -m tools.loadtest [...]`: the load test (options: `python -m tools.loadtest --help`)."""

from .classroom import main

main()
