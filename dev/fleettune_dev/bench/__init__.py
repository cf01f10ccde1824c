"""Benchmark commands: `fleettune bench space|strategy|warmstart|load|memory|timeline|job|predict|fleet|triton ...`
(they print tables).

What each measures, its targets, its data and how to run it: docs/benchmarks.md; every flag:
docs/reference/cli.md.
"""

from __future__ import annotations

import importlib
import sys

SUBCOMMANDS = {
    "space": "fleettune_dev.bench.space",
    "strategy": "fleettune_dev.bench.strategy",
    "warmstart": "fleettune_dev.bench.warmstart",
    "load": "fleettune_dev.bench.load",
    "memory": "fleettune_dev.bench.memory",
    "timeline": "fleettune_dev.bench.timeline",
    "job": "fleettune_dev.bench.job",
    "predict": "fleettune_dev.bench.predict",
    "fleet": "fleettune_dev.bench.fleet",
    "triton": "fleettune_dev.bench.tritoncompile",
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in SUBCOMMANDS:
        print("usage: fleettune bench {" + ",".join(SUBCOMMANDS) + "} [ARGS...]", file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    return int(importlib.import_module(SUBCOMMANDS[argv[0]]).main(argv[1:]) or 0)
