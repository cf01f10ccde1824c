"""`fleettune bench timeline`: the start-up model, one Pod's schedule, the fleet replay
on a small synthetic recording, the metrics, and Kernel Tuner's simulation mode on one
real recording (skipped where data/spaces is absent)."""

from __future__ import annotations

import dataclasses
import gzip
import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest

from fleettune.optimize.batching import FIRST_CONFIGS
from fleettune_dev.bench.timeline import (
    DEFAULT_SPACES,
    FLEET_MODES,
    FleetModel,
    KernelTunerCache,
    Run,
    clairvoyant_s,
    compare,
    load_timed_space,
    main,
    observe_recorded,
    plan_pod,
    pod_answers,
    pruned_runs,
    random_expectation_s,
    reach,
    run_kernel_tuner,
    run_metrics,
    simulate_fleet,
    startup_draws,
)
from fleettune_dev.sim.startup import PodStartup

VALUES = {"bx": [16, 32, 64, 128, 256], "tile": [1, 2, 4, 8], "vec": [1, 2]}


def landscape(c: dict) -> float | str:
    if c["bx"] * c["tile"] > 1024:
        return "CompilationFailedConfig"
    if c["bx"] == 16 and c["tile"] == 8:
        return "RuntimeFailedConfig"
    return 1.0 + abs(math.log2(c["bx"]) - 6) * 0.3 + abs(math.log2(c["tile"]) - 1) * 0.5 + (0.1 if c["vec"] == 1 else 0)


def write_cache(path: Path, runs: int = 3) -> Path:
    """A Kernel Tuner cache with per-configuration costs in ms, varied so that a wrong
    index or unit shows; ``runs`` timed runs each (3: none is ever pruned)."""
    cache = {}
    for i, (bx, tile, vec) in enumerate(itertools.product(*VALUES.values())):
        c = {"bx": bx, "tile": tile, "vec": vec}
        t = landscape(c)
        ok = isinstance(t, float)
        cache[f"{bx},{tile},{vec}"] = {
            **c, "time": t, "times": [t * (1 + 0.01 * r) for r in range(runs)] if ok else [],
            "compile_time": 300.0 + 37.0 * i, "verification_time": 20.0 + i if ok else 0,
            "benchmark_time": 100.0 + 11.0 * i if ok else 0, "framework_time": 5.0 + i, "strategy_time": 0,
        }
    doc = {"device_name": "synthetic", "kernel_name": "k", "problem_size": [1024], "tune_params_keys": list(VALUES),
           "tune_params": VALUES, "cache": cache}
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return path


@pytest.fixture(scope="module")
def ts(tmp_path_factory):
    return load_timed_space(write_cache(tmp_path_factory.mktemp("tl") / "synthetic.json.gz"))


@pytest.fixture(scope="module")
def ts8(tmp_path_factory):
    """The same space with 8 timed runs per configuration: clearly slow ones are pruned."""
    return load_timed_space(write_cache(tmp_path_factory.mktemp("tl") / "synthetic.json.gz", runs=8))


def ticking(step: float):
    """A clock whose every interval measures ``step`` seconds."""
    counter = itertools.count()
    return lambda: step * next(counter)


CONSTANT = PodStartup(1.5, 1.5)


# -- the model ----------------------------------------------------------------------------


def test_startup_model_matches_its_quantiles() -> None:
    model = PodStartup(2.0, 5.0)
    draws = np.array([model.at(np.random.default_rng([7, i]).standard_normal()) for i in range(20_000)])
    assert np.median(draws) == pytest.approx(2.0, rel=0.03)
    assert np.quantile(draws, 0.99) == pytest.approx(5.0, rel=0.08)
    assert (draws > 0).all()
    rng = np.random.default_rng(3)
    assert {CONSTANT.at(rng.standard_normal()) for _ in range(5)} == {1.5}


@pytest.mark.parametrize(("p50", "p99"), [(0.0, 1.0), (-1.0, 1.0), (2.0, 1.0), (2.0, math.inf)])
def test_startup_model_rejects_nonsense(p50: float, p99: float) -> None:
    with pytest.raises(ValueError):
        PodStartup(p50, p99)


