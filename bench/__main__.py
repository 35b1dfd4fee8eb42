"""`python -m bench`: measure every figure, print the table, write the JSON and the docs.

    python -m bench                       # everything (what `make bench` runs)
    python -m bench --only listeners,throughput_vs_bare --quick   # a subset, fewer iterations
    python -m bench --docs-only           # regenerate docs/benchmarks.md from results.json
    python -m bench --only go_client_assemble --merge   # one figure into the latest run

A partial or quick run prints its table but writes nothing unless --write is given
(which writes it alone) or --merge (which puts its figures into results.json in place
of those with the same key, each saying when and under what load it was measured).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import time

from . import figures, procs, report


async def measure(names: list[str], budget: figures.Budget) -> list[report.Figure]:
    measured: list[report.Figure] = []
    try:
        harness = await figures.Harness.start(budget)
        try:
            for name in names:
                figures.collect_garbage()
                started = time.perf_counter()
                print(f"measuring {name} ...", file=sys.stderr, flush=True)
                measured += await figures.ALL[name](harness)
                print(f"  {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
        finally:
            await harness.close()
    except BaseException:
        print(f"the servers' logs are in {procs.LOG_DIR}", file=sys.stderr)
        raise
    shutil.rmtree(procs.LOG_DIR, ignore_errors=True)  # kept only when something failed
    return measured


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--only", help=f"comma-separated figures of: {', '.join(figures.ALL)}")
    parser.add_argument("--quick", action="store_true", help="a tenth of the iterations")
    parser.add_argument("--write", action="store_true", help="write results of a partial run")
    parser.add_argument(
        "--merge", action="store_true", help="put a partial run's figures into results.json"
    )
    parser.add_argument("--docs-only", action="store_true", help="render docs from results.json")
    args = parser.parse_args(argv)

    if args.docs_only:
        report.write_markdown(json.loads(report.RESULTS.read_text()))
        print(f"wrote {report.DOCS}")
        return 0
    names = args.only.split(",") if args.only else list(figures.ALL)
    unknown = [name for name in names if name not in figures.ALL]
    if unknown:
        parser.error(f"unknown figure(s): {', '.join(unknown)}")

    machine = report.machine()
    started = time.perf_counter()
    measured = asyncio.run(measure(names, figures.Budget(0.1 if args.quick else 1.0)))
    results = report.results(machine, measured, time.perf_counter() - started)
    print()
    print(report.table(measured))
    if os.environ.get("BENCH_DETAILS"):
        print(json.dumps([{f.key: f.details} for f in measured], indent=1))
    if args.merge:
        results = report.merged(
            json.loads(report.RESULTS.read_text()), machine, measured, list(figures.ALL)
        )
    elif (args.only or args.quick) and not args.write:
        return 0
    report.write_json(results)
    report.write_markdown(results)
    written = [str(path.relative_to(report.ROOT)) for path in (report.RESULTS, report.DOCS)]
    print(f"\nwrote {' and '.join(written)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
