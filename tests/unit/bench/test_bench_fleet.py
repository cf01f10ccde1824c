"""The fleet benchmark's replays, counting and output (tiny synthetic recordings)."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import numpy as np
import pytest

from fleettune_dev.bench import fleet_run
from fleettune_dev.bench.fleet import main, orders, run_family_seed
from fleettune_dev.bench.fleet_run import (
    PoolTrace,
    fleet_parallel,
    fleet_sequential,
    load_pool,
    lockstep,
    pool_figures,
)
from fleettune_dev.bench.replay import fractions_of
from fleettune_dev.bench.strategy import load_replay, run_batched, run_once
from fleettune_job.protocol import Outcome

VALUES = {"bx": [16, 32, 64, 128, 256], "tile": [1, 2, 4, 8], "vec": [1, 2]}


def write_cache(path: Path, best_tile: int, speed: float = 1.0, costs: bool = True) -> Path:
    cache = {}
    for bx in VALUES["bx"]:
        for tile in VALUES["tile"]:
            for vec in VALUES["vec"]:
                c = {"bx": bx, "tile": tile, "vec": vec}
                if bx * tile > 1024:
                    entry: dict = {**c, "time": "CompilationFailedConfig", "times": []}
                else:
                    t = speed * (1.0 + abs(math.log2(bx) - 6) * 0.3
                                 + abs(math.log2(tile) - math.log2(best_tile)) * 0.5 + (0.1 if vec == 1 else 0.0))
                    entry = {**c, "time": t, "times": [t] * 3}
                if costs:  # ms, as Kernel Tuner records them: 1 s of verification + benchmark each
                    entry.update(compile_time=500.0, verification_time=250.0, benchmark_time=750.0)
                cache[f"{bx},{tile},{vec}"] = entry
    doc = {"device_name": "synthetic", "kernel_name": "k", "problem_size": [1024], "tune_params_keys": list(VALUES),
           "tune_params": VALUES, "cache": cache}
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return path


@pytest.fixture
def caches(tmp_path: Path) -> list[Path]:
    return [write_cache(tmp_path / "k-A.json.gz", 4), write_cache(tmp_path / "k-B.json.gz", 2, speed=2.0),
            write_cache(tmp_path / "k-C.json.gz", 4, speed=0.5)]


def test_costs_are_verification_and_benchmark_seconds(caches, tmp_path: Path) -> None:
    pool = load_pool(caches[0])
    assert pool.gpu_s is not None
    failed = np.isnan(pool.replay.time_ms)
    assert failed.any() and (pool.gpu_s[failed] == 0).all() and (pool.gpu_s[~failed] == 1.0).all()
    assert load_pool(write_cache(tmp_path / "k-D.json.gz", 4, costs=False)).gpu_s is None
    small = load_pool(caches[0], ["bx=64"])
    assert len(small.replay.rows) == 8 and small.gpu_s is not None and len(small.gpu_s) == 8


def test_independent_pools_are_the_strategy_benchmarks_runs(caches) -> None:
    pools = [load_pool(p) for p in caches[:2]]
    traces = lockstep(pools, "bayes", 1, 12)
    for path, pool, trace in zip(caches[:2], pools, traces, strict=True):
        replay = load_replay(path)
        theirs = run_once(replay, "bayes", 1, 12)
        np.testing.assert_array_equal(trace.best(pool.replay.optimum), fractions_of(replay, theirs.best))
        assert trace.rounds == list(range(12))
    # Batched: one GPU's Pods, ramped as the operator's.
    (trace,) = lockstep(pools[:1], "random", 3, 15, batch=4)
    theirs = run_batched(pools[0].replay, "random", 3, 15, batch=4, gpus=1)
    np.testing.assert_array_equal(trace.best(pools[0].replay.optimum), fractions_of(pools[0].replay, theirs.best))


def test_a_seed_replays_the_same(caches) -> None:
    pools = [load_pool(p) for p in caches[:2]]
    a = run_family_seed(pools, "bayes", 5, 4)
    b = run_family_seed(pools, "bayes", 5, 4)
    a.pop("replay_seconds"), b.pop("replay_seconds")
    assert a == b and len(a["sequential"]) == 2


def test_sharing_passes_the_other_pools_results_of_earlier_rounds(caches, monkeypatch) -> None:
    pools = [load_pool(p) for p in caches]
    seen: list[tuple[int, list]] = []
    real = fleet_run.PriorBuilder.shared

    def spy(self, receiver, traces, before):
        out = real(self, receiver, traces, before)
        seen.append((receiver, before, out))
        return out

    monkeypatch.setattr(fleet_run.PriorBuilder, "shared", spy)
    traces = lockstep(pools, "random", 0, 6, share=True)
    assert [(r, b) for r, b, _ in seen[:3]] == [(0, 1), (1, 1), (2, 1)]  # round 0: nothing to share yet
    receiver, before, prior = seen[-1]
    assert (receiver, before) == (2, 5)
    # Pool C at round 5 gets A's, then B's results of rounds 0-4, each relative to its pool's best.
    expected = []
    for j in (0, 1):
        obs = traces[j].observations[:5]
        best = min(v for _, o, v in obs if o == Outcome.OK)
        expected += [(c, o, v / best if v else v) for c, o, v in obs]
    # Two other GPUs: no consensus to measure first (`controller.memory.first_picks`).
    assert prior.observations == expected and prior.first == []


def test_a_pool_finds_an_optimum_another_measured_within_a_few_evaluations(caches) -> None:
    """Pool A's recording holds eight configurations, one of them the optimum of pool B (the
    same landscape at another speed): once A has measured it, B measures it within two
    evaluations of the earliest it can (A's results of a round reach B at the next), and
    well before a cold study does."""
    full = load_pool(caches[2])
    opt = full.replay.rows[int(np.nanargmin(full.replay.time_ms))]
    config = full.replay.space.to_configs(opt.reshape(1, -1))[0]
    tiny = load_pool(caches[0], [f"bx={config['bx']}"])
    assert len(tiny.replay.rows) == 8
    shared = lockstep([tiny, full], "bayes", 0, 8, share=True)
    (cold,) = lockstep([full], "bayes", 0, 8)
    got = shared[0].rounds[shared[0].cand.index(tiny.replay.rows.tolist().index(opt.tolist()))]
    found = shared[1].evals_to(full.replay.optimum, 0.99)
    assert found <= got + 3 < cold.evals_to(full.replay.optimum, 0.99)


def test_a_second_run_starts_from_the_first_runs_results_on_the_other_gpus(caches) -> None:
    """One landscape at two speeds: the second run on either GPU, from the first run's
    results on the other, measures the optimum among its first few evaluations."""
    pools = [load_pool(caches[0]), load_pool(caches[2])]
    record = run_family_seed(pools, "bayes", 0, 20, with_sequential=False)
    for name in ("k-A", "k-C"):
        second, cold = (record[m]["pools"][name]["evals_0.99"] for m in ("memory", "independent"))
        assert second <= 3 and second < cold, (name, second, cold)


def test_counting_per_pool_and_for_the_fleet(caches) -> None:
    pool = load_pool(caches[0])
    ok = [i for i in range(len(pool.replay.rows)) if math.isfinite(pool.replay.time_ms[i])]
    slow = max(ok, key=lambda i: pool.replay.time_ms[i])
    best = int(np.nanargmin(pool.replay.time_ms))
    failed = int(np.flatnonzero(np.isnan(pool.replay.time_ms))[0])

    def trace(cands: list[int], rounds: list[int]) -> PoolTrace:
        obs = [({}, Outcome.OK, float(pool.replay.time_ms[c])) if c != failed else ({}, Outcome.COMPILE_ERROR, None)
               for c in cands]
        return PoolTrace(cand=cands, rounds=rounds, observations=obs, budget=4, cost_of=pool.gpu_s)

    quick, late = trace([slow, best, slow], [0, 1, 2]), trace([failed, slow, slow, slow], [0, 1, 2, 3])
    figs = pool_figures(pool, quick)
    assert figs["evals_0.95"] == 2 and figs["gpu_seconds_0.95"] == 2.0 and figs["rounds_0.95"] == 2
    never = pool_figures(pool, late)
    assert never["evals_0.95"] == 5 and never["censored_0.95"] and never["gpu_seconds_0.95"] == 3.0  # failed: 0 s
    both = fleet_parallel([pool, pool], [quick, trace([slow, slow, best], [0, 1, 2])])
    assert both == {"rounds": 3, "gpu_seconds": 6.0, "evaluations": 6, "censored": False}
    early = fleet_parallel([pool, pool], [quick, trace([best, slow, slow], [0, 1, 2])])
    assert early["rounds"] == 2 and early["gpu_seconds"] == 4.0
    assert fleet_parallel([pool, pool], [quick, late])["censored"]
    # Sequential: the first pool's full run, then the last pool until it got there.
    seq = fleet_sequential([pool, pool], {0: trace([slow, best, slow], [0, 1, 2]), 1: quick}, [0, 1])
    assert seq == {"rounds": 5, "gpu_seconds": 5.0, "evaluations": 5, "censored": False}
    assert orders(3) == [[0, 1, 2], [1, 0, 2], [2, 0, 1]]


def test_command_json(caches, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "fleet.json"
    lone = write_cache(tmp_path / "other-A.json.gz", 4)
    assert main(["--cache", *map(str, caches), "--cache", str(lone), "--seeds", "2", "--budget", "6",
                 "--strategy", "random", "--json", str(out)]) == 0
    captured = capsys.readouterr()
    assert "left out family other" in captured.err
    assert "### k: 3 pools" in captured.out and "sharing / independent" in captured.out
    assert "sequential warm starts" in captured.out
    doc = json.loads(out.read_text())
    assert set(doc) == {"summary", "pools"}
    assert set(doc["summary"]) == {"k"}
    figures = {"mean_evals_ratio", "fleet_gpu_seconds_ratio", "worst_pool", "worst_pool_paired_difference",
               "worst_pool_standard_error"}
    assert set(doc["summary"]["k"]) == figures | {"second_run"} and set(doc["summary"]["k"]["second_run"]) == figures
    assert "a second run on each GPU" in captured.out
    assert len(doc["pools"]) == 12
    assert {(r["mode"], r["pool"]) for r in doc["pools"]} == {
        (m, p) for m in ("independent", "sharing", "memory", "sequential") for p in ("k-A", "k-B", "k-C")}
    row = doc["pools"][0]
    assert row["seeds"] == [0, 1] and len(row["evals_0.95"]) == 2 and "mean_gpu_seconds_0.95" in row
    assert main(["--cache", *map(str, caches[:2]), "--seeds", "1", "--budget", "3", "--strategy", "random",
                 "--no-sequential"]) == 0
    assert "sequential" not in capsys.readouterr().out
