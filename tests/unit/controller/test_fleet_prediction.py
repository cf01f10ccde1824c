"""A pool with no valid result yet is recommended a configuration from the other targets at
its size: the consensus rule, one other target's best, the leave-one-out confidence, and
the reporting path (a `source: gpus` prediction that goes once the pool has a result)."""

from __future__ import annotations

import logging
import math
from typing import Any

import pytest
from fleet_double import A100, FakeFleet

from fleettune.api import TuningRunSpec, TuningRunStatus
from fleettune.controller.pool import Pool
from fleettune.controller.reporting import PREDICT_EVERY_S, Reporter
from fleettune.fleetprediction import recommend
from fleettune.results import TrialRecord
from fleettune_job.protocol import Outcome

P, Q, R = {"k": "p"}, {"k": "q"}, {"k": "r"}
# Hand-made so that each GPU left out has a different pick of the rest (no ties):
#   leave a out: b, c → q (mean log slow-down 0.549 < r 0.693 < p 1.151); on a 1/2
#   leave b out: a, c → p (0.693 < r 0.805 < q 0.896);                    on b 1/2.5
#   leave c out: a, b → q (0.347 < p 0.458 < r 1.498);                    on c 1/3
#   all three:          q (0.597 < p 0.767 < r 0.998)
THREE: dict[str, list[tuple[dict[str, Any], float | None]]] = {
    "a": [(P, 1.0), (Q, 2.0), (R, 5.0)],
    "b": [(P, 2.5), (Q, 1.0), (R, 4.0)],
    "c": [(P, 4.0), (Q, 3.0), (R, 1.0)],
}


def test_the_consensus_is_the_smallest_mean_log_slow_down_an_unmeasured_one_counting_at_the_median() -> None:
    c1, c2, c3, c4, c5 = ({"x": i} for i in range(1, 6))
    others = {
        # c4 failed on a: excluded although it is b's best; c5 ran on a only.
        "a": [(c1, 1.0), (c2, 1.2), (c3, 2.0), (c4, None), (c5, 0.9)],
        "b": [(c1, 2.2), (c2, 2.0), (c3, 2.0), (c4, 1.5)],
    }
    # Slow-downs against each GPU's own best (a: c5 0.9, b: c4 1.5); b never measured c5, so
    # it counts at b's median slow-down, log(2/1.5): c5 (0 + 0.288) / 2 = 0.144 beats
    # c1 (log(1/0.9) + log(2.2/1.5)) / 2 = 0.244 and c2 (2 log(4/3)) / 2 = 0.288.
    b_median = math.log(2.0 / 1.5)
    assert b_median / 2 < (math.log(1 / 0.9) + math.log(2.2 / 1.5)) / 2 < math.log(4 / 3)
    rec = recommend([], others)
    assert rec is not None and rec.config == c5
    assert rec.basis == ("gpus: consensus of a, b (3 configurations ran on both; one a GPU did not measure counts "
                         "at its median); no confidence: fewer than three other GPUs")
    out = rec.as_dict()
    assert out["source"] == "gpus" and "predictedMs" not in out and "expectedFraction" not in out
    # A failure anywhere counts, even beside a valid time of the same configuration: without
    # c5, a's best is c1, and c1 (0 + 0.383) / 2 = 0.19 beats c2 (0.182 + 0.288) / 2 = 0.235.
    flaky = {"a": [*others["a"], (c5, None)], "b": others["b"]}
    rec = recommend([], flaky)
    assert rec is not None and rec.config == c1


def test_ties_go_to_the_configuration_that_sorts_first_whatever_the_order_of_the_results() -> None:
    x1, x2 = {"x": 1}, {"x": 2}
    others = {"a": [(x2, 1.0), (x1, 1.0)], "b": [(x2, 3.0), (x1, 3.0)]}
    reversed_ = {name: list(reversed(obs)) for name, obs in reversed(others.items())}
    picks = [recommend([], o) for o in (others, reversed_)]
    assert [p.config for p in picks if p is not None] == [x1, x1]


