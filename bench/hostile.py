"""The hostile soak: well-behaved clients beside hostile peers, against a calm run.

    python -m bench.hostile [--clients 8] [--seconds 30]     (or `make soak-hostile`)

Twice, each time against a fresh sidecar process: a calm run of the soak's
clients (`bench.soak`: register, assemble, churn), then the same run while
`bench.attacks` does every attack of issues 11, 22 and 34 at once from its own process
(a listener that stops reading, one that reads and never answers, a session that
never reads, huge scope keys, deep JSON, a session flood, malformed templates, idle
watchers (as many as one connection may hold of the 1,000 asked), a 20 KB provider
error, chained listeners (as many as one client may hold of the 400 asked), a 3.5 MiB
scope assembled in 300 scopes, the largest requests the bounds allow, unread listings,
256 prompt watchers, 1,100 idle connections, one connection holding every watch it
may), and issue 34's (`bench.trust_attacks`: no-token, wrong-token, health and
reflection floods, churn in the attackers' own scope, a provider answer over the
message bound, a slow provider beside instant ones, a burst of 150 assemblies with
240 KB answers through one listener, slow plain watchers behind a burst of 1,500
registrations). Then issue 22's memory
findings 2-5 each alone (`bench.hostile_figures`). It passes when the well-behaved
clients see no error but the assemblies in flight during a silent listener's one
timeout, their assembly p99 stays within 2x of the calm run's, and the sidecar's peak
RSS, in the hostile run and in each figure, stays under BUDGET_MIB. The sidecar runs
with the default limits, whose memory budget docs/operations.md states (about 480 MiB
of data on top of an idle sidecar's 70 MiB: 512 MiB is inside it), and with a credential
per well-behaved client and one for every attacker together, as docs/operations.md says
to deploy for quotas and shares per client (so the attackers hold one client's quotas:
their watches past 64 are refused, and counted); `--no-credentials` runs it without,
where over loopback every connection is a client. The machine's load average is
reported: on a shared machine the latencies are noisy. Exit 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from . import hostile_figures, procs
from .attacks import ATTACKS
from .soak import Tally, churn

BUDGET_MIB = 512
P99_FACTOR = 2.0
# Listeners the attackers make silent: the assemblies in flight during their one timeout
# fail, naming them (issue 22), and are counted apart from the errors.
SILENT_LISTENERS = ('listener "stuck"', 'listener "stall"')
LATENESS_TICK_S = 0.01  # how often the clients' own loop is timed


@dataclass(frozen=True)
class Credentials:
    """A credential per well-behaved client and one for every attacker together, as
    docs/operations.md says to deploy for quotas and shares per client."""

    config: dict[str, Any]  # the sidecar's [[credentials]]
    clients: list[str]  # the well-behaved clients' tokens, one each
    hostile: str  # the attackers' token


def credentials(folder: str, clients: int) -> Credentials:
    tokens = {f"soak-{index}": secrets.token_hex(16) for index in range(clients)}
    tokens["hostile"] = secrets.token_hex(16)
    entries = []
    for name, token in tokens.items():
        path = os.path.join(folder, f"{name}.token")
        with open(path, "w") as file:
            file.write(token + "\n")
        entries.append(
            {"name": name, "role": "agent", "scopes": ["*"], "global": True, "token_file": path}
        )
    # the attackers may do what the most trusted agent may: listeners on every assembly too
    entries[-1]["global_listeners"] = True
    hostile = tokens.pop("hostile")
    return Credentials({"credentials": entries}, list(tokens.values()), hostile)


async def run(
    clients: int,
    seconds: float,
    hostile: bool,
    budget_mib: int,
    skip: str = "",
    keys: Credentials | None = None,
) -> dict[str, Any]:
    """One run; with `hostile`, the attackers' process runs beside the clients."""
    label = "hostile" if hostile else "calm"
    config = None if keys is None else keys.config
    sidecar = await procs.start_sidecar(config=config, label=label)
    attackers = None
    tokens: list[str | None] = [None] * clients if keys is None else list(keys.clients)
    try:
        loop = asyncio.get_running_loop()
        if hostile:
            env = os.environ | ({} if keys is None else {"DSP_HOSTILE_TOKEN": keys.hostile})
            attackers = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "bench.attacks",
                sidecar.address,
                str(seconds + 5),
                skip,
                stdout=asyncio.subprocess.PIPE,
                cwd=procs.ROOT,
                env=env,
            )
            await asyncio.sleep(5)  # the attacks are under way before the clients start
        tally = Tally()
        deadline = loop.time() + seconds
        peak = sidecar.rss_kib()
        late: list[float] = []  # how late this process's own timers ran: the clients' loop

        async def sample_memory() -> None:
            nonlocal peak
            while loop.time() < deadline:
                peak = max(peak, sidecar.rss_kib())
                await asyncio.sleep(0.5)

        async def sample_lateness() -> None:
            while loop.time() < deadline:
                due = loop.time() + LATENESS_TICK_S
                await asyncio.sleep(LATENESS_TICK_S)
                late.append(loop.time() - due)

        cpu = _Cpu(sidecar.pid, None if attackers is None else attackers.pid)
        started = time.perf_counter()
        await asyncio.gather(
            sample_memory(),
            sample_lateness(),
            *(churn(sidecar.address, i, deadline, tally, token=tokens[i]) for i in range(clients)),
        )
        elapsed = time.perf_counter() - started
        used = cpu.used()
        seen = None
        if attackers is not None:
            out, _ = await asyncio.wait_for(attackers.communicate(), 60)
            seen = json.loads(out or b"{}")
        latencies = sorted(tally.latencies)
        excused = [e for e in tally.errors if any(name in e for name in SILENT_LISTENERS)]
        errors = [e for e in tally.errors if e not in excused]
        return {
            "seconds": round(elapsed, 1),
            "assemblies": tally.assemblies,
            "errors": len(errors),
            "first_errors": errors[:5],
            "failed_during_a_silent_listeners_timeout": len(excused),
            "p50_ms": _percentile_ms(latencies, 0.5),  # of the assemblies that succeeded
            "p99_ms": _percentile_ms(latencies, 0.99),
            "rss_peak_mib": round(peak / 1024, 1),
            # Whose figures these are: each process's CPU over the clients' run (the sidecar's
            # at 1.0 a second is its one loop saturated) and how late the clients' own loop
            # ran. A clients' loop late by about what their p99 grew would make it the
            # harness's, not the sidecar's.
            "cpu_s": used,
            "clients_loop_late_ms": {
                "p99": _percentile_ms(sorted(late), 0.99),
                "max": _percentile_ms(sorted(late), 1.0),
            },
            **({"attacks": seen} if seen is not None else {}),
        }
    finally:
        if attackers is not None and attackers.returncode is None:
            attackers.kill()
            await attackers.wait()
        await sidecar.stop()


