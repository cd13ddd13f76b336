"""docs/faults.md's table and parameter list are the fault vocabulary
(narwhal/core/injected_faults.py), row for row: a fault added, renamed or given a parameter in
the code and not in the docs fails here."""

from __future__ import annotations

from pathlib import Path

import pytest

from narwhal.core.injected_faults import (
    EMULATOR,
    FAULTS,
    PARAMETERS,
    SIMULATOR,
    InjectedFault,
    World,
)
from tests.compiled_stage import EXPECT_COMPILED

DOC = Path(__file__).resolve().parents[1] / "docs" / "faults.md"
BEGIN, END = "<!-- fault table: begin -->", "<!-- fault table: end -->"


def _params(fault: InjectedFault, world: World) -> str:
    if world not in fault.parameters:
        return "-"
    return ", ".join(f"`{p}`" for p in fault.parameters[world]) or "yes"


def fault_table() -> str:
    lines = [
        "| kind | what the engine does | simulator | emulator | old names |",
        "|---|---|---|---|---|",
    ]
    for fault in FAULTS:
        old = ", ".join(f"`{name}`" for name in fault.old_names) or "-"
        lines.append(
            f"| `{fault.name}` | {fault.summary} | {_params(fault, SIMULATOR)} | "
            f"{_params(fault, EMULATOR)} | {old} |"
        )
    lines.append("")
    lines += [f"- `{name}`: {meaning}" for name, meaning in PARAMETERS.items()]
    return "\n".join(lines)


@pytest.mark.skipif(
    EXPECT_COMPILED,
    reason="the compiled build's stage runs a copy of tests/ without docs/",
)
def test_the_docs_table_is_the_vocabulary() -> None:
    text = DOC.read_text(encoding="utf-8")
    table = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    # to regenerate: python -c 'from tests.test_fault_docs import fault_table; print(fault_table())'
    assert table == fault_table()
