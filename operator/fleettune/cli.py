"""The `fleettune` command: a thin dispatcher to each tool's own module.

Each command lives in the module that owns its concept and exposes ``main(argv) -> int``
with its own argparse parser, so commands stay independent and import only what they use
(the heavy optimiser stack is not loaded for `fleettune cluster status`).
"""

from __future__ import annotations

import importlib
import sys

COMMANDS: dict[str, tuple[str, str]] = {
    "cluster": ("fleettune.cluster.cli", "start, stop or inspect the local control plane and simulated GPU fleet"),
    "operator": ("fleettune.controller.run", "run the operator against the current kubeconfig"),
    "simulate": ("fleettune.sim.cli", "answer trial Pods on fake GPU nodes (recordings; user source via NVRTC)"),
    "demo": ("fleettune.demo", "local control plane + fleet + operator + examples/convolution-fleet.yaml"),
    "report": ("fleettune.report", "per-pool table and an HTML/PNG report of a run"),
    "predict": ("fleettune.predict", "recommend a configuration for a problem size that was never tuned"),
    "crd": ("fleettune.crd", "print the TuningRun CustomResourceDefinition generated from the models"),
    "bench": ("fleettune.bench", "benchmarks: `bench space|strategy|warmstart|load|memory`"),
}


def _usage() -> str:
    lines = ["usage: fleettune COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<10} {doc}" for name, (_, doc) in COMMANDS.items()]
    lines += ["", "Run `fleettune COMMAND --help` for the options of one command."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if args[0] == "--version":
        from fleettune import __version__

        print(__version__)
        return 0
    entry = COMMANDS.get(args[0])
    if entry is None:
        print(f"fleettune: unknown command {args[0]!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(entry[0])
    try:
        return int(module.main(args[1:]) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