def _percentile_ms(ordered: list[float], share: float) -> float | None:
    if not ordered:
        return None
    return round(1000 * ordered[min(int(len(ordered) * share), len(ordered) - 1)], 2)


class _Cpu:
    """The CPU time the sidecar, the attackers' process and this one (the well-behaved
    clients) use from now on: they share the machine's cores, whatever the loop does."""

    def __init__(self, sidecar: int, attackers: int | None) -> None:
        self._pids = {"sidecar": sidecar} | ({} if attackers is None else {"attackers": attackers})
        self._start = self._now()

    def _now(self) -> dict[str, float]:
        return {name: procs.cpu_seconds(pid) for name, pid in self._pids.items()} | {
            "clients": time.process_time()
        }

    def used(self) -> dict[str, float]:
        now = self._now()
        return {name: round(now[name] - self._start[name], 1) for name in now}


async def hostile_soak(
    clients: int,
    seconds: float,
    budget_mib: int,
    skip: str = "",
    with_figures: bool = True,
    with_credentials: bool = True,
) -> dict[str, Any]:
    load_before = _load_average()
    with tempfile.TemporaryDirectory(prefix="dsp-soak-") as folder:
        keys = credentials(folder, clients) if with_credentials else None
        calm = await run(clients, seconds, hostile=False, budget_mib=budget_mib, keys=keys)
        hostile = await run(
            clients, seconds, hostile=True, budget_mib=budget_mib, skip=skip, keys=keys
        )
    both = calm["p99_ms"] is not None and hostile["p99_ms"] is not None
    ratio = hostile["p99_ms"] / max(calm["p99_ms"], 0.001) if both else None
    figures = await hostile_figures.figures(budget_mib) if with_figures else {}
    report = {
        "clients": clients,
        "credentials": with_credentials,
        "budget_mib": budget_mib,
        "load_average": {"before": load_before, "after": _load_average()},
        "skipped_attacks": [name for name in skip.split(",") if name],
        "calm": calm,
        "hostile": hostile,
        "p99_ratio": None if ratio is None else round(ratio, 2),
        "memory_figures": figures,
    }
    report["ok"] = (
        not calm["errors"]
        and not hostile["errors"]
        and ratio is not None
        and ratio <= P99_FACTOR
        and hostile["rss_peak_mib"] <= budget_mib
        and all(figure["under_budget"] for figure in figures.values())
    )
    return report


def _load_average() -> list[float]:
    return [round(load, 2) for load in os.getloadavg()]


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.hostile", description=__doc__)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--budget-mib", type=int, default=BUDGET_MIB)
    parser.add_argument(
        "--skip", default="", help=f"attacks to leave out, comma-separated: {', '.join(ATTACKS)}"
    )
    parser.add_argument(
        "--no-figures", action="store_true", help="leave out the memory figures (findings 2-5)"
    )
    parser.add_argument(
        "--no-credentials",
        dest="credentials",
        action="store_false",
        help="no credentials: over loopback each connection is a client of its own (by"
        " default each well-behaved client has a credential, and all the attackers one)",
    )
    args = parser.parse_args()
    report = asyncio.run(
        hostile_soak(
            args.clients,
            args.seconds,
            args.budget_mib,
            args.skip,
            not args.no_figures,
            args.credentials,
        )
    )
    print(json.dumps(report, indent=2))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
