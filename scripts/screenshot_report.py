"""Screenshot a run's report.html in headless Chromium (rebuilding the reports first).

    python scripts/screenshot_report.py out/quickstart [--out docs/report-screenshot.png]

Fails (exit 1) if the page recorded a script error or drew no charts.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from jobrunner.io.rundir import RunDir
from jobrunner.telemetry import browser
from jobrunner.telemetry.report import write_reports


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--out", type=Path, default=Path("docs/report-screenshot.png"))
    ap.add_argument("--width", type=int, default=1280)
    ap.add_argument("--height", type=int, default=3400)
    args = ap.parse_args()
    write_reports(RunDir(args.run_dir))
    html = args.run_dir / "report.html"
    dom, log = browser.dump_dom(html)
    body = re.search(r"<body[^>]*>", dom)
    charts = re.search(r'data-charts="(\d+)"', body.group(0) if body else "")
    errors = re.search(r'data-errors="([^"]*)"', body.group(0) if body else "")
    problems = (errors.group(1) if errors else "no error hook ran") or "; ".join(
        browser.console_errors(log)
    )
    if problems or not charts or charts.group(1) == "0":
        print(
            f"{html}: charts={charts.group(1) if charts else 0} errors={problems!r}",
            file=sys.stderr,
        )
        return 1
    png = browser.screenshot(html, args.out, args.width, args.height)
    print(f"{png} ({charts.group(1)} charts)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
