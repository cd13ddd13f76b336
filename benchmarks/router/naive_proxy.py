"""The naive P/D baseline: a minimal Starlette + httpx proxy, written for these benchmarks.

It does what a hand-rolled disaggregation proxy does: a one-token prefill on a producer asking
for a remote decode, then the client's request on a consumer with the producer's
``kv_transfer_params``, streamed back byte for byte. Engines are picked round robin; there are no
retries, no health checks, no breaker, and no timeout but the connect one (like vLLM's toy proxy,
whose only bound is a six-hour total). Run: ``python naive_proxy.py --port P --prefill URL
--decode URL [--prefill URL ...]``.
"""

from __future__ import annotations

import argparse
import itertools
import json

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route


def build_app(prefills: list[str], decodes: list[str]) -> Starlette:
    client = httpx.AsyncClient(
        timeout=httpx.Timeout(None, connect=5.0),
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=512),
    )
    next_prefill, next_decode = itertools.cycle(prefills), itertools.cycle(decodes)

    async def completions(request: Request) -> Response:
        body = json.loads(await request.body())
        path = request.url.path
        leg = dict(body, max_tokens=1, stream=False)
        leg.pop("stream_options", None)
        leg["kv_transfer_params"] = {"do_remote_decode": True, "do_remote_prefill": False}
        reply = await client.post(next(next_prefill) + path, json=leg)
        if reply.status_code != 200:
            return Response(reply.content, reply.status_code, media_type="application/json")
        body["kv_transfer_params"] = reply.json().get("kv_transfer_params")
        upstream = client.build_request("POST", next(next_decode) + path, json=body)
        response = await client.send(upstream, stream=True)
        if response.status_code != 200 or not body.get("stream"):
            content = await response.aread()
            await response.aclose()
            return Response(content, response.status_code, media_type="application/json")

        async def relay():  # type: ignore[no-untyped-def]
            try:
                async for chunk in response.aiter_raw():
                    yield chunk
            finally:
                await response.aclose()

        return StreamingResponse(relay(), media_type="text/event-stream")

    async def health(_: Request) -> Response:
        return JSONResponse({"status": "ok"})

    routes = [
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", completions, methods=["POST"]),
        Route("/health", health),
    ]
    return Starlette(routes=routes, on_shutdown=[client.aclose])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--prefill", action="append", required=True)
    parser.add_argument("--decode", action="append", required=True)
    args = parser.parse_args()
    app = build_app(args.prefill, args.decode)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
