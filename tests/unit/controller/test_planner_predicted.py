"""`budget.stopWhenPredicted` through the planner (tests/unit/controller/fleet_double.py plays
the cluster): a pool that starts after the others measures their confident prediction for
it beside the default and stops once nothing beats it; a pool where something does tunes
on; an unconfident prediction, or the flag off, changes nothing."""

from __future__ import annotations

from typing import Any

import pytest
from fleet_double import A100, FakeFleet

from fleettune.controller.pool import Pool
from fleettune.controller.reporting import Reporter
from fleettune.controller.trials import confident_prediction
from fleettune.optimize.stopping import CONFIRM_TRIALS
from fleettune.space import SearchSpace
from fleettune_job.protocol import Outcome, TrialResult

DEFAULT = {"block_size_x": 16, "block_size_y": 16, "tile_size_x": 1, "tile_size_y": 1, "read_only": 0,
           "use_padding": 1, "use_shmem": 1, "use_cmem": 1, "filter_height": 15, "filter_width": 15}
FIXED = {k: v for k, v in DEFAULT.items() if k not in ("block_size_x", "block_size_y", "read_only")}
# 4 x 5 x 2 configurations less block 128 x 16 (over 1024 threads): 38, which each of the
# first pools measures in full, so that every one left out gets the optimum from the rest.
SPACE = 38
BEST = {**DEFAULT, "block_size_x": 64, "block_size_y": 4, "read_only": 0}
OTHERS = ("a100", "h100", "l40")
LATE = "late"


def spec(stop: bool, others: tuple[str, ...] = OTHERS) -> dict[str, Any]:
    return {
        "kernel": {"builtin": "convolution", "problemSize": [4096, 4096], "defaultConfig": DEFAULT},
        "parameters": [
            {"name": "block_size_x", "type": "ordinal", "values": [16, 32, 64, 128]},
            {"name": "block_size_y", "type": "ordinal", "values": [1, 2, 4, 8, 16]},
            {"name": "read_only", "type": "ordinal", "values": [0, 1]},
            *({"name": k, "type": "ordinal", "values": [v]} for k, v in FIXED.items()),
        ],
        "constraints": ["block_size_x * block_size_y <= device.max_threads_per_block"],
        "strategy": {"name": "random", "seed": 5},
        "budget": {"trialsPerTarget": 40, "parallelism": 3, "stopWhenPredicted": stop},
        "targets": [{"name": n, "nodeSelector": {"pool": n}} for n in (*others, LATE)],
    }


def landscape(config: dict[str, Any]) -> TrialResult:
    """One optimum (BEST, 1 ms); the next best 1.25 ms."""
    ms = 1.0 + abs(config["block_size_x"] - 64) / 64 + abs(config["block_size_y"] - 4) / 8 + config["read_only"]
    return TrialResult(outcome=Outcome.OK, objective=ms, times=[ms])


def elsewhere(config: dict[str, Any]) -> TrialResult:
    """The late GPU's own landscape: the others' optimum is its slowest."""
    if {k: config[k] for k in ("block_size_x", "block_size_y", "read_only")} == {k: BEST[k] for k in (
            "block_size_x", "block_size_y", "read_only")}:
        return TrialResult(outcome=Outcome.OK, objective=9.0, times=[9.0])
    return landscape(config)


def others_done(stop: bool, others: tuple[str, ...] = OTHERS) -> FakeFleet:
    """The other pools tuned to the end; the late pool waits for its node (none yet)."""
    nodes = {f"gpu-{i}": {**A100, "pool": n} for i, n in enumerate(others)}
    f = FakeFleet(spec=spec(stop, others), measure=landscape, nodes=nodes, node_wait_s=0)
    for _ in range(40):
        f.step()
        if all(f.target(n)["phase"] == "Succeeded" for n in others):
            break
        f.finish()
        f.advance(31)  # past PREDICT_EVERY_S: the prediction follows the results
    assert all(f.target(n)["message"] == "search space exhausted" for n in others)
    f.advance(31)
    f.step()
    return f


def late_tunes(f: FakeFleet) -> dict[str, Any]:
    f.set_nodes({**f.nodes, "gpu-late": {**A100, "pool": LATE}})
    for _ in range(40):
        f.step()
        if f.target(LATE)["phase"] == "Succeeded":
            break
        f.finish()
        f.advance(31)
    return f.target(LATE)


def first_configs(f: FakeFleet) -> list[dict[str, Any]]:
    return [r.config for r in sorted(f.records_of(LATE), key=lambda r: r.index)]


def the_prediction(f: FakeFleet) -> dict[str, Any]:
    assert f.status is not None
    (pred,) = [p for p in f.status["predictions"] if p["source"] == "gpus" and p["target"] == LATE]
    return pred


def measured_predictions(f: FakeFleet) -> list[str]:
    return [m for kind, reason, m in f.planner.events if reason == "PredictionMeasured"]


