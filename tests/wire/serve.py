"""The wire tier's engine: mongoeco's wire-protocol server, run by its own interpreter.

Run with the Python of ``.venv-wire`` (mongoeco needs Python >= 3.13; see ``.ci/wire-venv``).
Prints the port it listens on, then serves until its standard input closes, so it never
outlives the pytest session that started it.
"""

import asyncio
import sys
import threading

from mongoeco.wire import AsyncMongoEcoProxyServer


async def main() -> None:
    async with AsyncMongoEcoProxyServer(host="127.0.0.1", port=0) as server:
        print(server.address.port, flush=True)
        loop = asyncio.get_running_loop()
        closed = asyncio.Event()

        def wait_for_eof() -> None:
            sys.stdin.read()  # until the parent closes the pipe (or dies)
            loop.call_soon_threadsafe(closed.set)

        threading.Thread(target=wait_for_eof, daemon=True).start()
        await closed.wait()


if __name__ == "__main__":
    asyncio.run(main())
