"""Config reload in a running `serve`: a changed file (or SIGHUP) changes the next assembly;
a bad file changes nothing and is logged; what needs a restart says so."""

from __future__ import annotations

import contextlib
import signal
from pathlib import Path

import dsh_system_prompt as dsp
import grpc
import pytest
from dsh_system_prompt_server import Registry, RegistrySettings, load_config
from dsh_system_prompt_server.registry import RegistryError
from dsh_system_prompt_server.sidecar.reload import Reloader
from helpers import (
    ClientFactory,
    SidecarFactory,
    eventually,
    rejection,
    section_names,
    tool,
    tool_names,
)
from processes import Served, replace_file, serve, serve_config

ORDER = 'tool_order = ["b", "<unlisted-tools>", "a"]\n'


def serving(
    config: Path, text: str, poll: str = "0.1"
) -> contextlib.AbstractAsyncContextManager[tuple[Served, dsp.Client]]:
    """`serve` on `config`, first holding `text`, looked at every `poll` seconds (0: only
    on SIGHUP); and a client of it."""
    return serve_config(config, text, "--config-poll", poll)


async def persona(client: dsp.Client) -> str:
    sections = (await client.assemble()).sections
    return next(s.text for s in sections if s.name == dsp.PERSONA_SECTION)


async def test_an_edited_config_file_changes_the_next_assembly(tmp_path: Path) -> None:
    config = tmp_path / "sidecar.toml"
    async with serving(config, 'persona = "Before."\n') as (served, client):
        assert await persona(client) == "Before."
        replace_file(config, 'persona = "After."\n')

        async def after() -> bool:
            return await persona(client) == "After."

        await eventually(after, "the new persona", timeout=10)
        assert served.process.returncode is None  # the same process: no restart


async def test_sighup_reloads_the_tool_order(tmp_path: Path) -> None:
    config = tmp_path / "sidecar.toml"
    async with serving(config, "", poll="0") as (served, client):
        await client.tools([tool("a"), tool("b")])
        assert tool_names(await client.assemble()) == ["a", "b"]
        replace_file(config, ORDER)
        served.process.send_signal(signal.SIGHUP)

        async def reordered() -> bool:
            return tool_names(await client.assemble()) == ["b", "a"]

        await eventually(reordered, "the reloaded tool order", timeout=10)
        assert "config reloaded from" in served.logs()


async def test_a_bad_edit_changes_nothing_and_is_logged(tmp_path: Path) -> None:
    config = tmp_path / "sidecar.toml"
    async with serving(config, 'persona = "Kept."\n' + ORDER) as (served, client):
        await client.tools([tool("a"), tool("b")])
        replace_file(config, 'persona = "Lost."\ntool_order = ["b", "a"]\n')  # no <unlisted-tools>
        await eventually(lambda: "keeping the running config" in served.logs(), "the log line")
        assert '"<unlisted-tools>"' in served.logs().split("keeping the running config")[1]
        assembly = await client.assemble()
        assert await persona(client) == "Kept."
        assert tool_names(assembly) == ["b", "a"]


async def test_a_key_that_needs_a_restart_says_so_and_keeps_its_value(tmp_path: Path) -> None:
    config = tmp_path / "sidecar.toml"
    replace_file(config, 'persona = "One."\n')
    async with serve(
        "--listen", "127.0.0.1:0", "--config", str(config), "--config-poll", "0.1"
    ) as served:
        replace_file(config, 'persona = "Two."\nmetrics_listen = "127.0.0.1:1"\n')
        await eventually(lambda: "metrics_listen" in served.logs(), "the restart notice")
        assert "config key 'metrics_listen' changed" in served.logs()
        assert "takes effect only at a restart" in served.logs()
        async with dsp.connect(served.address) as client:
            assert await persona(client) == "Two."  # the live key applied all the same


async def test_reloading_the_identity_switch_and_persona_emits_change_events() -> None:
    registry = Registry(RegistrySettings(persona="Old."))
    subscription = registry.changes.subscribe(16)
    changed = registry.reconfigure(RegistrySettings(persona="New.", include_harness_identity=False))
    assert changed == ["persona", "include_harness_identity"]
    events = [await subscription.next() for _ in range(2)]
    assert [(e.kind.value, e.action.value, e.name) for e in events] == [  # type: ignore[union-attr]
        ("section", "unregistered", "harness:identity"),
        ("section", "updated", dsp.PERSONA_SECTION),
    ]
    assembly = await registry.assemble()
    assert [s.text for s in assembly.sections] == ["New."]


