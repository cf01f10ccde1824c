"""Benchmark commands: `fleettune bench space|strategy|warmstart|load|memory ...` (they print tables)."""

from __future__ import annotations

import importlib
import sys

SUBCOMMANDS = {
    "space": "fleettune.bench.space",
    "strategy": "fleettune.bench.strategy",
    "warmstart": "fleettune.bench.warmstart",
    "load": "fleettune.bench.load",
    "memory": "fleettune.bench.memory",
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in SUBCOMMANDS:
        print("usage: fleettune bench {" + ",".join(SUBCOMMANDS) + "} [ARGS...]", file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    return int(importlib.import_module(SUBCOMMANDS[argv[0]]).main(argv[1:]) or 0)