def test_one_other_target_gives_its_best_with_no_confidence() -> None:
    rec = recommend([], {"a100": [(P, 2.0), (Q, 1.5), (R, None)]})
    assert rec is not None and rec.config == Q
    assert rec.basis == ("gpus: the best of a100 (one other GPU; no consensus); "
                         "no confidence: fewer than three other GPUs")
    assert rec.expected_fraction is None and rec.expected_fraction_range is None


def test_without_a_configuration_in_common_each_gpu_counts_what_it_did_not_measure_at_its_median() -> None:
    # a: P 0 (median 0); b: Q 0, R log 2 (median log 2 / 2): P scores log 2 / 4, Q 0, R log 2 / 2.
    rec = recommend([], {"a": [(P, 1.0)], "b": [(Q, 1.0), (R, 2.0)]})
    assert rec is not None and rec.config == Q
    assert rec.basis.startswith("gpus: consensus of a, b (0 configurations ran on both;")


def test_three_other_targets_give_the_leave_one_out_confidence() -> None:
    rec = recommend([], THREE)
    assert rec is not None and rec.config == Q
    fractions = [1 / 2, 1 / 2.5, 1 / 3]  # see THREE
    assert rec.expected_fraction == pytest.approx(sum(fractions) / 3)
    assert rec.expected_fraction_range == pytest.approx((1 / 3, 1 / 2))
    assert rec.as_dict()["expectedFraction"] == 0.411 and rec.as_dict()["expectedFractionRange"] == [0.333, 0.5]
    assert "confidence: each of the 3 left out in turn, the consensus of the rest reached 0.41 (0.33..0.50)" \
        in rec.basis


def test_a_left_out_gpu_where_the_pick_failed_counts_zero() -> None:
    # d measured p only and q failed there: q is out, and of p (mean 0.576) and r (0.749,
    # d counting it at its median, 0) the consensus of all four is p.
    others = {**THREE, "d": [(P, 1.0), (Q, None)]}
    rec = recommend([], others)
    assert rec is not None and rec.config == P
    # Leaving a out, b, c, d pick r (0.462 < p 0.767): 1/5 on a; leaving b out, p: 1/2.5;
    # leaving c out, p: 1/4; leaving d out, the rest pick q (see THREE), which failed on d.
    fractions = [1 / 5, 1 / 2.5, 1 / 4, 0.0]
    assert rec.expected_fraction == pytest.approx(sum(fractions) / 4)
    assert rec.expected_fraction_range == pytest.approx((0.0, 1 / 2.5))
    assert "never measured" not in rec.basis


def test_a_left_out_gpu_that_never_measured_the_pick_tells_nothing() -> None:
    # d measured p only (its median slow-down: 0). Leaving a out, b, c, d pick q: 1/2 on a;
    # leaving b out, p: 1/2.5; leaving c out, q: 1/3; leaving d out, q, which d never ran.
    rec = recommend([], {**THREE, "d": [(P, 1.0)]})
    assert rec is not None
    assert rec.expected_fraction == pytest.approx((1 / 2 + 1 / 2.5 + 1 / 3) / 3)
    assert rec.expected_fraction_range == pytest.approx((1 / 3, 1 / 2))
    assert "(1 never measured it: left out)" in rec.basis


def test_configurations_that_failed_here_or_do_not_fit_this_gpu_are_skipped() -> None:
    rec = recommend([(Q, None)], THREE)
    assert rec is not None and rec.config == P and "1 better one(s) failed here" in rec.basis
    rec = recommend([(Q, None)], THREE, allowed=lambda c: c != P)
    assert rec is not None and rec.config == R
    assert recommend([(Q, None)], THREE, allowed=lambda c: False) is None


def test_nothing_is_predicted_for_a_gpu_with_a_result_or_from_gpus_without_one() -> None:
    assert recommend([(P, None), (Q, 3.0)], THREE) is None
    assert recommend([], {"a": [(P, None)]}) is None
    assert recommend([], {}) is None


# ---------------------------------------------------------------------------- the reporting path

SPEC = TuningRunSpec.model_validate({
    "kernel": {"builtin": "convolution", "problemSize": [64, 64]},
    "parameters": [{"name": "k", "type": "ordinal", "values": ["p", "q", "r"]}],
    "targets": [{"name": "a100"}, {"name": "h100"}, {"name": "l4"}],
})


