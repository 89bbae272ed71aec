"""How long the ``mscheduler`` command takes to start: the median wall time of a few runs of
``--version``, ``--help``, ``publish`` on the embedded backend, and of importing the command's
module, each in a fresh process (nothing cached but the OS's page cache).

    .venv/bin/python bench/bench_cli_start.py [--runs 7]
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import subprocess
import sys
import time

BIN = pathlib.Path(sys.executable).parent / "mscheduler"
CASES = {
    "import mscheduler.cli.main": [sys.executable, "-c", "import mscheduler.cli.main"],
    "import mscheduler": [sys.executable, "-c", "import mscheduler"],
    "mscheduler --version": [str(BIN), "--version"],
    "mscheduler --help": [str(BIN), "--help"],
    "mscheduler publish (memory://)": [str(BIN), "publish", "k", "--name", "n"],
}


def median_seconds(command: list[str], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(command, capture_output=True, check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=7)
    runs = parser.parse_args().runs
    subprocess.run([sys.executable, "-c", "pass"], check=True)  # warm the interpreter's files
    baseline = median_seconds([sys.executable, "-c", "pass"], runs)
    print(f"python -c pass: {baseline * 1000:.0f} ms (median of {runs})")
    for label, command in CASES.items():
        print(f"{label}: {median_seconds(command, runs) * 1000:.0f} ms")


if __name__ == "__main__":
    main()
