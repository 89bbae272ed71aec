"""The main job at scale: how long ``mscheduler demo --emails N`` takes, and how soon it stops
after Ctrl-C. Prints numbers.

    python bench/bench_demo.py                      # 5,000 emails; Ctrl-C after 10 s
    python bench/bench_demo.py --markdown
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

COMMAND = str(Path(sys.executable).with_name("mscheduler"))


def _start(emails: int) -> subprocess.Popen[bytes]:
    # SIGINT as a terminal delivers it: a shell's background job would have it ignored.
    return subprocess.Popen(
        [COMMAND, "demo", "--emails", str(emails)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        env={**os.environ, "COLUMNS": "100"},
    )


def full_run(emails: int) -> tuple[float, int]:
    started = time.perf_counter()
    process = _start(emails)
    code = process.wait(timeout=3_600)
    return time.perf_counter() - started, code


def interrupted(emails: int, after: float) -> tuple[float, int]:
    process = _start(emails)
    time.sleep(after)
    sent = time.perf_counter()
    process.send_signal(signal.SIGINT)
    code = process.wait(timeout=600)
    return time.perf_counter() - sent, code


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--emails", type=int, default=5_000)
    parser.add_argument("--interrupt-after", type=float, default=10.0)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    took, code = full_run(args.emails)
    stopped, interrupted_code = interrupted(args.emails, args.interrupt_after)
    if args.markdown:
        print("| measure | value |")
        print("| --- | ---: |")
        print(f"| `mscheduler demo --emails {args.emails:,}`, start to exit | {took:.1f} s |")
        print(f"| Ctrl-C after {args.interrupt_after:.0f} s, to exit | {stopped:.2f} s |")
    else:
        print(f"demo --emails {args.emails}: {took:.1f} s start to exit (exit code {code})")
        print(
            f"Ctrl-C after {args.interrupt_after:.0f} s: exited {stopped:.2f} s later "
            f"(exit code {interrupted_code})"
        )


if __name__ == "__main__":
    main()