def test_costs_are_read_in_seconds(ts) -> None:
    data = json.loads(gzip.decompress(ts.path.read_bytes()))
    for i, entry in enumerate(data["cache"].values()):
        c = ts.index_of[tuple(entry[k] for k in ts.keys)]
        assert c == i
        assert ts.compile_s[c] == pytest.approx(entry["compile_time"] / 1000)
        assert ts.bench_s[c] == pytest.approx(entry["benchmark_time"] / 1000)
    assert ts.compile_failed.sum() == sum(e["time"] == "CompilationFailedConfig" for e in data["cache"].values())
    assert (ts.gpu_s()[ts.compile_failed] == 0).all()


# -- one Pod ------------------------------------------------------------------------------


def test_one_configuration_pod_is_serial() -> None:
    end, work = plan_pod(10.0, 2.0, [3.0], [0.5], [False], cpus=8)
    assert end == pytest.approx(10.0 + 2.0 + 3.0 + 0.5)
    assert work == 0.5
    end, work = plan_pod(10.0, 2.0, [3.0], [0.5], [True], cpus=8)
    assert (end, work) == (pytest.approx(15.0), 0.0)


def test_compiles_run_ahead_on_the_cores() -> None:
    # Two cores, four 1 s compiles: built at +1, +1, +2, +2; the GPU follows in order.
    end, work = plan_pod(0.0, 0.0, [1.0] * 4, [0.1] * 4, [False] * 4, cpus=2)
    assert end == pytest.approx(2.2)
    assert work == pytest.approx(0.4)
    # A failed build never reaches the GPU.
    end, work = plan_pod(0.0, 0.0, [1.0] * 4, [0.1] * 4, [False, False, False, True], cpus=2)
    assert end == pytest.approx(2.1)
    assert work == pytest.approx(0.3)


def test_the_replay_compiles_in_as_many_processes_as_the_job_image() -> None:
    from fleettune_job.ahead import compile_workers

    # A node with cores to spare: the image's pool is as large as it gets.
    assert FleetModel().cpus == compile_workers({}, cpus=64)


def test_pod_schedule_bounds() -> None:
    rng = np.random.default_rng(11)
    for _ in range(200):
        n, cpus = int(rng.integers(1, 20)), int(rng.integers(1, 9))
        comp, gpu = rng.exponential(1.0, n), rng.exponential(0.3, n)
        failed = rng.random(n) < 0.2
        end, work = plan_pod(5.0, 1.0, comp, gpu, failed, cpus)
        assert work == pytest.approx(gpu[~failed].sum())
        assert end >= 6.0 + work - 1e-9
        assert end >= 6.0 + comp.sum() / cpus - 1e-9
        assert end <= 6.0 + comp.sum() + gpu.sum() + 1e-9
        # More cores never make a Pod slower.
        assert plan_pod(5.0, 1.0, comp, gpu, failed, cpus + 1)[0] <= end + 1e-9


# -- the fleet ----------------------------------------------------------------------------


def test_one_pod_per_configuration_on_one_gpu_is_sequential(ts) -> None:
    step = 0.25
    run = simulate_fleet(ts, "pod", 1, 0, 15, FleetModel(CONSTANT), strategy="random", clock=ticking(step))
    order = run.order
    assert len(order) == len(set(order.tolist())) == 15
    per = CONSTANT.p50_s + ts.compile_s[order] + ts.gpu_s()[order]
    # One GPU, one Pod at a time: each Pod waits for the operator's observe (one tick)
    # and its suggestion (one tick), the first only for its suggestion.
    expected = np.cumsum(per) + step * (1 + 2 * np.arange(15))
    np.testing.assert_allclose(run.times, expected)
    assert run.end == pytest.approx(expected[-1])
    assert run.gpu_seconds(run.end) == pytest.approx(per.sum())
    assert run.allocated == pytest.approx(per.sum())
    assert run.pods == 15 and run.batches == [1] * 15
    np.testing.assert_array_equal(run.values, ts.replay.time_ms[order])


