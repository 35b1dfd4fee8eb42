"""Text a peer chose (a client's names and messages, the sidecar's words) reaches an
operator's terminal and an agent's log lines with its control characters as escapes: an
ANSI or OSC sequence is not a command to the terminal, a newline does not forge a line."""

from __future__ import annotations

import asyncio
import logging
import os
import pty
import subprocess
from collections.abc import Iterator

import dsh_system_prompt as dsp
import grpc
import pytest
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh_system_prompt_server import Sidecar
from helpers import SidecarFactory, eventually, tool
from processes import cli, running, serve, sidecar_command
from scripted import CALL_TIMEOUT_S, End, Peer, Script, ScriptedSidecar, fail, opened

grpc_max_workers = 8  # pytest-grpc: each open stream of the scripted sidecar holds a thread

RED = "\x1b[31m"  # an ANSI sequence, as a hostile name or message carries it
HOSTILE = f"cwd{RED}\nforged"  # and a newline, to forge a line of its own
SHOWN = "cwd\\x1b[31m\\nforged"  # how either is shown instead
TITLE = "\x1b]0;pwned\x07"  # an OSC sequence (set the window title): rich never prints one


def hostile_failure(_: dsp.AssembleContext) -> str:
    raise RuntimeError(f"no {HOSTILE}")


def lines_with(text: str, output: str) -> list[str]:
    return [line for line in output.splitlines() if text in line]


# -- the CLI -----------------------------------------------------------------------------


async def test_a_refused_assembly_is_one_line_on_stderr_with_its_controls_escaped(
    sidecar: Sidecar, client: dsp.Client
) -> None:
    await client.section("cwd", 20, hostile_failure)  # FAIL: its message is the error's
    code, out, err = await cli("assemble", "--address", sidecar.address)
    assert (code, out) == (1, "")
    assert "\x1b" not in err
    (line,) = err.splitlines()
    assert line.startswith("dsh-system-prompt assemble: ")
    assert line.endswith(f"no {SHOWN}")


async def test_report_says_why_the_prompt_does_not_render_with_its_controls_escaped(
    sidecar: Sidecar, client: dsp.Client
) -> None:
    await client.section(HOSTILE, 10, "Model: {{model}}.")
    code, out, _ = await cli("assemble", "--address", sidecar.address, "--report")
    assert code == 1
    (line,) = lines_with("render fails", out)
    assert line == f'render fails: unknown prompt variable "{{{{model}}}}" in section "{SHOWN}"' + (
        "; registered variables: (none)"
    )


async def cli_output_ok(*args: str) -> str:
    code, out, err = await cli(*args)
    assert code == 0, err
    return out


MARKED = f"x{RED}[bold]y[/bold]"  # a name with an escape and what looks like rich markup
MARKED_SHOWN = "x\\x1b[31m[bold]y[/bold]"


async def marked_changed(client: dsp.Client) -> None:
    """Section MARKED reported under the key "k", then changed."""
    handle = await client.section(MARKED, 10, "v1")
    await client.assemble(report=True, report_key="k")
    await handle.update("v2")


async def test_report_shows_the_clients_part_names_as_text_with_their_controls_escaped(
    sidecar: Sidecar, client: dsp.Client
) -> None:
    await marked_changed(client)
    out = await cli_output_ok(
        "assemble", "--address", sidecar.address, "--report", "--report-key", "k"
    )
    assert "\x1b" not in out
    (row,) = lines_with(f'section "{MARKED_SHOWN}"', out.split("prefix:")[0])
    assert "changed" in row
    (cause,) = lines_with("cache broken by", out)
    assert f'section "{MARKED_SHOWN}"' in cause


async def test_cache_history_shows_the_clients_part_names_with_their_controls_escaped(
    sidecar: Sidecar, client: dsp.Client
) -> None:
    await marked_changed(client)
    await client.assemble(report=True, report_key="k")
    out = await cli_output_ok("cache-history", "--address", sidecar.address, "--key", "k")
    assert "\x1b" not in out
    assert f'  section "{MARKED_SHOWN}": 1 break' in out.splitlines()
    (row,) = lines_with("text changed", out)
    assert row.count(f'section "{MARKED_SHOWN}"') == 2  # first changed, and the reason


