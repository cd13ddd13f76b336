"""The optional compiled build (setup.py, mypyc) compiles exactly the modules it lists.

On a plain install this checks the list names real modules; with ``NARWHAL_EXPECT_COMPILED=1``
(set by ``.ci/run`` when it runs the suite against ``.venv-compiled``) it also checks that every
listed module is the compiled extension, so the suite provably ran the compiled code. And the
compiled modules join bytes rather than add them: mypyc as pinned (mypy below 2) leaks the left
operand of every ``bytes + bytes`` (mypyc/mypyc#1192), which in a hot path grows a long run's
memory without bound; the functions that build a simulated request's bytes are checked to leave
nothing behind.
"""

from __future__ import annotations

import ast
import gc
import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import narwhal
from tests.compiled_stage import EXPECT_COMPILED, EXPECTED_BUILD

SETUP = Path(__file__).resolve().parents[1] / "setup.py"


def compiled_modules() -> list[str]:
    tree = ast.parse(SETUP.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "COMPILED":
            paths = ast.literal_eval(node.value)
            return [path.removesuffix(".py").replace("/", ".") for path in paths]
    raise AssertionError("setup.py has no COMPILED list")


def test_compiled_list_names_real_modules() -> None:
    modules = compiled_modules()
    assert "narwhal.sim.gpu.engine" in modules and "narwhal.core.lifecycle" in modules
    for name in modules:
        assert importlib.util.find_spec(name) is not None, name


def test_the_package_names_the_build_this_run_installed() -> None:
    # what the startup line and narwhal_build_info report (tests/live check both)
    assert narwhal.build() == EXPECTED_BUILD


@pytest.mark.skipif(not EXPECT_COMPILED, reason="only against the compiled build")
def test_listed_modules_are_compiled() -> None:
    for name in compiled_modules():
        module = importlib.import_module(name)
        assert module.__file__ is not None and module.__file__.endswith(".so"), module.__file__


def bytes_additions(tree: ast.AST) -> list[int]:
    """Lines of ``+`` or ``+=`` with a bytes literal on either side."""

    def is_bytes(node: ast.expr) -> bool:
        return isinstance(node, ast.Constant) and isinstance(node.value, bytes)

    lines = []
    for node in ast.walk(tree):
        sides: tuple[ast.expr, ...] = ()
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            sides = (node.left, node.right)
        elif isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add):
            sides = (node.value,)
        if any(is_bytes(side) for side in sides):
            lines.append(node.lineno)
    return sorted(lines)


def test_compiled_modules_add_no_bytes() -> None:
    assert bytes_additions(ast.parse('x = a + b"\\n"\ny = b"" + c\nz += b"d"')) == [1, 2, 3]
    found = {}
    for name in compiled_modules():
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None, name
        # the source, beside the compiled extension in the compiled build
        path = Path(spec.origin).with_name(name.rsplit(".", 1)[1] + ".py")
        lines = bytes_additions(ast.parse(path.read_text()))
        if lines:
            found[name] = lines
    assert found == {}  # join (b"".join) or format instead


def blocks_left(build: Callable[[], object], calls: int = 2_000) -> float:
    """Heap blocks still allocated per call once ``calls`` results were built and dropped (with
    the cyclic collector paused: what is left is what reference counting never freed)."""
    build()
    gc.disable()
    try:
        before = sys.getallocatedblocks()
        for _ in range(calls):
            build()
        return (sys.getallocatedblocks() - before) / calls
    finally:
        gc.enable()


def test_a_simulated_streams_bytes_leave_nothing_behind() -> None:
    from narwhal.core.sse import EventKind, SseEvent, SseParser
    from narwhal.sim.gpu import wire

    writer = wire.chunk_writer("req-1", "m", True)
    two_events = b'data: {"a":1}\n\ndata: {"b":2}\n\n'
    builders: dict[str, Callable[[], object]] = {
        "token_chunk": lambda: wire.token_chunk(writer, 16, True),
        "role_chunk": lambda: writer.role_chunk(),
        "chunk_writer": lambda: wire.chunk_writer("req-1", "m", False),
        "event wire": lambda: SseEvent(EventKind.MALFORMED, "{").wire(),
        "two-line event wire": lambda: SseEvent(EventKind.MALFORMED, "{\n}").wire(),
        "two whole events": lambda: SseParser().feed(two_events),
    }
    left = {name: blocks_left(build) for name, build in builders.items()}
    assert all(per_call < 0.05 for per_call in left.values()), left


class _DiscardingTransport:
    """Takes an answer's writes and drops them (what is measured is the router's bytes)."""

    def is_closing(self) -> bool:
        return False

    def write(self, data: bytes) -> None:
        pass


def test_a_live_requests_bytes_leave_nothing_behind() -> None:
    """An engine request's bytes, and a streamed answer (its held head written with the first
    chunk, then the last), built over and over, leave no heap block behind."""
    import asyncio

    from narwhal.core.config import ClientSettings
    from narwhal.live.h1client import Origin, request_bytes
    from narwhal.live.h1request import EdgeRequest, Headers
    from narwhal.live.h1server import EdgeConnection, EdgeServer

    async def unused(request: EdgeRequest) -> None:
        raise AssertionError("no request is served")

    async def measure() -> dict[str, float]:
        conn = EdgeConnection(EdgeServer(unused, ClientSettings()))
        conn.transport = _DiscardingTransport()  # type: ignore[assignment]

        def streamed_answer() -> None:
            request = EdgeRequest(conn, "POST", "/v1/completions", (1, 1), Headers({}), True)
            request.hold_head(200, {"content-type": "text/event-stream"})
            request.write(b'data: {"choices":[{"text":"a"}]}\n\n')
            request.write_eof(b"data: [DONE]\n\n")

        origin = Origin.of("http://127.0.0.1:8000")
        body = b'{"prompt":"hello","max_tokens":1}'
        builders: dict[str, Callable[[], object]] = {
            "request_bytes": lambda: request_bytes("POST", origin, "/v1/x", {"a": "b"}, body),
            "streamed answer": streamed_answer,
        }
        return {name: blocks_left(build) for name, build in builders.items()}

    left = asyncio.run(measure())
    assert all(per_call < 0.05 for per_call in left.values()), left
