"""Running the jobs of `fleettune bench timeline`: one `Job` per (space, mode, GPUs, seed),
in worker processes, resumed from and appended to a JSON-lines trace file.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fleettune_dev.bench.kerneltuner import KernelTunerCache
from fleettune_dev.bench.timeline.fleet import simulate_fleet
from fleettune_dev.bench.timeline.kerneltuner import run_kernel_tuner
from fleettune_dev.bench.timeline.model import FLEET_MODES, KT_PREFIX, FleetModel, Run, TimedSpace, load_timed_space


@dataclass(frozen=True)
class Job:
    """One run to make: a recording, a mode, a pool size and a seed, with what the mode
    needs; `key` names it in the trace file."""

    path: str
    mode: str
    gpus: int
    seed: int
    budget: int
    model: FleetModel
    strategy: str
    options: dict[str, Any]
    stop_at: float | None

    def key(self) -> str:
        fleet = self.mode in FLEET_MODES
        return json.dumps([Path(self.path).name, self.mode, self.gpus, self.seed, self.budget,
                           asdict(self.model) if fleet else None, self.strategy if fleet else None,
                           self.options if fleet else None, self.stop_at], sort_keys=True)


_SPACES: dict[str, TimedSpace] = {}
_KT: dict[str, KernelTunerCache] = {}
_TMP: list[tempfile.TemporaryDirectory[str]] = []


def timed_space(path: str) -> TimedSpace:
    """The recording at ``path``, loaded once per process."""
    if path not in _SPACES:
        _SPACES[path] = load_timed_space(path)
    return _SPACES[path]


def execute(job: Job) -> tuple[str, Run, float]:
    """Run one job: (its key, the run, the real seconds it took)."""
    t0 = time.perf_counter()
    ts = timed_space(job.path)
    if job.mode in FLEET_MODES:
        run = simulate_fleet(ts, job.mode, job.gpus, job.seed, job.budget, job.model, strategy=job.strategy,
                             options=job.options, stop_at=job.stop_at)
    else:
        if job.path not in _KT:
            if not _TMP:
                _TMP.append(tempfile.TemporaryDirectory(prefix="fleettune-kt-"))
            _KT[job.path] = KernelTunerCache(Path(job.path), ts.keys, Path(_TMP[0].name))
        run = run_kernel_tuner(ts, job.mode[len(KT_PREFIX):], job.seed, job.budget, _KT[job.path],
                               stop_at=job.stop_at)
    return job.key(), run, time.perf_counter() - t0


def _worker_init(threads: int) -> None:
    import torch

    torch.set_num_threads(max(1, threads))
    # The optimiser's fitting warnings (gpytorch, scipy) would bury the progress lines;
    # they change no result.
    warnings.simplefilter("ignore")


def _run_to_json(key: str, run: Run) -> str:
    d = {k: v for k, v in asdict(run).items() if k not in ("times", "values", "order")}
    d["times"] = run.times.tolist()
    d["order"] = run.order.tolist()
    d["values"] = [None if not math.isfinite(v) else float(v) for v in run.values]
    return json.dumps({"key": key, "run": d})


def _run_from_json(line: str) -> tuple[str, Run]:
    rec = json.loads(line)
    d = rec["run"]
    d["times"] = np.asarray(d["times"], dtype=float)
    d["order"] = np.asarray(d["order"], dtype=np.int64)
    d["values"] = np.array([math.nan if v is None else v for v in d["values"]], dtype=float)
    d["spans"] = [tuple(s) for s in d["spans"]]
    return rec["key"], Run(**d)


def trace_keys(traces: Path | None) -> list[str]:
    if traces is None or not traces.exists():
        return []
    return [json.loads(line)["key"] for line in traces.read_text().splitlines() if line.strip()]


def run_all(jobs: Sequence[Job], workers: int = 1, threads: int = 1, traces: Path | None = None,
            progress: Callable[[str], None] | None = None) -> dict[str, Run]:
    """Every job's run, resuming from and appending to ``traces`` (JSON lines)."""
    done: dict[str, Run] = {}
    if traces is not None and traces.exists():
        for line in traces.read_text().splitlines():
            if line.strip():
                k, r = _run_from_json(line)
                done[k] = r
    todo = [j for j in jobs if j.key() not in done]
    resumed = len(done)
    t_start = time.perf_counter()

    def finished(key: str, run: Run, seconds: float) -> None:
        done[key] = run
        if traces is not None:
            with traces.open("a") as fh:
                fh.write(_run_to_json(key, run) + "\n")
        if progress is not None:
            progress(f"[{len(done) - resumed}/{len(todo)} {time.perf_counter() - t_start:.0f} s] {run.space} "
                     f"{run.mode} x{run.gpus} seed {run.seed}: {seconds:.1f} s")

    if workers <= 1 or len(todo) <= 1:
        _worker_init(threads)
        for job in todo:
            finished(*execute(job))
    else:
        import multiprocessing as mp

        # Spawned workers with one BLAS thread each: on a small machine two workers must
        # not fight over cores, since the suggestion latency they measure goes on the clock.
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(var, "1")
        with mp.get_context("spawn").Pool(workers, initializer=_worker_init, initargs=(threads,)) as pool:
            for result in pool.imap_unordered(execute, todo):
                finished(*result)
    return done