async def test_watch_shows_a_registered_name_with_its_controls_escaped(
    sidecar: Sidecar, client: dsp.Client
) -> None:
    async with running("watch", "--address", sidecar.address) as stdout:
        assert b"watching from revision" in await asyncio.wait_for(stdout.readline(), 15)
        await client.section(HOSTILE, 1, "x")
        line = (await asyncio.wait_for(stdout.readline(), 15)).decode()
    assert "\x1b" not in line
    assert line.endswith(f"registered section {SHOWN} (global)\n")


async def test_watch_prompt_shows_the_prompt_and_why_it_fails_with_their_controls_escaped(
    sidecar: Sidecar, client: dsp.Client
) -> None:
    await client.section("rules", 10, f"Be {RED}precise.")
    lines: list[str] = []
    async with running("watch", "--address", sidecar.address, "--prompt") as stdout:

        async def read_until(text: str) -> None:
            while not any(text in line for line in lines):
                lines.append((await asyncio.wait_for(stdout.readline(), 15)).decode())

        await read_until("first report")
        await client.section(HOSTILE, 20, "Model: {{model}}.")  # does not render
        await read_until("render fails")
    shown = "".join(lines)
    assert "\x1b" not in shown
    assert "Be \\x1b[31mprecise." in shown
    assert f'"{{{{model}}}}" in section "{SHOWN}"' in shown


async def test_ls_shows_names_and_client_names_with_their_controls_escaped(
    sidecar: Sidecar,
) -> None:
    async with dsp.connect(sidecar.address, client_name=f"agent{RED}") as client:
        await client.section(MARKED, 1, "x")
        out = await cli_output_ok("ls", "--address", sidecar.address)
    assert "\x1b" not in out
    (row,) = lines_with(MARKED_SHOWN, out)
    assert "agent\\x1b[31m [" in row


def on_a_terminal(*args: str) -> str:
    """What `dsh-system-prompt ARGS` prints with a terminal as its stdout (styled)."""
    parent, child = pty.openpty()
    process = subprocess.Popen(
        [sidecar_command(), *args], stdout=child, stderr=subprocess.DEVNULL, close_fds=True
    )
    os.close(child)
    printed = bytearray()
    while True:
        try:
            chunk = os.read(parent, 65536)
        except OSError:  # the terminal closed: the command ended
            break
        if not chunk:
            break
        printed += chunk
    os.close(parent)
    assert process.wait(30) == 0
    return printed.decode()


async def test_assemble_on_a_terminal_shows_tool_names_and_the_prompt_with_controls_escaped(
    sidecar: Sidecar, client: dsp.Client
) -> None:
    await client.tools([tool(f"bash{TITLE}[bold]")])
    await client.section("rules", 10, f"Be {TITLE}precise.")
    out = await asyncio.to_thread(on_a_terminal, "assemble", "--address", sidecar.address)
    assert "\x1b]" not in out
    assert "bash\\x1b]0;pwned\\x07[bold]" in out
    assert "Be \\x1b]0;pwned\\x07precise." in out


# -- the sidecar's own log lines ---------------------------------------------------------


async def test_the_sidecars_text_log_shows_a_skipped_steps_message_with_controls_escaped() -> None:
    ignore = dsp.FailurePolicy.IGNORE
    async with (
        serve("--listen", "127.0.0.1:0", "--log-format", "text") as served,
        dsp.connect(served.address) as client,
    ):
        await client.section("cwd", 20, hostile_failure, failure_policy=ignore)
        assembly = await client.assemble()
        assert [step.name for step in assembly.skipped] == ["cwd"]
        await eventually(lambda: "went on without" in served.logs(), "the warning")
        logs = served.logs()
    assert "\x1b" not in logs
    (line,) = lines_with("went on without", logs)
    assert f"no {SHOWN}" in line
    assert not lines_with("forged", logs.replace(line, ""))  # no line of its own


# -- the Python client's log lines -------------------------------------------------------


