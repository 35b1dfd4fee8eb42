"""A config key is declared once, in the settings it feeds: parsing, bounds, the reload's
rule, the flags and the docs' tables all come from that declaration."""

from __future__ import annotations

import argparse
import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from dsh_system_prompt_server import ConfigError, SidecarConfig, parse_config, start_sidecar
from dsh_system_prompt_server.config import (
    Count,
    Reload,
    Seconds,
    add_flags,
    declared,
    flag_values,
    group,
    read,
    setting,
    tables,
)
from dsh_system_prompt_server.rpc.settings import StateSettings, StreamSettings
from dsh_system_prompt_server.sidecar.reload import apply

SERVER = Path(__file__).resolve().parents[2] / "server"


# A key added to the table the way every key is: one field in the settings it feeds.
@dataclass(frozen=True)
class ProbeStreams(StreamSettings):
    probe_wait_s: float = setting(
        1.0, Seconds(most=10.0), "how long a probe waits", flag="--probe-wait"
    )
    probe_slots: int = setting(4, Count(most=64), "probes at once", reload=Reload.RESTART)


@dataclass(frozen=True)
class ProbeState(StateSettings):
    streams: ProbeStreams = group(ProbeStreams)


@dataclass(frozen=True)
class ProbeConfig(SidecarConfig):
    state: ProbeState = group(ProbeState)


def test_an_added_key_is_parsed_with_its_default_when_absent() -> None:
    assert read(ProbeConfig, {}).state.streams.probe_wait_s == 1.0
    assert read(ProbeConfig, {"probe_wait_s": 2}).state.streams.probe_wait_s == 2.0


def test_an_added_key_is_bounded_by_its_kind_naming_it() -> None:
    with pytest.raises(ConfigError, match=r"config key 'probe_wait_s' must be .* to 10 s"):
        read(ProbeConfig, {"probe_wait_s": 11})
    with pytest.raises(ConfigError, match="config key 'probe_slots' must be a whole number"):
        read(ProbeConfig, {"probe_slots": "four"})


async def test_an_added_key_is_reloaded_live_or_kept_until_a_restart() -> None:
    sidecar = await start_sidecar(read(ProbeConfig, {}), "127.0.0.1:0")
    try:
        new = read(ProbeConfig, {"probe_wait_s": 3.0, "probe_slots": 8})
        reloaded = apply(sidecar, new, sidecar.config)
        assert (reloaded.applied, reloaded.need_restart) == (["probe_wait_s"], ["probe_slots"])
        streams = sidecar.config.state.streams
        assert isinstance(streams, ProbeStreams)
        assert (streams.probe_wait_s, streams.probe_slots) == (3.0, 4)
    finally:
        await sidecar.server.stop(grace=None)


def test_an_added_key_has_its_flag() -> None:
    parser = argparse.ArgumentParser()
    add_flags(parser, ProbeConfig)
    assert flag_values(parser.parse_args(["--probe-wait", "2.5"]), ProbeConfig) == {
        "probe_wait_s": 2.5
    }


def test_an_added_key_is_documented_in_its_table() -> None:
    rows = tables(ProbeConfig)[""].splitlines()
    assert "| `probe_wait_s` | `1.0` | over 0 to 10 s | live | how long a probe waits;" in (
        "\n".join(rows)
    )
    assert "| `probe_slots` | `4` | 1 to 64 | restart | probes at once |" in rows


def test_a_key_in_a_table_is_named_with_it() -> None:
    with pytest.raises(ConfigError, match=r"config key 'fair_share\.over' must be a number"):
        parse_config({"fair_share": {"over": 0.5}})
    with pytest.raises(ConfigError, match=r"config key 'fair_share' must be a table"):
        parse_config({"fair_share": 1})
    with pytest.raises(ConfigError, match=r"unknown config key 'fair_share\.lag'"):
        parse_config({"fair_share": {"lag": 1}})


def test_a_moved_key_is_refused_naming_its_new_place() -> None:
    with pytest.raises(ConfigError, match=r"'fair_share_lag_s' is now 'fair_share\.lag_s'"):
        parse_config({"fair_share_lag_s": 0.001})


def test_every_key_has_a_doc_and_a_default_its_own_kind_accepts() -> None:
    for entry in declared(SidecarConfig):
        assert entry.key.doc, entry.name
        if entry.default is not None and not isinstance(entry.default, tuple):
            raw = getattr(entry.default, "value", entry.default)  # an enum's TOML spelling
            assert entry.key.kind.read(entry.name, raw) == entry.default, entry.name


def _quoted_names(source: str, keys: set[str]) -> list[str]:
    """Key names a module spells in a string: whole, quoted as messages quote keys, or bare in
    a message's text (a name with `_` or `.` in it, which no English word is); docstrings and
    the settings' doc lines (which name keys in backticks) left out."""
    tree = ast.parse(source)
    docs = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            found += [key for key in keys if _spells(node.value, key)]
    return found


def _spells(text: str, key: str) -> bool:
    if text == key or f"'{key}'" in text:
        return True
    bare = rf"(?<![\w.`']){re.escape(key)}(?![\w`'])"
    return ("_" in key or "." in key) and re.search(bare, text) is not None


def test_no_config_key_is_spelled_as_a_string_in_the_server_more_than_once() -> None:
    keys = {entry.name for entry in declared(SidecarConfig)}
    keys |= {name.rpartition(".")[2] for name in keys}
    spelled = [
        key for path in SERVER.rglob("*.py") for key in _quoted_names(path.read_text(), keys)
    ]
    assert sorted({key for key in spelled if spelled.count(key) > 1}) == []


def test_no_hand_written_list_of_live_keys_remains() -> None:
    reload = (SERVER / "dsh_system_prompt_server" / "sidecar" / "reload.py").read_text()
    assert not re.search(r"LIVE_KEYS|AUTH_KEYS|frozenset\(", reload)
