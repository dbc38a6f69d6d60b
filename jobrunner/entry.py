"""The `jobrunner` command: a stop signal from its first instant exits 75.

The CLI's imports (typer, then torch and the model for `run`) take a second or more; a SIGTERM
or SIGINT in that time would kill the process with the signal's own status (143, 130), which a
scheduler reads as a crash. Here, before anything heavy is imported, both exit 75 (interrupted:
run again); nothing is written yet, and later stretches install their own handlers
(signals.raise_on_signal, the executors' graceful stop), putting this one back after them.
"""

from __future__ import annotations

import signal
import sys

from jobrunner.errors import EXIT_INTERRUPTED


def stop_at_once(signum: int, frame: object) -> None:
    sys.exit(EXIT_INTERRUPTED)


def install() -> None:
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, stop_at_once)


def main() -> None:
    install()
    from jobrunner.cli import main as cli_main

    cli_main()
