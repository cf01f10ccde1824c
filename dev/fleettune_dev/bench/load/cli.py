"""The command line of `fleettune bench load`: its arguments and `main` (the package's
docstring is the command's description).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from fleettune_dev.bench.load.benchmark import run_benchmark
from fleettune_job.protocol import (
    MAX_BATCH,
)


def trials_per_pod(text: str) -> int:
    """``--trials-per-pod``: an integer within the protocol's batch limit."""
    try:
        k = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 1 <= k <= MAX_BATCH:
        raise argparse.ArgumentTypeError(f"must be 1-{MAX_BATCH}")
    return k


def main(argv: list[str]) -> int:
    from fleettune_dev.bench import load

    parser = argparse.ArgumentParser(prog="fleettune bench load", description=load.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, default=300, help="GPUs in the fleet (default 300)")
    parser.add_argument("--pools", type=int, default=3, help="node pools (default 3)")
    parser.add_argument("--gpus-per-node", type=int, default=4)
    parser.add_argument("--runs", type=int, default=20, help="concurrent TuningRuns (default 20)")
    parser.add_argument("--trials", type=int, default=10_000, help="trials in total (default 10 000)")
    parser.add_argument("--trial-seconds", type=float, default=20.0,
                        help="simulated duration of one trial (default 20 s), all of it compile time: a "
                        "batch Pod compiles up to 4 configurations at once (the job's compile-ahead pool)")
    parser.add_argument("--trials-per-pod", type=trials_per_pod, default=1, metavar="K",
                        help=f"configurations each trial Pod measures (spec.budget.trialsPerPod, 1-{MAX_BATCH}; "
                        "default 1: one per Pod)")
    parser.add_argument("--pod-startup", action="store_true",
                        help="have the simulator model each Pod's start-up (interpreter, CUDA context: "
                        "p50 ≈ 2 s, p99 ≈ 5 s) before its first configuration")
    parser.add_argument("--strategy", default="random", choices=["random", "bayes", "genetic"])
    parser.add_argument("--parallelism", type=int, default=0,
                        help="trials at once per run and pool (default: enough to oversubscribe the pool)")
    parser.add_argument("--oversubscribe", type=float, default=1.25,
                        help="with the default parallelism: Jobs in flight per GPU of a pool (default 1.25)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="give up after this many seconds")
    parser.add_argument("--state-dir", default=None, help="where the cluster lives (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="leave the cluster running afterwards")
    parser.add_argument("--json", default=None, help="also write the report as JSON to this file")
    parser.add_argument("--profile", default=None, metavar="FILE",
                        help="sample the operator with py-spy into FILE and report where its CPU goes")
    parser.add_argument("-q", "--quiet", action="store_true")
    args = parser.parse_args(argv)
    report = run_benchmark(args)
    print(report.render())
    if args.json:
        Path(args.json).write_text(json.dumps(asdict(report), indent=2, default=str))
    ok = (report.finished and not report.audit)
    return 0 if ok else 1
