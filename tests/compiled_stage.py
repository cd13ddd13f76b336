"""Whether this run of the suite is CI's compiled stage, and so which build it must find.

``.ci/run`` sets ``NARWHAL_EXPECT_COMPILED=1`` when it runs the suite against ``.venv-compiled``
(a copy of ``tests/`` without ``narwhal/``, ``docs/`` or ``scripts/``); tests that hold the
installed build to what the run expects, or that cannot run there, read it from here.
"""

from __future__ import annotations

import os

EXPECT_COMPILED = os.environ.get("NARWHAL_EXPECT_COMPILED") == "1"
EXPECTED_BUILD = "compiled" if EXPECT_COMPILED else "pure"