def test_parallel_pods_overlap_and_never_repeat(ts) -> None:
    run = simulate_fleet(ts, "pod", 3, 1, 24, FleetModel(PodStartup()), strategy="random", clock=ticking(0.0))
    assert len(set(run.order.tolist())) == 24
    assert (np.diff(run.times) >= 0).all()
    edges = sorted([(s, 1) for s, _ in run.spans] + [(e, -1) for _, e in run.spans])
    busy = max(itertools.accumulate(d for _, d in edges))
    assert busy == 3  # three GPUs, all used, never more
    sequential = simulate_fleet(ts, "pod", 1, 1, 24, FleetModel(PodStartup()), strategy="random",
                                clock=ticking(0.0))
    assert run.end < sequential.end / 2
    # Same start-up draws (common random numbers) and the same work: the same GPU time.
    assert run.allocated == pytest.approx(sum(e - s for s, e in run.spans))


def test_batched_pods_follow_the_batch_size_rule(ts) -> None:
    from fleettune.optimize.batching import batch_size

    model = FleetModel(CONSTANT, cpus=4, pod_seconds=1.0, max_batch=6)
    run = simulate_fleet(ts, "batch", 1, 2, 30, model, strategy="random", clock=ticking(0.0))
    assert run.batches[0] == min(FIRST_CONFIGS, model.max_batch)  # nothing measured: the first blind picks
    assert sum(run.batches) == len(run.order) == 30
    # On one GPU, every Pod's size is the rule applied to what the earlier Pods measured.
    done = 0
    for k in run.batches:
        before = run.order[:done]
        measured = [float(g) for g, f in zip(ts.gpu_s()[before], ts.compile_failed[before], strict=True) if not f]
        assert k == batch_size(measured, model.pod_seconds, model.max_batch, 30 - done)
        done += k
    assert max(run.batches) > 1
    # One start-up per Pod instead of per configuration, compiles ahead of the GPU.
    pods = simulate_fleet(ts, "pod", 1, 2, 30, FleetModel(CONSTANT), strategy="random", clock=ticking(0.0))
    assert run.allocated / 30 < pods.allocated / 30
    m = run_metrics(run, ts.replay.optimum)
    assert m["gpu_s_per_eval"] == pytest.approx(run.allocated / 30)
    assert 0 < m["busy"] <= 1


def test_suggestions_see_the_pending_configurations(ts, monkeypatch) -> None:
    from fleettune.optimize import Study

    seen: list[int] = []
    original = Study.suggest

    def spy(self, n=1, pending=()):
        seen.append(len(pending))
        return original(self, n, pending)

    monkeypatch.setattr(Study, "suggest", spy)
    simulate_fleet(ts, "batch", 3, 0, 30, FleetModel(CONSTANT, max_batch=4), strategy="random", clock=ticking(0.0))
    k = FIRST_CONFIGS // 3
    assert seen[:3] == [0, k, 2 * k]  # three Pods of the first blind picks start together
    assert max(seen) >= 4


def test_answers_come_out_in_order_and_the_pod_ends_with_the_last() -> None:
    # Two cores: builds at +1, +1, +2, +2 (the second fails); the GPU takes 0.5 s each.
    answered, work = pod_answers(0.0, 1.0, [1.0] * 4, [0.5] * 4, [False, True, False, False], cpus=2)
    np.testing.assert_allclose(answered, [2.5, 2.5, 3.5, 4.0])
    assert work == pytest.approx(1.5)
    assert plan_pod(0.0, 1.0, [1.0] * 4, [0.5] * 4, [False, True, False, False], cpus=2) == (4.0, work)


def test_streamed_answers_are_known_when_printed(ts) -> None:
    """On one GPU the next Pod starts when the last ends either way: the same
    configurations, each known when its Pod printed it instead of when the Pod ended."""
    model = FleetModel(CONSTANT, cpus=4, pod_seconds=1.0, max_batch=6)  # answers read at once: the default
    ended = simulate_fleet(ts, "batch", 1, 2, 30, dataclasses.replace(model, stream_poll_s=None), strategy="random",
                           clock=ticking(0.0))
    streamed = simulate_fleet(ts, "batch", 1, 2, 30, model, strategy="random", clock=ticking(0.0))
    np.testing.assert_array_equal(streamed.order, ended.order)
    assert streamed.batches == ended.batches and streamed.spans == ended.spans
    assert (streamed.times <= ended.times).all() and (streamed.times < ended.times).any()
    last = np.cumsum(ended.batches) - 1  # each Pod's last answer is known when it ends
    np.testing.assert_array_equal(streamed.times[last], ended.times[last])
    polled = simulate_fleet(ts, "batch", 1, 2, 30, dataclasses.replace(model, stream_poll_s=2.0),
                            strategy="random", clock=ticking(0.0))
    np.testing.assert_array_equal(polled.order, ended.order)
    assert (streamed.times <= polled.times).all() and (polled.times <= ended.times).all()
    ends = {e for _, e in ended.spans}
    assert all(t in ends or t % 2.0 == 0 for t in polled.times)


