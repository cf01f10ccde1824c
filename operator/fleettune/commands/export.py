"""`fleettune export RUN --format kernel-tuner|t4`: a run's results in the autotuning
community's formats, for the tools people already use on them.

* ``kernel-tuner``: a Kernel Tuner cache file. Kernel Tuner replays it without a GPU
  (``tune_kernel(..., simulation_mode=True, cache=FILE)`` with the same ``tune_params``),
  `fleettune predict --cache` reads it, and so do the tools built on Kernel Tuner's caches.
* ``t4``: a T4 results file (the community's results schema, as Kernel Tuner writes it).

One file holds one pool (one GPU model) and one problem size: what a Kernel Tuner cache
describes. The results come from the run's results store, so a finished run, a running
one and one whose operator is gone export alike. One round of the pool is exported (the
latest unless ``--round``): rounds are tuned for different drivers, and a cache holds one
time per configuration. Infrastructure failures are left out (they say nothing about a
configuration); invalid configurations are written as each format marks them. A pool with
no result to write is an error: nothing is written and the command exits 1.

Everything but `main` is pure and works on plain objects.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleettune.api import TuningRunSpec
from fleettune.results import TrialRecord
from fleettune.sizes import ProblemSize, parse_size, pool_key, size_key
from fleettune.space import SearchSpace, SpaceError
from fleettune.space.records import Record, RecordedSpace
from fleettune_job.protocol import Outcome

FORMATS = ("kernel-tuner", "t4")
# An invalid configuration as each format records it: the failure kind of `space.records`
# (Kernel Tuner's CompilationFailedConfig / RuntimeFailedConfig) and T4's finer invalidity.
FAILURE = {
    Outcome.COMPILE_ERROR: ("compile", "compile"),
    Outcome.LAUNCH_ERROR: ("runtime", "runtime"),
    Outcome.RUNTIME_ERROR: ("runtime", "runtime"),
    Outcome.CORRECTNESS_ERROR: ("runtime", "correctness"),
    Outcome.TIMEOUT: ("runtime", "timeout"),
}


class ExportError(ValueError):
    """What cannot be exported, and why (one line)."""


@dataclass(frozen=True)
class PoolChoice:
    target: str
    size: ProblemSize
    key: str  # the records' target label: the target's name, or name.<size> for several sizes


@dataclass
class Export:
    """What one export writes, and what it left out."""

    recorded: RecordedSpace
    pool: PoolChoice
    round: int
    infra_failures: int = 0  # left out: not observations of a configuration
    outside_space: int = 0  # left out: configurations the run's parameters no longer have
    repeated: int = 0  # left out: earlier results of a configuration measured again in the round


def pools_of(spec: TuningRunSpec) -> list[PoolChoice]:
    sizes = spec.kernel.sizes()
    return [PoolChoice(t.name, size, pool_key(t.name, size, len(sizes) > 1)) for t in spec.targets for size in sizes]


def choose_pool(spec: TuningRunSpec, target: str | None = None, size: ProblemSize | None = None) -> PoolChoice:
    """The pool to export: the one named (target and, for runs of several sizes, size), by
    default the first target and size of the spec."""
    pools = pools_of(spec)
    chosen = [p for p in pools if (target is None or p.target == target) and (size is None or p.size == size)]
    if not chosen:
        names = ", ".join(dict.fromkeys(p.target for p in pools))
        sizes = ", ".join(dict.fromkeys(size_key(p.size) for p in pools))
        wanted = ([f"target {target!r}"] if target else []) + ([f"size {size_key(size)}"] if size else [])
        raise ExportError(f"the run has no {' and '.join(wanted)} (targets: {names}; sizes: {sizes})")
    return chosen[0]


def _recorded_at(rec: TrialRecord) -> dict[str, Any]:
    return {"timestamp": rec.recorded_at} if rec.recorded_at else {}


def export_records(spec: TuningRunSpec, records: Sequence[TrialRecord], pool: PoolChoice, fmt: str, *,
                   round_: int | None = None, device_name: str | None = None,
                   metadata: dict[str, Any] | None = None) -> Export:
    """The pool's records of one round as a `RecordedSpace` for the format's writer.

    The space is the run's parameters (every value, no constraints: a cache lists the
    parameters' values, not which combinations are valid). A configuration measured more than
    once in the round keeps its last result."""
    if fmt not in FORMATS:
        raise ExportError(f"unknown format {fmt!r} (formats: {', '.join(FORMATS)})")
    try:
        space = SearchSpace.from_spec([p.dump() for p in spec.parameters], [])
    except SpaceError as exc:
        raise ExportError(f"spec.{exc}") from None
    mine = [r for r in records if r.target == pool.key]
    rounds = sorted({r.round for r in mine})
    if round_ is None:
        round_ = rounds[-1] if rounds else 1
    elif round_ not in rounds:
        raise ExportError(f"pool {pool.key} has no results of round {round_} (rounds: "
                          f"{', '.join(map(str, rounds)) or 'none yet'})")
    export = Export(RecordedSpace(space=space, records=[]), pool, round_)
    latest: dict[str, tuple[TrialRecord, dict[str, Any]]] = {}
    for rec in sorted((r for r in mine if r.round == round_), key=lambda r: r.index):
        if not rec.is_observation:
            export.infra_failures += 1
            continue
        try:
            key = space.key(rec.config)
            config = space.to_configs(space.to_rows([rec.config]))[0]
        except SpaceError:
            export.outside_space += 1
            continue
        if key in latest:
            export.repeated += 1
        latest[key] = (rec, config)
    out: list[Record] = []
    for rec, config in latest.values():
        extras = _recorded_at(rec)
        if rec.outcome == Outcome.OK and rec.objective is not None:
            out.append(Record(config=config, time_ms=rec.objective, times=list(rec.times), extras=extras))
        else:
            failure, t4_invalidity = FAILURE.get(rec.outcome, ("runtime", "runtime"))
            if fmt == "t4" and t4_invalidity != failure:
                extras["t4_invalidity"] = t4_invalidity  # T4 tells correctness errors and timeouts apart
            out.append(Record(config=config, time_ms=None, failure=failure, extras=extras))
    if not out:
        raise ExportError(_nothing_to_export(export, records, bool(rounds)))
    if device_name is None:
        device_name = next((r.fingerprint.product for r, _ in reversed(latest.values())
                            if r.fingerprint is not None and r.fingerprint.product), None)
    kernel = spec.kernel
    export.recorded = RecordedSpace(
        space=space, records=out, device_name=device_name or "",
        kernel_name=kernel.builtin or (kernel.user.function if kernel.user else ""),
        problem_size=list(pool.size), objective="time", metadata=dict(metadata or {}),
    )
    return export


def _nothing_to_export(export: Export, records: Sequence[TrialRecord], any_round: bool) -> str:
    """Why a pool has no result to write (a file of none would read as a space never measured)."""
    key = export.pool.key
    left = [f"{n} {what}" for n, what in ((export.infra_failures, "infrastructure failures"),
                                          (export.outside_space, "configurations outside the run's parameters"))
            if n]
    others = sorted({r.target for r in records if r.target != key and r.is_observation})
    return (f"pool {key} has no results to export {f'in round {export.round}' if any_round else 'yet'}"
            + (f" (left out {', '.join(left)})" if left else "")
            + (f"; pools with results: {', '.join(others)} (--target, --size)" if others else "")
            + "; nothing written")


def write(export: Export, fmt: str, path: str | os.PathLike[str]) -> None:
    """Write the export in the format (gzip when the path ends in ``.gz``)."""
    if fmt == "kernel-tuner":
        from fleettune.space.kernel_tuner import write_kernel_tuner_cache

        write_kernel_tuner_cache(path, export.recorded)
    elif fmt == "t4":
        from fleettune.space.t4 import write_t4

        write_t4(path, export.recorded)
    else:
        raise ExportError(f"unknown format {fmt!r} (formats: {', '.join(FORMATS)})")


def run_metadata(run: dict[str, Any], pool: PoolChoice, round_: int, records: Sequence[TrialRecord]) -> dict[str, Any]:
    """Where the numbers come from, for the T4 file's metadata."""
    meta = run.get("metadata") or {}
    fp = next((r.fingerprint for r in reversed(records)
               if r.target == pool.key and r.round == round_ and r.fingerprint is not None), None)
    out: dict[str, Any] = {"tuning_run": f"{meta.get('namespace')}/{meta.get('name')}", "uid": meta.get("uid"),
                           "target": pool.target, "pool": pool.key, "round": round_}
    if fp is not None:
        out["fingerprint"] = fp.model_dump(exclude_defaults=True)
    return {"fleettune": out}


