"""Pure decisions of a target pool: the warm-start prior across rounds."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fleettune.api import KernelSpec, TuningRunSpec
from fleettune.controller.pool import Pool, build_search, warm_start_prior
from fleettune.results import Records, TrialRecord
from fleettune_job.protocol import Outcome

ROOT = Path(__file__).resolve().parents[3]
SPEC = TuningRunSpec.model_validate(yaml.safe_load((ROOT / "examples" / "convolution-fleet.yaml").read_text())["spec"])


def _pool(key: str, round_: int = 1) -> Pool:
    pool = Pool(spec=SPEC.targets[0], seed=0, key=key, round=round_)
    build_search(SPEC, pool, "NVIDIA A100-PCIE-40GB", "spec.targets[0]")
    return pool


def _rec(target: str, index: int, bx: int, ms: float | None, round_: int = 1) -> TrialRecord:
    config = {**SPEC.kernel.default_config, "block_size_x": bx, "block_size_y": 1, "use_padding": 0}
    return TrialRecord(target=target, index=index, config=config, key=str(bx), round=round_,
                       outcome=Outcome.OK if ms else Outcome.COMPILE_ERROR, objective=ms)


def test_kernel_sizes_one_or_several():
    assert KernelSpec(builtin="gemm", problem_size=[64, 64]).sizes() == [(64, 64)]
    assert KernelSpec(builtin="gemm", problem_sizes=[[64, 64], [8, 8]]).sizes() == [(64, 64), (8, 8)]


def test_prior_from_older_rounds_each_relative_to_its_best():
    records = [
        _rec("a100.2048x2048", 4, 16, 3.0), _rec("a100.2048x2048", 5, 32, 1.5),  # this size, round 1
        _rec("a100.2048x2048", 8, 64, None),
        _rec("a100.2048x2048", 6, 64, 9.0, round_=2),  # this size, this round: not a prior
        # Another size of this target and another target: `controller.memory` shares them.
        _rec("a100.4096x4096", 0, 16, 4.0), _rec("rtx.2048x2048", 7, 16, 0.1),
    ]
    got = sorted((c["block_size_x"], o, v) for c, o, v in warm_start_prior(_pool("a100.2048x2048", 2), records))
    assert got == [(16, Outcome.OK, pytest.approx(2.0)), (32, Outcome.OK, pytest.approx(1.0)),
                   (64, Outcome.COMPILE_ERROR, None)]
    # The first round starts cold.
    assert warm_start_prior(_pool("a100.2048x2048", 1), records) == []


def test_strategy_options_zero_only_where_it_switches_a_behaviour_off():
    from fleettune.controller.spec import SpecError, check_options

    def spec(**options) -> TuningRunSpec:
        return SPEC.model_copy(update={"strategy": SPEC.strategy.model_copy(update={"options": options})})

    check_options(spec(prior_patience=0, stall=0, min_gain=0, prior_top=2))
    with pytest.raises(SpecError, match=r"spec.strategy.options.prior_top: expected an integer >= 1, got 0"):
        check_options(spec(prior_top=0))
    with pytest.raises(SpecError, match=r"spec.strategy.options.prior_patience: expected an integer >= 0, got -1"):
        check_options(spec(prior_patience=-1))


def test_a_former_strategy_option_is_refused_naming_it_and_what_replaced_it():
    from fleettune.controller.spec import SpecError, check_options

    def spec(**options) -> TuningRunSpec:
        return SPEC.model_copy(update={"strategy": SPEC.strategy.model_copy(update={"options": options})})

    with pytest.raises(SpecError, match=r'^spec.strategy.options.transform: no longer an option: it is now fixed at '
                       r'"log"; ') as err:
        check_options(spec(initial=4, transform="copula"))
    assert err.value.reason == "InvalidSpec"
    with pytest.raises(SpecError, match=r"^spec.strategy.options.prior_paths: no longer an option: it is now fixed "
                       r"at 3$"):
        check_options(spec(prior_paths=0))


def test_a_pools_records_by_target_are_those_a_scan_finds_in_order():
    records = [_rec("a100", 0, 16, 4.0), _rec("a4000", 1, 16, 3.0), _rec("a100", 2, 32, None, round_=2),
               _rec("a100", 3, 64, 2.0), _rec("a100.64x64", 4, 16, 1.0), _rec("a100", 5, 128, 5.0, round_=2)]
    indexed = Records(records)
    assert list(indexed) == records and len(indexed) == 6 and indexed[1] is records[1]
    assert [r.index for r in indexed.of("a100")] == [0, 2, 3, 5] and indexed.of("h100") == []
    for round_ in (1, 2):
        pool = _pool("a100", round_=round_)
        for all_rounds in (False, True):
            assert pool.records(indexed, all_rounds=all_rounds) == pool.records(records, all_rounds=all_rounds)
    assert [r.index for r in _pool("a100", round_=2).records(indexed)] == [2, 5]