def logged(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


@pytest.fixture
def warned(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """The client's log lines from warning up."""
    caplog.set_level(logging.WARNING, logger="dsh_system_prompt")
    return caplog


@pytest.fixture
async def ejecting(make_sidecar: SidecarFactory) -> Sidecar:
    """A sidecar that ejects a provider at its first timeout, 0.5 s."""
    return await make_sidecar(provider_timeout_s=0.5)


def escaped_line(caplog: pytest.LogCaptureFixture, text: str) -> str:
    """The one log line holding `text`, which carries no raw control character."""
    (line,) = logged(caplog, text)
    assert "\x1b" not in line and "\n" not in line
    return line


async def ejected(client: dsp.Client) -> None:
    """Register section HOSTILE with a provider stuck the first time (longer than its
    time), and assemble: the sidecar ejects it, the client registers it again later."""
    calls: list[int] = []

    async def provide(_: dsp.AssembleContext) -> str:
        calls.append(1)
        if len(calls) == 1:
            await asyncio.sleep(30)
        return "It is noon."

    await client.section(HOSTILE, 10, provide)
    with pytest.raises(dsp.SystemPromptError):
        await client.assemble()


async def test_the_clients_ejection_warning_shows_the_sidecars_message_with_controls_escaped(
    ejecting: Sidecar, warned: pytest.LogCaptureFixture
) -> None:
    async with dsp.connect(ejecting.address) as client:
        await ejected(client)
        await eventually(lambda: logged(warned, "ejected a callback"), "the warning", 10)
    assert f'section provider "{SHOWN}"' in escaped_line(warned, "ejected a callback")


async def test_the_clients_failed_reinstall_warning_shows_the_sidecars_words_escaped(
    ejecting: Sidecar, warned: pytest.LogCaptureFixture
) -> None:
    address = ejecting.address
    async with dsp.connect(address) as client, dsp.connect(address) as other:
        await ejected(client)
        await eventually(
            lambda: all(e.name != HOSTILE for e in ejecting.registry.registrations()),
            "the provider ejected",
        )
        await other.section(HOSTILE, 10, "taken")  # within the re-install's backoff (1 s)
        await eventually(lambda: logged(warned, "again:"), "the warning", 10)
    assert f'prompt section "{SHOWN}" is already registered' in escaped_line(warned, "again:")


async def test_the_local_cache_off_warning_shows_the_sidecars_message_with_controls_escaped(
    scripted: ScriptedSidecar, warned: pytest.LogCaptureFixture
) -> None:
    script = scripted.script = Script()
    async with dsp.connect(scripted.address, call_timeout=CALL_TIMEOUT_S, local_cache=True):
        await eventually(lambda: len(script.watchers) == 1, "the change stream")
        script.watchers[0].outbox.put(End(grpc.StatusCode.INTERNAL, f"broken {HOSTILE}"))
        await eventually(lambda: logged(warned, "local cache off"), "the warning")
    assert f"broken {SHOWN}" in escaped_line(warned, "local cache off")


class Refusing(Script):
    """Refuses its first session with UNAVAILABLE and a hostile message, opens the second
    with a hostile version, and refuses the third (the reconnect after the test cuts
    the second) before opening the fourth."""

    def open_session(self, peer: Peer) -> Iterator[pb.OpenSessionResponse]:
        peer.start = peer.take()
        if len(self.sessions) in (1, 3):
            fail(peer.context, grpc.StatusCode.UNAVAILABLE, f"draining {HOSTILE}")
            return
        yield opened(self.new_id("session-"), sidecar_version=f"v9 {HOSTILE}")
        yield from peer.outgoing()


async def test_the_clients_session_log_lines_show_the_sidecars_words_with_controls_escaped(
    scripted: ScriptedSidecar, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="dsh_system_prompt")
    script = scripted.script = Refusing()
    connecting = dsp.connect(scripted.address, call_timeout=CALL_TIMEOUT_S, wait_for_ready=True)
    async with connecting:
        await eventually(lambda: len(script.sessions) == 2, "the second session")
        script.sessions[1].outbox.put(End(grpc.StatusCode.UNAVAILABLE, "cut"))
        await eventually(lambda: len(script.sessions) == 4, "the reconnect", 10)
        await eventually(lambda: len(logged(caplog, "opened on")) == 2, "the new session")
    lines = [
        *logged(caplog, "waiting for the sidecar"),
        *logged(caplog, "retrying in"),
        *logged(caplog, "opened on"),
    ]
    assert len(lines) == 4
    assert all("\x1b" not in line and "\n" not in line for line in lines)
    assert all(SHOWN in line for line in lines)
