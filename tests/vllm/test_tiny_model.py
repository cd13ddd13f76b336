"""(default run, no vLLM) The tiny model's vocabulary, and ``narwhal vllm tiny-model`` run from
a Python without torch: it runs itself with the vLLM venv's Python, once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from narwhal.cli import main
from narwhal.vllm.tiny_model import (
    CHARS,
    SPECIALS,
    STAMP,
    build_in_venv,
    config_kwargs,
    stamp_for,
    vocabulary,
)
from tests.vllm.fakes import fake_venv


def test_tiny_model_vocabulary() -> None:
    vocab = vocabulary()
    assert len(vocab) == config_kwargs()["vocab_size"] == 104
    assert [vocab[s] for s in SPECIALS] == list(range(6))
    assert len(set(CHARS)) == len(CHARS) == 98


def test_a_built_model_is_not_built_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "model"
    out.mkdir()
    (out / "config.json").write_text("{}")
    (out / STAMP).write_text(json.dumps(stamp_for(3)))
    missing = tmp_path / "no-venv"  # nothing can be run from here: nothing is
    assert build_in_venv(out, seed=3, venv=missing) == out
    assert main(["vllm", "tiny-model", str(out), "--seed", "3", "--venv", str(missing)]) == 0
    assert "tiny-llama (seed 3) already there" in capsys.readouterr().out


def test_the_command_runs_once_in_the_venvs_python(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The venv's Python here is this test's, which has no torch: the command it runs builds
    in place (it is marked so) and fails for want of torch, instead of running itself again."""
    monkeypatch.setattr("narwhal.vllm.tiny_model.builds_here", lambda: False)  # as without torch
    venv = fake_venv(tmp_path / "venv")
    out = tmp_path / "model"
    assert main(["vllm", "tiny-model", str(out), "--venv", str(venv)]) == 1
    err = capsys.readouterr().err
    assert "building the tiny model failed" in err and "No module named 'torch'" in err
