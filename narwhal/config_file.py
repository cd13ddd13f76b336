"""TOML files as mappings: the one place Narwhal's drivers read a configuration, scenario or
sweep spec from disk.

Rule kept here: a file that cannot be used is refused with the caller's own error type, naming
the file and what is wrong with it (missing, not UTF-8, not TOML); what the mapping means is
validated elsewhere, by the model that owns its keys (:mod:`narwhal.core.config`,
:mod:`narwhal.sim.scenario`, :mod:`narwhal.experiments.spec`). The core does no I/O, so the
reading lives here, outside it.

Theory of operation: :func:`parse_toml` turns TOML text into a mapping, :func:`read_toml` reads
a file as UTF-8 and parses it, and :func:`load_config` is ``narwhal serve`` / ``preflight``'s
whole path from a file to a validated :class:`~narwhal.core.config.NarwhalConfig`;
:func:`config_from_bytes` is the same path from a file's bytes already read (a reload, which
hashes what it read). :func:`config_from_urls` is the path from ``narwhal serve --prefill URL
--decode URL`` (no file): the same mapping a file would hold, validated by the same model, with
errors naming the flag that gave the bad value.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from narwhal.core.config import ConfigError, NarwhalConfig, parse_config


def parse_toml(text: str, source: str, error: type[ValueError]) -> dict[str, Any]:
    """TOML text as a mapping; a syntax error raises ``error`` naming ``source``."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as problem:
        raise error(f"invalid TOML in {source}: {problem}") from None


def _utf8(data: bytes, what: str, path: str | Path, error: type[ValueError]) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as problem:
        raise error(
            f"cannot read {what} {path}: not UTF-8 text (byte {problem.start}); TOML files "
            "are UTF-8"
        ) from None


def read_toml(path: str | Path, what: str, error: type[ValueError]) -> dict[str, Any]:
    """A TOML file (a configuration, scenario, sweep spec...) as a mapping, or ``error``."""
    try:
        data = Path(path).read_bytes()
    except OSError as problem:
        raise error(f"cannot read {what} {path}: {problem.strerror or problem}") from None
    return parse_toml(_utf8(data, what, path, error), str(path), error)


def load_config(path: str | Path) -> NarwhalConfig:
    """Read and validate a TOML configuration file (:class:`ConfigError` names every bad key)."""
    return parse_config(read_toml(path, "configuration", ConfigError), str(path))


def config_from_bytes(data: bytes, path: str | Path) -> NarwhalConfig:
    """The configuration file ``path``'s content ``data``, validated (or :class:`ConfigError`)."""
    text = _utf8(data, "configuration", path, ConfigError)
    return parse_config(parse_toml(text, str(path), ConfigError), str(path))


def config_from_urls(prefill: Sequence[str], decode: Sequence[str]) -> NarwhalConfig:
    """The configuration of a fleet given by its URLs alone (every other setting at its
    default), as ``[[engines]]`` entries: a URL given both as a producer and as a consumer is one
    engine of role ``both``. Errors name the flag (``--prefill`` / ``--decode``), not the index."""
    roles: dict[str, str] = {}
    flags: dict[str, str] = {}
    for flag, role, urls in (("--prefill", "prefill", prefill), ("--decode", "decode", decode)):
        for url in urls:
            known = roles.get(url)
            roles[url] = role if known in (None, role) else "both"
            flags[url] = flag if known in (None, role) else "--prefill/--decode"
    engines = [{"url": url, "role": role} for url, role in roles.items()]
    order = list(flags.values())
    try:
        return parse_config({"engines": engines}, "the command line")
    except ConfigError as error:
        message = re.sub(
            r"engines\[(\d+)\]\.url", lambda match: order[int(match.group(1))], str(error)
        )
        raise ConfigError(message) from None
