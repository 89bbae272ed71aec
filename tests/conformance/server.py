"""The server the conformance suite starts when it is given no URL: ``mscheduler serve``'s
app on a private memory:// collection, on a free loopback port. Announces its address on
stderr as ``mscheduler serve`` does."""

from __future__ import annotations

import socket
import sys

import anyio
import uvicorn

import mscheduler as ms
from mscheduler.http import create_app


async def main(token: str) -> None:
    async with await ms.Scheduler.connect("memory://conformance") as sched:
        listening = socket.socket()
        listening.bind(("127.0.0.1", 0))
        listening.listen(128)
        config = uvicorn.Config(create_app(sched, token=token), log_config=None)
        port = listening.getsockname()[1]
        print(f"serve: http://127.0.0.1:{port}/ (conformance)", file=sys.stderr, flush=True)
        await uvicorn.Server(config).serve(sockets=[listening])


if __name__ == "__main__":
    anyio.run(main, sys.argv[1])
