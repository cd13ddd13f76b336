"""CPU per engine call: aiohttp's ``ClientSession``, one write on a kept connection, and
Narwhal's engine transport.

Usage: ``.venv/bin/python benchmarks/client_request_cost.py``

Both variants POST the same small JSON body (a prefill leg's size) to an aiohttp server in the
same process, on uvloop, one call at a time, and read the whole reply; the figure is the
process's CPU time per round trip (the server's share is the same in both). ``ClientSession`` is
what Narwhal's engine client uses (``narwhal/live/transport.py``); the other variant writes the
request's head and body in one ``transport.write`` on a connection it keeps and reads the reply
with aiohttp's own protocol and C parser (``aiohttp.client_proto.ResponseHandler``): no request
objects, no pool lookup, no task for the body. The third is Narwhal's own
``EngineTransport.call`` (``narwhal/live/transport.py`` over ``narwhal/live/h1client.py``) as the
router's prefill leg makes it: the body encoded from a dict, the call under its deadline, one
write on a pooled connection, the reply parsed by llhttp (docs/live.md, "The engine client").
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable

import aiohttp
import uvloop
from aiohttp import web
from aiohttp.client_proto import ResponseHandler
from yarl import URL

from narwhal.live.clock import AnyioClock
from narwhal.live.transport import EngineTransport

PORT = 18779
CALLS = 3000
BODY = json.dumps(
    {"model": "m", "prompt": "x" * 300, "max_tokens": 1, "kv_transfer_params": {"a": True}}
).encode()
HEAD = (
    b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nX-Request-Id: a\r\n"
    b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (PORT, len(BODY))
)


async def reply(request: web.BaseRequest) -> web.StreamResponse:
    await request.read()
    return web.Response(body=b'{"ok":1}', content_type="application/json")


async def cpu_per_call(call: Callable[[], Awaitable[None]]) -> float:
    """Microseconds of process CPU per call, after a warm-up."""
    for _ in range(200):
        await call()
    began = time.process_time()
    for _ in range(CALLS):
        await call()
    return 1e6 * (time.process_time() - began) / CALLS


async def main() -> None:
    runner = web.ServerRunner(web.Server(reply, access_log=None))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", PORT).start()
    loop = asyncio.get_running_loop()
    session = aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(),
        cookie_jar=aiohttp.DummyCookieJar(),
        auto_decompress=False,
        skip_auto_headers=("Accept-Encoding",),
    )
    transport, protocol = await loop.create_connection(
        lambda: ResponseHandler(loop), "127.0.0.1", PORT
    )
    url = URL(f"http://127.0.0.1:{PORT}/v1/completions")
    headers = {"X-Request-Id": "a", "Content-Type": "application/json"}

    async def with_session() -> None:
        async with session.request("POST", url, data=BODY, headers=headers) as response:
            await response.read()

    async def one_write() -> None:
        protocol.set_response_params(read_until_eof=False, auto_decompress=False)
        transport.write(b"".join((HEAD, BODY)))
        _, payload = await protocol.read()
        await payload.read()

    clock = AnyioClock()
    engines = EngineTransport(clock)
    leg = json.loads(BODY)

    async def narwhal_call() -> None:
        base = f"http://127.0.0.1:{PORT}"
        await engines.call(
            base, "POST", "/v1/completions", leg, {"X-Request-Id": "a"}, clock.now() + 5
        )

    try:
        for _ in range(2):  # alternated: the machine's speed drifts
            print(f"ClientSession.request: {await cpu_per_call(with_session):.0f} us CPU per call")
            print(f"one write, kept conn.: {await cpu_per_call(one_write):.0f} us CPU per call")
            print(f"EngineTransport.call:  {await cpu_per_call(narwhal_call):.0f} us CPU per call")
    finally:
        transport.close()
        await engines.aclose()
        await session.close()
        await runner.cleanup()


if __name__ == "__main__":
    uvloop.run(main())
