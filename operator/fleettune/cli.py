"""The `fleettune` command: a thin dispatcher to each tool's own module.

Each command lives in the module that owns its concept and exposes ``main(argv) -> int``
with its own argparse parser, so commands stay independent and import only what they use
(the heavy optimiser stack is not loaded for `fleettune cluster status`).

The development commands (local cluster, simulator, demo, benchmarks) live in the separate
`fleettune_dev` package, which the operator image does not contain: they are named here as
module strings only, so the runtime package never imports it.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

COMMANDS: dict[str, tuple[str, str]] = {
    "operator": ("fleettune.controller.run", "run the operator against the current kubeconfig"),
    "report": ("fleettune.commands.report", "per-pool table of a run; --html/--png: a report with its figure"),
    "predict": ("fleettune.commands.predict", "recommend a configuration for a problem size that was never tuned"),
    "export": ("fleettune.commands.export", "a run's results as a Kernel Tuner cache or T4 results file"),
    "check": ("fleettune.check", "the operator's checks of TuningRun files before any Job, offline (CI, GitOps)"),
    "crd": ("fleettune.crd", "print the TuningRun CustomResourceDefinition generated from the models"),
}
DEV_PACKAGE = "fleettune_dev"
DEV_COMMANDS: dict[str, tuple[str, str]] = {
    "cluster": ("fleettune_dev.cluster.cli", "start, stop or inspect the local control plane and simulated GPU fleet"),
    "simulate": ("fleettune_dev.sim.cli", "answer trial Pods on fake GPU nodes (recordings; user source via NVRTC)"),
    "demo": ("fleettune_dev.demo", "local control plane + fleet + operator + examples/convolution-fleet.yaml"),
    "bench": ("fleettune_dev.bench",
              "benchmarks: `bench space|strategy|warmstart|predict|load|memory|timeline|job|fleet|triton`"),
}
DEV_INSTALL_HINT = "pip install -e ./dev from a fleettune checkout (`make install` does it)"


def _usage() -> str:
    lines = ["usage: fleettune COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<10} {doc}" for name, (_, doc) in COMMANDS.items()]
    lines += ["", f"development commands (package {DEV_PACKAGE}, not in the operator image):"]
    lines += [f"  {name:<10} {doc}" for name, (_, doc) in DEV_COMMANDS.items()]
    lines += ["", "Run `fleettune COMMAND --help` for the options of one command."]
    return "\n".join(lines)


def dev_installed() -> bool:
    return importlib.util.find_spec(DEV_PACKAGE) is not None


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if args[0] == "--version":
        from fleettune import __version__

        print(__version__)
        return 0
    entry = COMMANDS.get(args[0]) or DEV_COMMANDS.get(args[0])
    if entry is None:
        print(f"fleettune: unknown command {args[0]!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    if args[0] in DEV_COMMANDS and not dev_installed():
        print(f"fleettune {args[0]}: a development command, and the {DEV_PACKAGE} package is not installed: "
              f"{DEV_INSTALL_HINT}", file=sys.stderr)
        return 2
    module = importlib.import_module(entry[0])
    try:
        return int(module.main(args[1:]) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
