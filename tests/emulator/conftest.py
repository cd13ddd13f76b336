"""The emulator's tests run emulated engines on loopback with the live tests' harness."""

from tests.live.conftest import emulator, servers

__all__ = ["emulator", "servers"]
