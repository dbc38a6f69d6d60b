"""Open a report in headless Chromium: the rendered DOM (for checks) or a screenshot.

Used by the report test and scripts/screenshot_report.py; nothing in a job needs a browser.
Chromium runs sandbox-less (containers), offline, with a fresh profile each time.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
]
CANDIDATES = ("/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome")


def find_chromium() -> str | None:
    for c in CANDIDATES:
        path = c if Path(c).is_file() else shutil.which(c)
        if path:
            return path
    return None


def _run(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    exe = find_chromium()
    if exe is None:
        raise FileNotFoundError("no chromium found (Debian: apt-get install chromium)")
    with tempfile.TemporaryDirectory(prefix="jobrunner-chromium-") as profile:
        return subprocess.run(
            [exe, *FLAGS, f"--user-data-dir={profile}", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
        )


def dump_dom(html: Path, budget_ms: int = 10000, timeout: float = 120) -> tuple[str, str]:
    """(the DOM after scripts ran, Chromium's console log lines)."""
    p = _run(
        [
            "--enable-logging=stderr",
            "--v=0",
            f"--virtual-time-budget={budget_ms}",
            "--dump-dom",
            html.resolve().as_uri(),
        ],
        timeout,
    )
    return p.stdout, p.stderr


def console_errors(stderr: str) -> list[str]:
    """Uncaught exceptions and error messages the page logged, from Chromium's log.

    Chromium logs every console line at INFO; report pages also record console.error calls
    and uncaught errors in body[data-errors] (see report_html), which tests check as well.
    """
    return [
        ln
        for ln in stderr.splitlines()
        if re.search(r"CONSOLE[:(]\d+", ln) and re.search(r"Uncaught|Error", ln)
    ]


def screenshot(
    html: Path, png: Path, width: int = 1280, height: int = 3000, timeout: float = 120
) -> Path:
    png.parent.mkdir(parents=True, exist_ok=True)
    _run(
        [
            f"--screenshot={png.resolve()}",
            f"--window-size={width},{height}",
            "--virtual-time-budget=10000",
            html.resolve().as_uri(),
        ],
        timeout,
    )
    if not png.is_file():
        raise RuntimeError(f"chromium wrote no screenshot to {png}")
    return png
