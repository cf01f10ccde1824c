"""The command line of `fleettune bench timeline`: its arguments, and `main`, which runs
the jobs and prints the tables (the package's docstring is the command's description).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from fleettune_dev.bench.timeline.model import FLEET_MODES, KT_PREFIX, PRUNE_SLOWER_THAN, FleetModel
from fleettune_dev.bench.timeline.report import format_space_table, format_summary, save_plots
from fleettune_dev.bench.timeline.runner import Job, run_all, timed_space, trace_keys
from fleettune_dev.bench.timeline.stats import (
    clairvoyant_s,
    compare,
    mean_of,
    random_expectation_s,
    run_metrics,
    summarise,
)
from fleettune_dev.sim.startup import PodStartup
from fleettune_job.ahead import MAX_COMPILE_WORKERS
from fleettune_job.protocol import PRUNE_RUNS

DEFAULT_MODES = ("pod", "batch", "kernel_tuner:genetic_algorithm", "kernel_tuner:bayes_opt",
                 "kernel_tuner:random_sample")
# The recorded spaces live next to the repository (../shared/data/spaces, data/README.md).
DEFAULT_SPACES = Path(__file__).resolve().parents[4].parent / "shared" / "data" / "spaces"


def _int_list(items: Sequence[str]) -> list[int]:
    return [int(v) for item in items for v in str(item).split(",") if v.strip()]


def parse_args(argv: list[str]) -> argparse.Namespace:
    from fleettune_dev.bench import timeline

    p = argparse.ArgumentParser(prog="fleettune bench timeline", description=timeline.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cache", action="append", default=[],
                   help="Kernel Tuner cache file (repeatable; default: every one in --spaces)")
    p.add_argument("--spaces", default=str(DEFAULT_SPACES), help="directory of recorded spaces (default %(default)s)")
    p.add_argument("--modes", default=",".join(DEFAULT_MODES),
                   help="comma list of pod, batch, kernel_tuner:<strategy> (default %(default)s)")
    p.add_argument("--gpus", action="append", default=[], help="pool sizes, repeatable or comma list (default 1,4)")
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--budget", type=int, default=220, help="evaluations per run")
    p.add_argument("--stop-at", type=float, default=0.99,
                   help="end a run once it reaches this fraction of the optimum (0 runs the whole budget)")
    p.add_argument("--strategy", default="bayes", help="fleettune's strategy for pod and batch")
    p.add_argument("--option", action="append", default=[], help="fleettune strategy option KEY=VALUE")
    p.add_argument("--startup-p50", type=float, default=2.0, help="Pod + CUDA start-up median, s")
    p.add_argument("--startup-p99", type=float, default=5.0, help="Pod + CUDA start-up 99th percentile, s")
    p.add_argument("--cpus", type=int, default=MAX_COMPILE_WORKERS,
                   help="compile processes of a batched Pod (default: the job image's most, %(default)s)")
    p.add_argument("--pod-seconds", type=float, default=60.0, help="GPU time a batched Pod aims at")
    p.add_argument("--max-batch", type=int, default=16)
    stream = p.add_mutually_exclusive_group()
    stream.add_argument("--stream-poll", type=float, default=0.0, metavar="S",
                        help="the operator reads running batched Pods' answers (their log lines) at every step, "
                             "stepping at least every S seconds (default 0: at each answer, as it does)")
    stream.add_argument("--no-stream", dest="stream_poll", action="store_const", const=None,
                        help="the operator learns a batched Pod's answers only when it ends "
                             "(FLEETTUNE_FOLLOW_ANSWERS=0)")
    p.add_argument("--prune-slower-than", type=float, default=PRUNE_SLOWER_THAN, metavar="F",
                   help=f"as the operator's kernel.pruneSlowerThan: stop benchmarking a configuration after "
                        f"{PRUNE_RUNS} runs whose median is over F x the best time known when its Pod was created, "
                        f"unverified; "
                        f"0: every run recorded (default: {PRUNE_SLOWER_THAN:g})")
    p.add_argument("--framework-on-gpu", action="store_true",
                   help="add Kernel Tuner's recorded framework time to every configuration's GPU time")
    p.add_argument("--jobs", type=int, default=1, help="worker processes (each measures its own latency)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per worker")
    p.add_argument("--traces", help="JSON-lines file of finished runs: appended to, and resumed from")
    p.add_argument("--json", dest="json_out", help="write every run's metrics and the summary here")
    p.add_argument("--plot", help="directory for one best-so-far vs wall-clock plot per space")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    return p.parse_args(argv)


def _what_if(model: FleetModel) -> str:
    out = ""
    if model.stream_poll_s is None:
        out += ", answers read only when their Pod ends"
    elif model.stream_poll_s:
        out += f", answers read from running Pods every {model.stream_poll_s:g} s"
    if model.prune_slower_than != PRUNE_SLOWER_THAN:
        out += (f", benchmarks stopped after {PRUNE_RUNS} runs over {model.prune_slower_than:g} x the best"
                if model.prune_slower_than else ", no pruning")
    return out


def default_caches(directory: Path) -> list[str]:
    """The Kernel Tuner caches in ``directory`` (other formats, like the T4 copy, skipped)."""
    out = []
    for path in sorted(directory.glob("*.json*")):
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as fh:
            head = fh.read(4096)
        if '"tune_params"' in head:
            out.append(str(path))
    return out


def main(argv: list[str]) -> int:
    from fleettune_dev.bench.strategy import parse_options

    args = parse_args(argv)
    caches = args.cache or default_caches(Path(args.spaces))
    if not caches:
        print(f"no Kernel Tuner caches given and none in {args.spaces}", file=sys.stderr)
        return 2
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for m in modes:
        if m not in FLEET_MODES and not (m.startswith(KT_PREFIX) and len(m) > len(KT_PREFIX)):
            print(f"--modes: unknown mode {m!r} (pod, batch, kernel_tuner:<strategy>)", file=sys.stderr)
            return 2
    gpus = _int_list(args.gpus) or [1, 4]
    options = parse_options(args.option, args.strategy)
    try:
        model = FleetModel(PodStartup(args.startup_p50, args.startup_p99), args.cpus, args.pod_seconds,
                           args.max_batch, args.framework_on_gpu, args.stream_poll, args.prune_slower_than)
    except ValueError as exc:
        print(f"fleettune bench timeline: {exc}", file=sys.stderr)
        return 2
    stop_at = args.stop_at if args.stop_at > 0 else None
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    jobs = []
    # Seed-major, so a run cut short (resumed from --traces) has about as many seeds everywhere.
    for seed in seeds:
        for path in caches:
            for mode in modes:
                for g in gpus if mode in FLEET_MODES else [1]:
                    jobs.append(Job(path, mode, g, seed, args.budget, model, args.strategy, options, stop_at))
    progress = None if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    traces = Path(args.traces) if args.traces else None
    resumed = len({j.key() for j in jobs} & set(trace_keys(traces)))
    t0 = time.perf_counter()
    done = run_all(jobs, args.jobs, args.threads, traces, progress)
    elapsed = time.perf_counter() - t0
    spaces = {Path(p).name: timed_space(p) for p in caches}
    optima = {name: ts.replay.optimum for name, ts in spaces.items()}
    runs = [done[j.key()] for j in jobs]
    metrics = [run_metrics(r, optima[r.space]) for r in runs]
    groups: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for m in metrics:
        groups.setdefault((m["space"], m["mode"], m["gpus"]), []).append(m)
    summaries = [summarise(ms) for ms in groups.values()]
    print(f"fleettune bench timeline: {len(caches)} spaces, seeds {args.first_seed}..{seeds[-1]}, budget "
          f"{args.budget}, GPUs {gpus}, stop at {stop_at}; start-up p50 {model.startup.p50_s:g} s p99 "
          f"{model.startup.p99_s:g} s, {model.cpus} compile processes, Pods aim at {model.pod_seconds:g} s, "
          f"batches ≤ {model.max_batch}{', framework time on the GPU' if model.framework_on_gpu else ''}"
          f"{_what_if(model)}; "
          f"{len(jobs)} runs ({resumed} from --traces), {elapsed:.0f} s\n")
    for path in caches:
        rows = [s for s in summaries if s["space"] == Path(path).name]
        rows.sort(key=lambda s: (s["mode"].startswith(KT_PREFIX), s["mode"], s["gpus"]))
        print(format_space_table(rows) + "\n")
    floors = {(name, g): mean_of(clairvoyant_s(ts, model, g, seed) for seed in seeds)
              for name, ts in spaces.items() for g in gpus}
    cmp = compare(summaries, gpus, floors, {name: random_expectation_s(ts) for name, ts in spaces.items()})
    print(format_summary(cmp, spaces, model))
    if args.plot:
        for p in save_plots(runs, optima, Path(args.plot)):
            print(f"plot: {p}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({
            "params": {"caches": caches, "modes": modes, "gpus": gpus, "seeds": list(seeds), "budget": args.budget,
                       "stop_at": stop_at, "strategy": args.strategy, "options": options, "model": asdict(model)},
            "runs": metrics, "summary": summaries, "compare": cmp, "elapsed_s": elapsed,
        }, indent=2, default=float))
    return 0
