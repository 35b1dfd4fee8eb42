"""A replayed agent session under tool churn, in the sorted and the stable tool order side
by side (`tool_order_mode`): the prefix bytes each turn keeps, and where the tools prefix
breaks."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import dsh_system_prompt as dsp

from .. import procs
from ..report import Figure, X, at_least, at_most
from ..stats import ratio
from .build import figure
from .harness import Harness

TURNS, CHURNS, RECONNECTS = 100, 20, 10
REMOVALS = 8  # of the churns; the others add a tool
SEED = 36
KEY = "replayed-conversation"
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"path": {"type": "string", "description": "the file or folder to act on"}},
    "required": ["path"],
}
BASE = ["bash", "edit", "glob", "grep", "read", "todo_write", "web_fetch", "write"]
MCP = ["mcp__fs__list", "mcp__fs__stat", "mcp__fs__tree", "mcp__git__log", "mcp__git__status"]


def _tool(name: str) -> dsp.ToolSchema:
    return dsp.ToolSchema(name, f"The {name} tool: acts on a path, answers in text.", SCHEMA)


@dataclass
class Side:
    """One sidecar in one tool order mode, a session on it, and what its turns kept."""

    mode: str
    sidecar: procs.ServerProcess
    client: dsp.Client
    added: dict[str, Callable[[], Awaitable[None]]] = field(default_factory=dict)
    mcp_off: Callable[[], Awaitable[None]] | None = None
    kept_bytes: list[int] = field(default_factory=list)
    prefix_bytes: list[int] = field(default_factory=list)
    breaks: int = 0  # turns whose report broke the prefix
    tool_breaks: list[int] = field(default_factory=list)  # turns whose tool list was no
    # continuation of the last one's (the tools prefix broke)
    last: list[str] = field(default_factory=list)

    async def turn(self, index: int) -> None:
        assembly = await self.client.assemble(
            report=True, report_key=KEY, prefix_layout="tools-first"
        )
        report = assembly.report
        assert report is not None
        names = [tool.name for tool in assembly.tools]
        if index and names[: len(self.last)] != self.last:
            self.tool_breaks.append(index)
        self.last = names
        if index:  # the first turn has nothing to keep
            self.kept_bytes.append(report.stability.stable_bytes)
            self.prefix_bytes.append(report.stability.prefix.bytes)
            self.breaks += bool(report.stability.reason)

    async def reconnect(self, order: list[str]) -> None:
        """The MCP server reconnects: its tools registered anew, listed in `order`."""
        if self.mcp_off is not None:
            await self.mcp_off()
        self.mcp_off = await self.client.tools([_tool(name) for name in order])


def _script() -> list[tuple[str, str]]:
    """Each turn's event before it is assembled: ("add" | "remove", tool), ("reconnect", ""),
    or ("", "") for none; the same every run."""
    rng = random.Random(SEED)
    events: list[tuple[str, str]] = [("", "")] * TURNS
    churn_turns = sorted(rng.sample(range(2, TURNS), CHURNS + RECONNECTS))
    kinds = ["add"] * (CHURNS - REMOVALS) + ["remove"] * REMOVALS + ["reconnect"] * RECONNECTS
    rng.shuffle(kinds)
    present: list[str] = []
    fresh = iter(f"mcp__{rng.choice('abcdefghijklmnopqrstuvwxyz')}{i:02d}" for i in range(99))
    for turn, kind in zip(churn_turns, kinds, strict=True):
        if kind == "remove" and not present:
            kind = "add"
        if kind == "add":
            name = next(fresh)
            present.append(name)
            events[turn] = ("add", name)
        elif kind == "remove":
            name = present.pop(rng.randrange(len(present)))
            events[turn] = ("remove", name)
        else:
            events[turn] = ("reconnect", "")
    return events


async def tool_order_churn(h: Harness) -> list[Figure]:
    """100 turns of one conversation (a reported assembly each, tools first), 20 tools added
    or removed and 10 MCP reconnects listing its tools in another order, on a sidecar
    sorting tools and a twin keeping them stable."""
    del h  # its own two sidecars: the order is a config key
    events = _script()
    rng = random.Random(SEED + 1)
    sides: list[Side] = []
    try:
        for mode in ("sorted", "stable"):
            sidecar = await procs.start_sidecar(
                config={"tool_order_mode": mode}, label=f"sidecar-tool-order-{mode}"
            )
            client = await dsp.connect(sidecar.address, client_name=f"bench-tool-order-{mode}")
            sides.append(Side(mode, sidecar, client))
            await client.section("guide", 10, "You are a careful coding agent. " * 40)
            await client.tools([_tool(name) for name in BASE])
            await sides[-1].reconnect(MCP)
        removals: list[int] = []
        for index, (kind, name) in enumerate(events):
            order = rng.sample(MCP, len(MCP)) if kind == "reconnect" else []
            for side in sides:
                if kind == "add":
                    side.added[name] = await side.client.tools([_tool(name)])
                elif kind == "remove":
                    await side.added.pop(name)()
                elif kind == "reconnect":
                    await side.reconnect(order)
            if kind == "remove":
                removals.append(index)
            await asyncio.gather(*(side.turn(index) for side in sides))
    finally:
        for side in sides:
            await side.client.close()
            await side.sidecar.stop()
    by_mode = {side.mode: side for side in sides}
    sorted_, stable = by_mode["sorted"], by_mode["stable"]
    mean = {side.mode: sum(side.kept_bytes) / len(side.kept_bytes) for side in sides}
    unexplained = [turn for turn in stable.tool_breaks if turn not in removals]
    details = {
        "turns": TURNS,
        "adds": CHURNS - len(removals),
        "removals": len(removals),
        "reconnects": RECONNECTS,
        **{
            f"{side.mode}_{what}": value
            for side in sides
            for what, value in (
                ("kept_bytes_per_turn", round(mean[side.mode])),
                ("kept_share", round(sum(side.kept_bytes) / sum(side.prefix_bytes), 3)),
                ("prefix_breaks", side.breaks),
                ("tools_prefix_breaks", len(side.tool_breaks)),
            )
        },
        "method": "two sidecar processes, tool_order_mode sorted and stable, the same replayed "
        "session (seeded): a section, 8 tools, an MCP registration of 5 and tools added (names "
        "landing mid-list when sorted) and removed; each turn one reported assembly "
        "(report_key, tools-first) on each; kept bytes are the report's stable_bytes",
    }
    kept = ratio(mean["stable"], mean["sorted"])
    return [
        figure(
            "tool_order_kept_bytes",
            "prefix bytes kept per turn under tool churn, stable / sorted order",
            kept,
            X,
            at_least(kept, 1.0, "≥ {:g}x"),
            details,
            display=f"{kept:.2f}x ({mean['stable']:.0f} B / {mean['sorted']:.0f} B)",
        ),
        figure(
            "tool_order_prefix_breaks",
            "stable order: tools-prefix breaks on turns without a removal",
            len(unexplained),
            "breaks",
            at_most(len(unexplained), 0),
            {
                "unexplained_turns": unexplained,
                "removal_turns": removals,
                "stable_tools_prefix_break_turns": stable.tool_breaks,
                "sorted_tools_prefix_break_turns": sorted_.tool_breaks,
            },
            digits=0,
            display=(
                f"{len(unexplained)} (stable {len(stable.tool_breaks)}, sorted"
                f" {len(sorted_.tool_breaks)}, removals {len(removals)})"
            ),
        ),
    ]