def test_streamed_answers_of_running_pods_reach_the_next_suggestion(ts, monkeypatch) -> None:
    from fleettune.optimize import Study

    pods: list[list[str]] = []  # each suggestion's configurations: one Pod
    partly_read = 0  # suggestions that saw a Pod some of whose answers were read
    original = Study.suggest

    def spy(self, n=1, pending=()):
        nonlocal partly_read
        waiting = {json.dumps(c, sort_keys=True) for c in pending}
        assert len(self.history) + len(waiting) == sum(map(len, pods))  # nothing lost, nothing twice
        partly_read += any(0 < len(waiting & set(p)) < len(p) for p in pods)
        out = original(self, n, pending)
        pods.append([json.dumps(c, sort_keys=True) for c in out])
        return out

    monkeypatch.setattr(Study, "suggest", spy)
    model = FleetModel(CONSTANT, cpus=4, pod_seconds=1.0, max_batch=6)
    simulate_fleet(ts, "batch", 3, 0, 40, dataclasses.replace(model, stream_poll_s=None), strategy="random",
                   clock=ticking(0.0))
    assert partly_read == 0  # a Pod's answers come with its end
    pods.clear()
    run = simulate_fleet(ts, "batch", 3, 0, 40, model, strategy="random", clock=ticking(0.0))
    assert len(run.order) == 40 == len(set(run.order.tolist()))
    assert partly_read > 0


def test_pruning_stops_only_clearly_slow_configurations() -> None:
    from types import SimpleNamespace

    times = [[9.0] * 8, [9.0, 9.0, 9.0, 1.0, 1.0], [2.0] * 8, [9.0] * 3, [6.0] * 8, []]
    # The fifth's recorded time (4 ms) is not its runs' median: it is judged on that scale.
    time_ms = np.array([9.0, 9.0, 2.0, 9.0, 4.0, np.nan])
    space = SimpleNamespace(replay=SimpleNamespace(times=times, time_ms=time_ms),
                            bench_s=np.array([0.8, 0.5, 0.8, 0.3, 0.8, 0.0]),
                            verify_s=np.array([0.2, 0.2, 0.2, 0.2, 0.2, 0.0]))
    gpu_s = np.array([1.0, 0.7, 1.0, 0.5, 1.0, 0.0])  # verification 0.2 + benchmark; the last failed to build
    idx = np.arange(6)
    got, pruned = pruned_runs(space, idx, gpu_s, cutoff_ms=5.0)
    # Over the cut-off after 3 runs: 3 of 8 (and 3 of 5) runs' share of the benchmark is
    # spent, and no verification; under it (on the recording's scale), or with no more runs
    # than that, or never built: unchanged.
    np.testing.assert_allclose(got, [0.8 * 3 / 8, 0.5 * 3 / 5, 1.0, 0.5, 1.0, 0.0])
    assert pruned.tolist() == [True, True, False, False, False, False]
    for cutoff in (10.0, None):
        got, pruned = pruned_runs(space, idx, gpu_s, cutoff_ms=cutoff)
        np.testing.assert_allclose(got, gpu_s)
        assert not pruned.any()