def _pools() -> dict[str, Pool]:
    return {t.name: Pool(spec=t, seed=0, problem_size=(64, 64)) for t in SPEC.targets}


def _records(target: str, times: list[tuple[dict[str, Any], float | None]], start: int = 0) -> list[TrialRecord]:
    return [TrialRecord(target=target, index=start + i, config=c, key=c["k"],
                        outcome=Outcome.OK if ms is not None else Outcome.COMPILE_ERROR, objective=ms)
            for i, (c, ms) in enumerate(times)]


def _gpus(reporter: Reporter) -> list[dict[str, Any]]:
    return [p for p in reporter.predictions if p.get("source") == "gpus"]


def test_a_target_without_results_is_recommended_the_others_consensus_until_it_has_one() -> None:
    pools = _pools()
    records = _records("a100", THREE["a"]) + _records("h100", THREE["b"]) + _records("l4", [(Q, None)])
    reporter = Reporter(logging.getLogger("test"))
    reporter.report(SPEC, pools, {}, records, mono=0.0)
    (pred,) = _gpus(reporter)
    # q leads the consensus (0.347 < p 0.458 < r 1.498), but l4 measured q and it failed.
    assert pred["target"] == "l4" and pred["problemSize"] == [64, 64] and pred["config"] == P
    assert pred["basis"].startswith("gpus: consensus of a100, h100 (3 configurations ran on both;")
    assert "predictedMs" not in pred and "expectedFraction" not in pred
    # The status carries it as a Prediction (the CRD's schema).
    status = TuningRunStatus.model_validate({"predictions": reporter.predictions})
    assert status.predictions[0].source == "gpus" and status.predictions[0].expected_fraction is None
    # More results of the others within PREDICT_EVERY_S: not refitted yet.
    records += _records("a100", [({"k": "q"}, 0.5)], start=10)
    reporter.report(SPEC, pools, {}, records, mono=1.0)
    assert _gpus(reporter) == [pred]
    # l4's first valid result: its prediction goes at once, its best says the rest.
    records += _records("l4", [(P, 2.0)], start=10)
    reporter.report(SPEC, pools, {}, records, mono=2.0)
    assert _gpus(reporter) == []


def test_predictions_are_refreshed_when_results_land_at_most_every_predict_every_s() -> None:
    pools = _pools()
    records = _records("a100", [(P, 1.0), (Q, 2.0)])
    reporter = Reporter(logging.getLogger("test"))
    reporter.report(SPEC, pools, {}, records, mono=0.0)
    assert [(p["target"], p["config"]) for p in _gpus(reporter)] == [("h100", P), ("l4", P)]
    records += _records("h100", [(P, 1.5), (Q, 1.0)])  # h100 measured: only l4 is predicted for, at once
    reporter.report(SPEC, pools, {}, records, mono=1.0)
    assert [(p["target"], p["config"]) for p in _gpus(reporter)] == [("l4", P)]
    records += _records("a100", [(Q, 0.5)], start=5)  # q now leads the consensus
    reporter.report(SPEC, pools, {}, records, mono=2.0)
    assert _gpus(reporter)[0]["config"] == P
    reporter.report(SPEC, pools, {}, records, mono=2.0 + PREDICT_EVERY_S)
    assert _gpus(reporter)[0]["config"] == Q