def _status_device(run: dict[str, Any], key: str) -> str | None:
    for t in (run.get("status") or {}).get("targets") or []:
        if t.get("name") == key and t.get("device"):
            return str(t["device"])
    return None


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="fleettune export",
        description="Write a TuningRun's results (finished or running) as a Kernel Tuner cache or a T4 results file: "
        "one pool and problem size per file.",
    )
    parser.add_argument("run", help="TuningRun name")
    parser.add_argument("--format", required=True, choices=FORMATS, help="kernel-tuner: a cache file; t4: T4 results")
    parser.add_argument("-o", "--output", metavar="FILE", help="default: standard output (.gz: gzip-compressed)")
    parser.add_argument("--target", help="the pool's target name (default: the run's first target)")
    parser.add_argument("--size", help="problem size, for runs that tune several, e.g. 4096x4096 (default: the first)")
    parser.add_argument("--round", type=int, help="the pool's tuning round (default: the latest with results)")
    parser.add_argument("-n", "--namespace", help="default: the kubeconfig context's namespace")
    parser.add_argument("--kubeconfig", help="default: $KUBECONFIG or ~/.kube/config")
    parser.add_argument("--context")
    args = parser.parse_args(argv)
    try:
        size = parse_size(args.size) if args.size else None
    except ValueError as exc:
        parser.error(f"--size: {exc}")

    from fleettune import store

    try:
        run, records, namespace = store.read_run(args.run, args.namespace, args.kubeconfig, args.context)
    except store.ReadError as exc:
        print(f"fleettune export: {exc}", file=sys.stderr)
        return 1
    try:
        spec = TuningRunSpec.model_validate(run["spec"])
        pool = choose_pool(spec, args.target, size)
        export = export_records(spec, records, pool, args.format, round_=args.round)
        if not export.recorded.device_name:
            export.recorded.device_name = _status_device(run, pool.key) or ""
        export.recorded.metadata = run_metadata(run, pool, export.round, records)
        if args.output:
            write(export, args.format, args.output)
        else:
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "export.json"
                write(export, args.format, path)
                sys.stdout.write(path.read_text())
    except (ExportError, SpaceError) as exc:
        print(f"fleettune export: {exc}", file=sys.stderr)
        return 1
    left = [f"{n} {what}" for n, what in ((export.infra_failures, "infrastructure failures"),
                                          (export.outside_space, "configurations outside the run's parameters"),
                                          (export.repeated, "earlier measurements of repeated configurations"))
            if n]
    others = [p.key for p in pools_of(spec) if p != pool and any(r.target == p.key for r in records)]
    print(f"fleettune export: {len(export.recorded.records)} results of {namespace}/{args.run} pool {pool.key} "
          f"(round {export.round}, {export.recorded.device_name or 'unknown device'}) "
          f"to {args.output or 'standard output'}"
          + (f"; left out {', '.join(left)}" if left else "")
          + (f"; other pools with results: {', '.join(others)} (--target, --size)" if others else ""),
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