def test_a_pruned_configuration_is_observed_as_the_job_reports_it(ts8) -> None:
    """The study sees a pruned configuration's time from the runs it got, as from the job."""
    seen: list[tuple[float, list[float]]] = []

    class Spy:
        def observe(self, config, outcome, objective=None, times=()):
            seen.append((objective, list(times)))

    c = int(np.flatnonzero(np.isfinite(ts8.replay.time_ms))[0])
    runs = list(ts8.replay.times[c])
    # On the recording's own scale: its time, times how the first 3 runs' median differs from all runs'.
    expected = ts8.replay.time_ms[c] * float(np.median(runs[:3]) / np.median(runs))
    assert observe_recorded(Spy(), ts8.replay, {}, c, pruned=True) == pytest.approx(expected)
    assert expected < ts8.replay.time_ms[c]  # the synthetic runs grow: a wrong ratio shows
    assert observe_recorded(Spy(), ts8.replay, {}, c) == ts8.replay.time_ms[c]
    assert [len(t) for _, t in seen] == [3, len(runs)]


def test_pruning_saves_gpu_time_on_a_benchmark_bound_space(ts8) -> None:
    kept = simulate_fleet(ts8, "batch", 1, 0, 40, FleetModel(CONSTANT, prune_slower_than=0), strategy="random",
                          clock=ticking(0.0))
    pruned = simulate_fleet(ts8, "batch", 1, 0, 40, FleetModel(CONSTANT), strategy="random", clock=ticking(0.0))
    # Random search suggests the same configurations either way; only their benchmarks shrink.
    assert sorted(pruned.order.tolist()) == sorted(kept.order.tolist())
    assert pruned.gpu_work < kept.gpu_work


@pytest.mark.parametrize("flag", [["--prune-slower-than", "0.5"], ["--stream-poll", "-1"], ["--cpus", "0"]])
def test_a_bad_model_option_is_a_usage_error(ts, flag, capsys) -> None:
    assert main(["--cache", str(ts.path), "--seeds", "1", *flag]) == 2
    assert "must be" in capsys.readouterr().err


def test_stop_at_ends_the_run_when_reached(ts) -> None:
    optimum = ts.replay.optimum
    run = simulate_fleet(ts, "pod", 1, 3, 40, FleetModel(CONSTANT), strategy="random", stop_at=0.99,
                         clock=ticking(0.0))
    best = np.fmin.accumulate(run.values)
    assert optimum / best[-1] >= 0.99
    assert not (optimum / best[:-1] >= 0.99).any()
    assert run.end == run.times[-1]


@pytest.mark.parametrize("gpus", [1, 3])
def test_no_run_beats_the_clairvoyant_floor(ts, gpus) -> None:
    model = FleetModel(PodStartup(2.0, 5.0), cpus=4)
    good = ts.replay.time_ms <= ts.replay.optimum / 0.95
    cheapest = float((ts.compile_s + ts.gpu_s())[good].min())
    assert 0 < cheapest < float((ts.compile_s + ts.gpu_s())[~np.isnan(ts.replay.time_ms)].max())
    for seed in range(3):
        rng = startup_draws(seed)
        first = min(model.startup.at(float(rng.standard_normal())) for _ in range(gpus))
        floor = clairvoyant_s(ts, model, gpus, seed)
        assert floor == pytest.approx(first + cheapest)
        for mode in FLEET_MODES:
            run = simulate_fleet(ts, mode, gpus, seed, 40, model, strategy="random", clock=ticking(0.0))
            got = reach(run, ts.replay.optimum, 0.95)
            assert got is not None and got["wall_s"] >= floor - 1e-9
    # More GPUs start more Pods at once: the floor can only fall.
    assert clairvoyant_s(ts, model, 8, 0) <= clairvoyant_s(ts, model, 1, 0)


def _summary(mode: str, wall: float) -> dict:
    """One space's summary row, as `compare` reads it: wall-clock = GPU-seconds to 0.95."""
    return {"space": "s", "mode": mode, "gpus": 1, "seeds": 2, "wall_s_to_0.95": wall, "reached_0.95": 2,
            "gpu_s_to_0.95": wall, "evals_to_0.95": 10.0, "gpu_s_per_eval": 1.0, "gpu_s_per_eval_bound": 2.0}