async def test_reloading_other_settings_emits_a_config_event_per_key() -> None:
    registry = Registry()
    revision = registry.revision
    subscription = registry.changes.subscribe(16)
    registry.reconfigure(
        RegistrySettings(include_runtime_context=False, tool_order=("<unlisted-tools>",))
    )
    events = [await subscription.next() for _ in range(2)]
    assert {(e.kind.value, e.name) for e in events} == {  # type: ignore[union-attr]
        ("config", "include_runtime_context"),
        ("config", "tool_order"),
    }
    assert registry.revision == revision + 2


async def test_a_watcher_sees_a_reload_as_change_events(tmp_path: Path) -> None:
    config = tmp_path / "sidecar.toml"
    async with serving(config, "") as (_, client):
        changes = await client.watch_changes()
        replace_file(config, "include_runtime_context = false\n")
        event = await anext(aiter(changes))
        assert isinstance(event, dsp.ChangeEvent)
        assert (event.kind, event.action, event.name) == (
            "config",
            "registered",
            "include_runtime_context",
        )
        await client.context("cwd", 1, "cwd: /work")
        assert (await client.assemble()).contexts == []
        assert section_names(await client.assemble())[0] == "harness:identity"


async def test_a_config_file_read_mid_write_is_not_applied(
    make_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    config = tmp_path / "sidecar.toml"
    replace_file(config, 'persona = "Before."\n')
    sidecar = await make_sidecar(persona="Before.")
    reloader = Reloader(sidecar, str(config), lambda: load_config(config))
    replace_file(config, "")  # `>` truncates first: one poll may see the file empty
    assert reloader.poll() is None
    assert (await sidecar.registry.assemble()).sections[-1].text == "Before."
    replace_file(config, 'persona = "After."\n')
    assert reloader.poll() is None  # seen once: maybe still being written
    assert reloader.poll() is not None
    assert (await sidecar.registry.assemble()).sections[-1].text == "After."


@pytest.mark.parametrize(
    "bad",
    [b'persona = "caf\xe9"\n', b'auth_token_file = "\\u0000"\n'],
    ids=["not-utf8", "nul-in-a-file-name"],
)
async def test_the_poller_logs_a_bad_edit_and_applies_the_next_good_one(
    tmp_path: Path, bad: bytes
) -> None:
    config = tmp_path / "sidecar.toml"
    async with serving(config, 'persona = "One."\n') as (served, client):
        config.write_bytes(bad)
        await eventually(lambda: "keeping the running config" in served.logs(), "the log line")
        assert "Traceback" not in served.logs()
        replace_file(config, 'persona = "Two."\n')

        async def applied() -> bool:
            return await persona(client) == "Two."

        await eventually(applied, "the next good edit", timeout=10)


async def test_a_global_section_named_like_a_switched_off_builtin_is_refused(
    make_sidecar: SidecarFactory, connect: ClientFactory
) -> None:
    sidecar = await make_sidecar(include_harness_identity=False)
    client = await connect(sidecar.address)
    error = await rejection(client.section("harness:identity", 0, "I am someone else."))
    assert (error.code, error.reason) == (grpc.StatusCode.ALREADY_EXISTS, dsp.Reason.DUPLICATE_NAME)
    assert "reserved for the built-in section" in str(error)


async def test_the_identity_switch_can_go_off_on_and_off_again() -> None:
    off = RegistrySettings(include_harness_identity=False)
    registry = Registry(off)
    with pytest.raises(RegistryError):
        registry.register_section("session", None, "harness:identity", 0, "Someone else.")
    registry.reconfigure(RegistrySettings())
    assert (await registry.assemble()).sections[0].name == "harness:identity"
    registry.reconfigure(off)
    assert [s.name for s in (await registry.assemble()).sections] == [dsp.PERSONA_SECTION]


async def test_a_reload_applies_the_cache_byte_bounds_it_says_it_applied(
    make_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    config = tmp_path / "sidecar.toml"
    replace_file(
        config, "[limits]\nmax_response_cache_bytes = 1048576\nmax_report_history_bytes = 2097152\n"
    )
    sidecar = await make_sidecar()
    reloaded = Reloader(sidecar, str(config), lambda: load_config(config)).reload("SIGHUP")
    assert reloaded is not None
    assert reloaded.applied == [
        "limits.max_response_cache_bytes",
        "limits.max_report_history_bytes",
    ]
    assembler = sidecar.state.assembler
    assert (assembler.responses.max_bytes, assembler.parts.max_bytes) == (1048576, 1048576)
    assert sidecar.state.reports.max_bytes == 2097152
