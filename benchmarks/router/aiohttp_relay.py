"""A logic-free P/D relay on aiohttp (server and client) and uvloop, written for these benchmarks.

It measures the floor of a Python relay on Narwhal's own HTTP stack: per request it parses the
client's JSON body, sends the one-token prefill leg to a producer asking for a remote decode,
parses the reply, and streams the client's request from a consumer with the producer's
``kv_transfer_params``, relaying each read byte for byte. Engines are picked round robin; there
are no deadlines, retries, health checks, breaker, validation, metrics or logs. So Narwhal's CPU
minus this relay's, in the same run, is what Narwhal's own work (parsing and classifying every
event, its deadlines, placement, reporting) costs on top of the stack.
Run: ``python aiohttp_relay.py --port P --prefill URL --decode URL [--prefill URL ...]``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
from collections.abc import Awaitable, Callable

import aiohttp
import uvloop
from aiohttp import web

JSON = {"Content-Type": "application/json"}


def make_handler(
    session: aiohttp.ClientSession, prefills: list[str], decodes: list[str]
) -> Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]:
    next_prefill, next_decode = itertools.cycle(prefills), itertools.cycle(decodes)

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        if request.path == "/health":
            return web.json_response({"status": "ok"})
        body = json.loads(await request.read())
        leg = dict(body, max_tokens=1, stream=False)
        leg.pop("stream_options", None)
        leg["kv_transfer_params"] = {"do_remote_decode": True, "do_remote_prefill": False}
        url = next(next_prefill) + request.path
        async with session.post(url, data=json.dumps(leg).encode(), headers=JSON) as reply:
            prefilled = json.loads(await reply.read())
        body["kv_transfer_params"] = prefilled.get("kv_transfer_params")
        url = next(next_decode) + request.path
        async with session.post(url, data=json.dumps(body).encode(), headers=JSON) as upstream:
            response = web.StreamResponse(
                status=upstream.status,
                headers={"content-type": upstream.headers.get("content-type", "text/plain")},
            )
            await response.prepare(request)
            while chunk := await upstream.content.readany():
                await response.write(chunk)
            await response.write_eof()
            return response

    return handle


async def serve(host: str, port: int, prefills: list[str], decodes: list[str]) -> None:
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=1000),
        timeout=aiohttp.ClientTimeout(),
        auto_decompress=False,
    ) as session:
        runner = web.ServerRunner(web.Server(make_handler(session, prefills, decodes)))
        await runner.setup()
        await web.TCPSite(runner, host, port).start()
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--prefill", action="append", required=True)
    parser.add_argument("--decode", action="append", required=True)
    args = parser.parse_args()
    uvloop.run(serve(args.host, args.port, args.prefill, args.decode))


if __name__ == "__main__":
    main()