def test_compare_shows_each_ratio_against_the_clairvoyant_floor() -> None:
    rows = [_summary("batch", 30.0), _summary("kernel_tuner:random_sample", 60.0), _summary("kernel_tuner:x", 80.0)]
    entry = compare(rows, [1], {("s", 1): 12.0})["per_gpus"]["1"]
    assert entry["rows"][0]["wall_ratio"] == pytest.approx(0.5)
    assert entry["rows"][0]["clairvoyant_ratio"] == pytest.approx(0.2)  # against the best Kernel Tuner strategy
    assert entry["mean_clairvoyant_ratio"] == pytest.approx(0.2)
    assert math.isnan(compare(rows, [1])["per_gpus"]["1"]["mean_clairvoyant_ratio"])


def test_reach_counts_what_is_known_at_the_time() -> None:
    run = Run("s", "batch", 1, 0, np.array([1.0, 5.0, 5.0, 9.0]), np.array([4.0, np.nan, 1.02, 1.0]),
              np.arange(4), [(0.0, 5.0), (5.0, 9.0)], 9.0)
    got = reach(run, 1.0, 0.95)
    assert got == {"wall_s": 5.0, "gpu_s": 5.0, "evals": 3}
    assert reach(run, 1.0, 0.99) == {"wall_s": 9.0, "gpu_s": 9.0, "evals": 4}
    assert reach(run, 0.5, 0.99) is None
    assert run.gpu_seconds(7.0) == pytest.approx(7.0)


def test_command_prints_tables_and_json(ts, tmp_path, capsys) -> None:
    out = tmp_path / "out.json"
    code = main(["--cache", str(ts.path), "--modes", "pod,batch", "--gpus", "1,2", "--seeds", "2", "--budget", "12",
                 "--strategy", "random", "--json", str(out), "--quiet", "--traces", str(tmp_path / "t.jsonl")])
    assert code == 0
    text = capsys.readouterr().out
    assert "### synthetic.json.gz" in text and "batch ×2" in text and "pod ×1" in text
    doc = json.loads(out.read_text())
    assert len(doc["runs"]) == 2 * 2 * 2
    assert {r["mode"] for r in doc["runs"]} == {"pod", "batch"}
    # Resumed from the traces: the same runs, none re-run.
    lines = (tmp_path / "t.jsonl").read_text().splitlines()
    assert main(["--cache", str(ts.path), "--modes", "pod,batch", "--gpus", "1,2", "--seeds", "2", "--budget", "12",
                 "--strategy", "random", "--quiet", "--traces", str(tmp_path / "t.jsonl")]) == 0
    assert (tmp_path / "t.jsonl").read_text().splitlines() == lines


# -- Kernel Tuner -------------------------------------------------------------------------

RECORDING = DEFAULT_SPACES / "pnpoly-RTX_3090.json.gz"


@pytest.mark.skipif(not RECORDING.exists(), reason=f"recorded spaces not present ({RECORDING}); CI clones lack them")
def test_kernel_tuner_mode_replays_its_own_order(tmp_path) -> None:
    pytest.importorskip("kernel_tuner", reason="Kernel Tuner is a dev extra")
    ts = load_timed_space(RECORDING)
    kt = KernelTunerCache(RECORDING, ts.keys, tmp_path)
    run = run_kernel_tuner(ts, "random_sample", 5, 25, kt)
    assert len(run.order) == len(set(run.order.tolist())) == 25
    recorded = ts.compile_s + ts.verify_s + ts.bench_s + ts.framework_s
    # One GPU, nothing overlapped: the clock is the recorded costs plus Kernel Tuner's own
    # strategy time, in its order.
    np.testing.assert_allclose(np.diff(run.times) - recorded[run.order[1:]], 0, atol=run.latency + 1e-9)
    assert run.end == pytest.approx(recorded[run.order].sum() + run.latency)
    assert run.gpu_seconds(run.end) == pytest.approx(run.end)
    np.testing.assert_array_equal(run.values, ts.replay.time_ms[run.order])
    again = run_kernel_tuner(ts, "random_sample", 5, 25, kt)
    np.testing.assert_array_equal(again.order, run.order)
    other = run_kernel_tuner(ts, "random_sample", 6, 25, kt)
    assert other.order.tolist() != run.order.tolist()


# -- `fleettune bench strategy --batch K --gpus G` ------------------------------------------


