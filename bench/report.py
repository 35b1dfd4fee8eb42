"""The figures as a table on stdout, as bench/results.json, and as docs/benchmarks.md."""

from __future__ import annotations

import datetime
import json
import os
import platform
import sys
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, TypedDict

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results.json"
DOCS = ROOT / "docs" / "benchmarks.md"
X = "\N{MULTIPLICATION SIGN}"
NOISE_PCT = 5  # differences between two sidecar processes smaller than this are noise


@dataclass
class Figure:
    """One measured figure; `met` is None for figures that are only reported."""

    key: str
    name: str
    value: float
    unit: str
    target: str
    met: bool | None
    details: dict[str, Any] = field(default_factory=dict)
    display: str = ""  # how the table shows the value, when more than value + unit


class Judged(TypedDict):
    """A figure's `target` words and whether its value `met` them."""

    target: str
    met: bool


def at_most(value: float, limit: float, words: str = "≤ {:g}") -> Judged:
    """`value` ≤ `limit`; `words` say the target with the limit in place of {:g}."""
    return {"target": words.format(limit), "met": value <= limit}


def at_least(value: float, limit: float, words: str = "≥ {:g}") -> Judged:
    return {"target": words.format(limit), "met": value >= limit}


def below(value: float, limit: float, words: str = "< {:g}") -> Judged:
    return {"target": words.format(limit), "met": value < limit}


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count() or 0
    return {
        "nproc": usable,
        "cpu_model": model or platform.processor() or "unknown",
        "python": sys.version.split()[0],
        "grpcio": metadata.version("grpcio"),
        "protobuf": metadata.version("protobuf"),
        "platform": platform.platform(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def _met(figure: Figure) -> str:
    return "n/a" if figure.met is None else ("yes" if figure.met else "NO")


def _value(figure: Figure) -> str:
    if figure.display:
        return figure.display
    if figure.unit.startswith(X):  # a ratio
        return f"{figure.value:.2f}{figure.unit}"
    return f"{figure.value:g} {figure.unit}"


def table(figures: list[Figure]) -> str:
    """A plain-text table: figure, value, target, met."""
    rows = [("figure", "value", "target", "met")]
    rows += [(f.name, _value(f), f.target, _met(f)) for f in figures]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(line.rstrip() for line in lines)


def write_json(results: dict[str, Any], path: Path = RESULTS) -> None:
    path.write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")


def results(machine_info: dict[str, Any], figures: list[Figure], took_s: float) -> dict[str, Any]:
    return {
        "machine": machine_info,
        "took_s": round(took_s, 1),
        "figures": [asdict(f) for f in figures],
    }


def merged(
    latest: dict[str, Any],
    machine_info: dict[str, Any],
    figures: list[Figure],
    order: list[str],
) -> dict[str, Any]:
    """`latest` with `figures` in place of those of the same key; a new key goes after
    the figure before it in `order` (the figures' keys as `make bench` runs them). Each
    merged figure's details say when, and under what load, its own run measured it."""
    run = {"date": machine_info["date"], "load_average": machine_info["load_average"]}
    kept: list[dict[str, Any]] = list(latest["figures"])
    for figure in figures:
        figure.details = {**figure.details, "measured_in_a_run_of_its_own": run}
        keys = [f["key"] for f in kept]
        if figure.key in keys:
            kept[keys.index(figure.key)] = asdict(figure)
            continue
        earlier = order[: order.index(figure.key)] if figure.key in order else order
        at = max((keys.index(k) + 1 for k in earlier if k in keys), default=len(kept))
        kept.insert(at, asdict(figure))
    return {**latest, "figures": kept}


def markdown(results: dict[str, Any]) -> str:
    """docs/benchmarks.md: how to run, the machine, the table, each figure's details."""
    info = results["machine"]
    figures = [Figure(**f) for f in results["figures"]]
    out = [
        "# Benchmarks",
        "",
        "Generated by `make bench` (`.venv/bin/python -m bench`), which measures, prints this",
        "table, writes `bench/results.json` and rewrites this page. Do not edit it by hand.",
        "",
        "The machines these run on are noisy, so each comparison is measured side by side in",
        "the same run, the operations interleaved (each round in a new random order), and the",
        "**ratio** is the figure; absolute times are context. The sidecars run in their own",
        "processes (`dsh-system-prompt serve`); the bench process is the client and hosts the",
        "client-side dynamic providers and listeners.",
        "",
        "Baselines:",
        "",
        "- *empty unary RPC*: `grpc.health.v1.Health/Check` on the same sidecar from the same",
        "  process: on the same channel as a raw-stub call; beside the client's `assemble()`,",
        "  on a channel of its own (the client does not expose its channel).",
        "- *bidi round trip of an empty message*: the sidecar has no echo RPC, so an empty",
        "  message written and read back on a bare `grpc.aio` bidi echo handler (bytes, no",
        "  protobuf) served by its own process (`bench/echo.py`).",
        "- *the static assemble*: `Assemble` with `render: true` on a raw stub, the realistic",
        "  load (30 sections, 10 contexts, 40 tools with ~1 KB schemas, 10 variables).",
        "- *the floor*: a bare `grpc.aio` server in the same venv with the project's stubs and",
        "  grpc health (`bench/floor.py`), answering `Assemble` with the very bytes the sidecar",
        "  answers: what any sidecar of this design costs before its own code. The tax figures",
        "  (memory, start, idle CPU) and the throughput are measured against it in the same run.",
        "",
        "## Latest run",
        "",
        f"- date: {info['date']}",
        f"- machine: {info['nproc']} CPU(s), {info['cpu_model']}; {info['platform']}",
        f"- Python {info['python']}, grpcio {info['grpcio']}, protobuf {info['protobuf']}",
        f"- load average at start: {', '.join(str(x) for x in info['load_average'])}",
        f"- the whole run took {results['took_s']} s",
        "",
        "| figure | value | target | met |",
        "|---|---|---|---|",
    ]
    out += [f"| {f.name} | {_value(f)} | {f.target} | {_met(f)} |" for f in figures]
    unix = next((f for f in figures if f.key == "unix_vs_tcp"), None)
    if unix is not None:
        faster, difference = unix.details["faster"], unix.details["difference_pct"]
        out += ["", f"Transport: {faster} was {difference:g} % faster for the static assemble."]
        if difference < NOISE_PCT:
            out[-1] += f" Under {NOISE_PCT} % is within run-to-run noise: no clear winner."
    out += ["", "## Details", ""]
    for f in figures:
        out += [f"### {f.name}", "", "```json", json.dumps(f.details, indent=2), "```", ""]
    return "\n".join(out)


def write_markdown(results: dict[str, Any], path: Path = DOCS) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(markdown(results))