def test_a_confident_prediction_is_measured_first_and_stops_the_pool_once_nothing_beats_it() -> None:
    f = others_done(stop=True)
    pred = the_prediction(f)
    assert pred["config"] == BEST and pred["expectedFractionRange"] == [1.0, 1.0]
    t = late_tunes(f)
    configs = first_configs(f)
    assert configs[:2] == [DEFAULT, BEST]  # beside the default, in the first Pod
    # Measured once: the strategy's picks do not repeat it.
    assert sum(c == BEST for c in configs) == 1
    more = len(configs) - 1
    assert CONFIRM_TRIALS <= more < SPACE - 1 and t["valid"] == len(configs)
    key = ",".join(str(BEST[p["name"]]) for p in spec(True)["parameters"])
    assert t["message"] == f"prediction confirmed: {key} measured within 1% of the best after {more} more trials"
    assert t["best"]["config"] == BEST
    assert ("Normal", "TargetSucceeded", f"{LATE}: {t['message']}") in f.planner.events
    assert measured_predictions(f) == [f"{LATE}: measuring the other GPUs' confident prediction {key} first "
                                       "(budget.stopWhenPredicted)"]
    assert f.status is not None and f.status["phase"] == "Succeeded"
    # While the flag is on, a spec edit that re-opens the pool ends it again, with nothing new.
    f.edit(budget={**f.spec["budget"], "trialsPerTarget": 50})
    f.step()
    assert f.target(LATE)["message"] == t["message"] and len(f.records_of(LATE)) == len(configs) and not f.jobs


def test_a_prediction_a_later_trial_beats_lets_the_pool_tune_on_with_its_full_budget() -> None:
    f = others_done(stop=True)
    assert the_prediction(f)["config"] == BEST
    f.measure = elsewhere
    t = late_tunes(f)
    configs = first_configs(f)
    assert configs[:2] == [DEFAULT, BEST] and measured_predictions(f)
    assert len(configs) == SPACE and t["message"] == "search space exhausted"


def test_with_the_flag_off_nothing_changes() -> None:
    f = others_done(stop=False)
    assert the_prediction(f)["config"] == BEST  # predicted for the status all the same
    t = late_tunes(f)
    configs = first_configs(f)
    assert configs[0] == DEFAULT and not measured_predictions(f) and f.planner.pools[LATE].predicted is None
    assert len(configs) == SPACE and t["message"] == "search space exhausted"


def test_a_prediction_with_no_confidence_is_not_measured() -> None:
    f = others_done(stop=True, others=OTHERS[:2])  # two other GPUs: no leave-one-out range
    assert "expectedFractionRange" not in the_prediction(f)
    t = late_tunes(f)
    assert not measured_predictions(f) and f.planner.pools[LATE].predicted is None
    assert len(first_configs(f)) == SPACE and t["message"] == "search space exhausted"


def test_a_prediction_below_the_confident_fraction_is_not_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    real = Reporter._gpu_predictions

    def doubtful(self: Reporter, *args: Any) -> list[dict[str, Any]]:
        return [p | {"expectedFractionRange": [0.89, 1.0]} for p in real(self, *args)]

    monkeypatch.setattr(Reporter, "_gpu_predictions", doubtful)
    f = others_done(stop=True)
    assert the_prediction(f)["expectedFractionRange"] == [0.89, 1.0]
    t = late_tunes(f)
    assert not measured_predictions(f) and len(first_configs(f)) == SPACE and t["message"] == "search space exhausted"


# ---------------------------------------------------------------------------- choosing the prediction

PARAMS = [{"name": "x", "type": "ordinal", "values": [1, 2, 4]}]


def _pool(constraints: list[str]) -> Pool:
    from fleettune.api import TargetSpec

    pool = Pool(spec=TargetSpec(name="jetson"), seed=0, problem_size=(64, 64))
    pool.space = SearchSpace.from_spec(PARAMS, constraints)
    return pool


def _gpus(config: dict[str, Any], low: float | None, **over: Any) -> list[dict[str, Any]]:
    entry = {"target": "jetson", "problemSize": [64, 64], "source": "gpus", "config": config, "basis": ""}
    if low is not None:
        entry |= {"expectedFraction": 0.95, "expectedFractionRange": [low, 1.0]}
    return [entry | over]


def test_only_a_confident_prediction_valid_in_the_pools_own_space_and_for_its_size_is_chosen() -> None:
    pool = _pool([])
    assert confident_prediction(pool, _gpus({"x": 4}, 0.9)) == ("4", {"x": 4})
    assert confident_prediction(pool, _gpus({"x": 4}, 0.899)) is None
    assert confident_prediction(pool, _gpus({"x": 4}, None)) is None
    assert confident_prediction(pool, _gpus({"x": 4}, 0.95, problemSize=[128, 128])) is None
    assert confident_prediction(pool, _gpus({"x": 4}, 0.95, target="a100")) is None
    assert confident_prediction(pool, _gpus({"x": 4}, 0.95, source=None)) is None
    assert confident_prediction(pool, _gpus({"x": 3}, 0.95)) is None  # not a value of the space
    # The device's constraints (a Jetson's): the prediction was made before the pool had them.
    assert confident_prediction(_pool(["x <= 2"]), _gpus({"x": 4}, 0.95)) is None
    assert confident_prediction(_pool(["x <= 2"]), _gpus({"x": 2}, 0.95)) == ("2", {"x": 2})