def test_strategy_bench_batches_match_sequential_at_one(ts) -> None:
    from fleettune_dev.bench.strategy import run_batched, run_once

    a = run_batched(ts.replay, "random", 4, 20, 1, 1)
    b = run_once(ts.replay, "random", 4, 20)
    np.testing.assert_array_equal(a.best, b.best)
    assert a.invalid == b.invalid


def test_strategy_bench_keeps_batches_outstanding(ts, monkeypatch) -> None:
    from fleettune.optimize import Study
    from fleettune_dev.bench.strategy import run_batched

    calls: list[tuple[int, int]] = []
    original = Study.suggest

    def spy(self, n=1, pending=()):
        calls.append((n, len(pending)))
        return original(self, n, pending)

    monkeypatch.setattr(Study, "suggest", spy)
    trace = run_batched(ts.replay, "random", 0, 30, 4, 3, ramp=False)
    # Three Pods of four outstanding, then one new Pod per finished one, the last short.
    assert calls[:4] == [(4, 0), (4, 4), (4, 8), (4, 8)]
    assert sum(n for n, _ in calls) == 30 and calls[-1][0] == 30 % 4
    assert (np.diff(trace.best) <= 0).all() and np.isfinite(trace.best[-1])

    # As the operator's Pods: one configuration each while nothing is measured, then
    # never more outstanding than measured, up to the full batch.
    calls.clear()
    trace = run_batched(ts.replay, "genetic", 0, 30, 4, 3)
    assert calls[:3] == [(1, 0), (1, 1), (1, 2)]
    observed = 0
    for (n, pending), (prev_n, _) in zip(calls[3:], calls[:-3], strict=False):
        observed += prev_n  # the oldest Pod, observed before each new suggestion
        assert n <= max(1, observed - pending), (n, observed, pending)
    assert max(n for n, _ in calls) == 4 and sum(n for n, _ in calls) == 30
    assert (np.diff(trace.best) <= 0).all()


def test_strategy_bench_prints_the_batch_comparison(ts, capsys) -> None:
    from fleettune_dev.bench.strategy import main as strategy_main

    assert strategy_main(["--cache", str(ts.path), "--strategy", "random", "--seeds", "2", "--budget", "20",
                          "--batch", "4", "--gpus", "2"]) == 0
    text = capsys.readouterr().out
    assert "random-2x4" in text and "vs sequential" in text and "target (batched vs sequential)" in text


def test_random_expectation_is_the_mean_over_every_order_of_draws(ts) -> None:
    """Against the definition, by brute force: random orders of the recording's
    configurations, each paying its recorded costs until the first at 0.95 of the optimum."""
    r = ts.replay
    cost = ts.compile_s + ts.verify_s + ts.bench_s + ts.framework_s
    good = np.nan_to_num(r.time_ms, nan=np.inf) <= r.optimum / 0.95
    assert 0 < good.sum() < len(good)  # the space has both, so the order matters
    rng = np.random.default_rng(0)
    draws = []
    for _ in range(20000):
        order = rng.permutation(len(cost))
        first = int(np.flatnonzero(good[order])[0])
        draws.append(float(cost[order[: first + 1]].sum()))
    expected = random_expectation_s(ts)
    assert expected == pytest.approx(float(np.mean(draws)), rel=4 * np.std(draws) / np.sqrt(len(draws)) / expected)


def test_compare_puts_random_sampling_at_its_expectation() -> None:
    rows = [_summary("batch", 30.0), _summary("kernel_tuner:random_sample", 20.0), _summary("kernel_tuner:x", 80.0)]
    lucky = compare(rows, [1], random_expected={"s": 60.0})["per_gpus"]["1"]
    assert lucky["rows"][0]["wall_ratio"] == pytest.approx(1.5)  # the target's verdict keeps the measured runs
    assert lucky["rows"][0]["kt_expected_s"] == pytest.approx(60.0)
    assert lucky["mean_wall_ratio_expected"] == pytest.approx(0.5)
    # Another strategy better than random sampling's expectation stays the baseline.
    assert compare(rows, [1], random_expected={"s": 90.0})["per_gpus"]["1"]["mean_wall_ratio_expected"] == \
        pytest.approx(30 / 80)
    assert math.isnan(compare(rows, [1])["per_gpus"]["1"]["mean_wall_ratio_expected"])