def test_a_planned_run_recommends_the_others_consensus_to_a_pool_waiting_for_its_node() -> None:
    """Through the planner: two pools tune, the third has no node yet; once its node
    comes and its results land, its prediction goes."""
    from test_planner import SPEC as CONV
    from test_planner import timed

    def node(pool: str) -> dict[str, str]:
        return {**A100, "pool": pool}

    spec = {**CONV, "targets": [{"name": n, "nodeSelector": {"pool": n}} for n in ("a100", "h100", "l4")]}
    f = FakeFleet(spec=spec, measure=timed, nodes={"gpu-0": node("a100"), "gpu-1": node("h100")}, node_wait_s=0)
    for _ in range(8):
        f.step()
        f.finish()
        f.advance(10)
    f.step()
    assert f.status is not None
    (pred,) = [p for p in f.status.get("predictions", []) if p["source"] == "gpus"]
    assert pred["target"] == "l4" and pred["basis"].startswith("gpus: consensus of a100, h100")
    valid = [{config_key(r.config) for r in f.records_of(t) if r.outcome == Outcome.OK} for t in ("a100", "h100")]
    failed = {config_key(r.config) for t in ("a100", "h100") for r in f.records_of(t) if r.outcome != Outcome.OK}
    assert config_key(pred["config"]) in (valid[0] | valid[1]) - failed
    # Pools searching on their own share few configurations: the default, which both measure
    # first, is not what the rule falls back to.
    assert config_key(pred["config"]) != config_key(CONV["kernel"]["defaultConfig"])
    f.set_nodes({**f.nodes, "gpu-2": node("l4")})
    for _ in range(6):
        f.advance(31)
        f.step()
        f.finish()
    f.step()
    assert any(r.outcome == Outcome.OK for r in f.records_of("l4"))
    assert not [p for p in f.status.get("predictions", []) if p["source"] == "gpus"]


def config_key(config: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(config.items()))


def test_a_status_holds_a_gpus_prediction_per_pool_beside_predict_for_and_sheds_them_to_fit() -> None:
    from fleettune.api import MAX_PREDICTIONS, MAX_TUNED_TARGETS
    from fleettune.rollup import fit_status, run_status

    config = {f"p{i}": "v" * 200 for i in range(20)}
    sizes = [{"target": f"t{i}", "problemSize": [8192], "config": config, "predictedMs": 1.0, "basis": "x" * 400}
             for i in range(MAX_PREDICTIONS)]
    gpus = [{"target": f"t{i}", "problemSize": [64], "source": "gpus", "config": config, "basis": "x" * 400,
             "expectedFraction": 0.86, "expectedFractionRange": [0.8, 0.9]} for i in range(MAX_TUNED_TARGETS)]
    status = run_status(previous=None, generation=1, phase="Running", targets=[], results=None, reason="Tuning",
                        message="", extra={"predictions": sizes + gpus}).model_dump(by_alias=True, exclude_none=True,
                                                                                    mode="json")
    assert len(status["predictions"]) == MAX_PREDICTIONS + MAX_TUNED_TARGETS
    fitted = fit_status(status, 16 * 1024)
    assert "predictions" not in fitted and fitted["phase"] == "Running"


def test_a_configuration_outside_the_pools_own_constraints_is_not_recommended() -> None:
    from fleettune.space import SearchSpace

    spec = TuningRunSpec.model_validate({
        "kernel": {"builtin": "convolution", "problemSize": [64, 64]},
        "parameters": [{"name": "x", "type": "ordinal", "values": [1, 2, 4]}],
        "targets": [{"name": "a100"}, {"name": "jetson"}],
    })
    pools = {t.name: Pool(spec=t, seed=0, problem_size=(64, 64)) for t in spec.targets}
    # The Jetson's device limits leave x = 4 out of its space.
    pools["jetson"].space = SearchSpace.from_spec([{"name": "x", "type": "ordinal", "values": [1, 2, 4]}],
                                                  ["x <= 2"])
    records = [TrialRecord(target="a100", index=i, config={"x": x}, key=str(x), outcome=Outcome.OK, objective=ms)
               for i, (x, ms) in enumerate([(4, 1.0), (2, 1.5), (1, 3.0)])]
    reporter = Reporter(logging.getLogger("test"))
    reporter.report(spec, pools, {}, records, mono=0.0)
    (pred,) = _gpus(reporter)
    assert pred["target"] == "jetson" and pred["config"] == {"x": 2}
    assert "1 better one(s) failed here or are invalid on this GPU" in pred["basis"]


def test_ranked_puts_the_consensus_first_and_every_configuration_the_rule_could_choose_after() -> None:
    from fleettune.fleetprediction import ranked

    assert ranked(list(THREE.values())) == [Q, P, R]  # the consensus of all three, as in THREE's comment
    assert ranked([THREE["a"]]) == [P, Q, R]  # one GPU: its fastest first
    failed_on_b = [THREE["a"], [(P, None), (Q, 1.0)]]
    assert ranked(failed_on_b) == [Q, R]  # a configuration that failed anywhere is never chosen
    assert ranked([[(P, None)], []]) == []
