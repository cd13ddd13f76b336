"""What the request log's prompt identity costs the router per request, against parsing the body.

What it measures: for a completion prompt and a chat of one user turn, each of ``--kib`` KiB,
the best of 7 repeats of (a) parsing the raw body as the router does
(``narwhal.live.bodies.parse_body``) and (b) the request log's fields of the prompt
(``narwhal.core.prompt_identity.prompt_fields``: rendering, chained block hashes), in
microseconds per request.

Run it from the repository root: ``.venv/bin/python benchmarks/router/prompt_identity_cost.py``.
It is not part of the test run.
"""

from __future__ import annotations

import argparse
import json
import timeit
from collections.abc import Callable

from narwhal.core.prompt_identity import prompt_fields
from narwhal.core.requests import CHAT, COMPLETIONS, parse_client_request
from narwhal.live.bodies import parse_body


def best_us(call: Callable[[], object], number: int = 200) -> float:
    return min(timeit.repeat(call, number=number, repeat=7)) / number * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kib", type=int, nargs="+", default=[4, 64])
    args = parser.parse_args()
    print("| prompt | parse the body (µs) | prompt identity (µs) |\n|---|---|---|")
    for kib in args.kib:
        text = "y" * (kib * 1024)
        shapes = (
            (COMPLETIONS, {"prompt": text}),
            (CHAT, {"messages": [{"role": "user", "content": text}]}),
        )
        for endpoint, body in shapes:
            raw = json.dumps(body).encode()
            request = parse_client_request(
                endpoint, parse_body(raw, 100_000), request_id="r", arrival=0.0
            )
            parse = best_us(lambda raw=raw: parse_body(raw, 100_000))
            identity = best_us(lambda request=request: prompt_fields(request))
            name = "completion" if endpoint == COMPLETIONS else "chat"
            print(f"| {kib} KiB {name} | {parse:.0f} | {identity:.0f} |")


if __name__ == "__main__":
    main()
