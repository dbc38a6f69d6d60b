"""Peak memory of per-row telemetry records: a plain list against telemetry.spill.SpillLog.

Each measurement runs in a fresh process and appends N row records (telemetry/timeline.py's
ROW_COLUMNS) as a job's committer does; it prints the peak RSS and the time.

    python scripts/bench_telemetry_memory.py [--rows 2000000]
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def child(kind: str, n: int) -> None:
    from jobrunner.telemetry.spill import SpillLog
    from jobrunner.telemetry.timeline import ROW_COLUMNS

    t = time.perf_counter()
    log: list | SpillLog = [] if kind == "list" else SpillLog(ROW_COLUMNS)
    for i in range(n):
        log.append({c: float(i) for c in ROW_COLUMNS})
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"| {kind} | {n:,} | {peak:,.0f} | {time.perf_counter() - t:.1f} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--child", default="")
    a = ap.parse_args()
    if a.child:
        return child(a.child, a.rows)
    print("| records held as | rows | peak RSS MiB | seconds |\n|---|---|---|---|")
    for kind in ("list", "spill"):
        cmd = [sys.executable, __file__, "--child", kind, "--rows", str(a.rows)]
        subprocess.run(cmd, check=True)


if __name__ == "__main__":
    main()
