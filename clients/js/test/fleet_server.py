"""A mixed fleet's Python half, for the Node tests: one process with a memory:// collection,
the HTTP API on a free loopback port (announced on stderr as ``mscheduler serve`` does), and
``--consumers`` Python consumers of ``fleet`` tasks on the same collection. Each Python run
returns ``{"by": "python"}``."""

from __future__ import annotations

import argparse
import socket
import sys

import anyio
import uvicorn

import mscheduler as ms
from mscheduler.http import create_app


async def main(consumers: int, token: str) -> None:
    async with await ms.Scheduler.connect("memory://fleet") as sched:

        async def fleet(task: ms.Task) -> dict[str, str]:
            await anyio.sleep(0.002)  # long enough for the Node worker to get its share
            return {"by": "python"}

        listening = socket.socket()
        listening.bind(("127.0.0.1", 0))
        listening.listen(128)
        config = uvicorn.Config(create_app(sched, token=token), log_config=None)
        options = ms.WorkerOptions(worker_id="py", max_running=4)
        async with sched.consumers({"fleet": fleet}, count=consumers, options=options):
            port = listening.getsockname()[1]
            print(f"serve: http://127.0.0.1:{port}/ (fleet)", file=sys.stderr, flush=True)
            await uvicorn.Server(config).serve(sockets=[listening])


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--consumers", type=int, default=2)
    parser.add_argument("--token", default="fleet")
    args = parser.parse_args()
    anyio.run(main, args.consumers, args.token)
