"""The baseline predictors' rules, on synthetic rows."""

from __future__ import annotations

import math
from typing import Any

import pytest

from fleettune_dev.bench.predict.baselines import (
    NAMES,
    PREDICTORS,
    CopyBest,
    Default,
    Fleet,
    GaussianProcess,
    Majority,
    Nearest,
    applicable,
    make,
    signature,
)
from fleettune_dev.bench.predict.rows import Row, config_key

A = {"BLOCK_SIZE_M": 16, "num_warps": 4}
B = {"BLOCK_SIZE_M": 64, "num_warps": 4}
C = {"BLOCK_SIZE_M": 128, "num_warps": 8}


def vrow(m: int, best: dict[str, Any], device: str = "H100", n: int = 1024, dtype: str = "auto") -> Row:
    problem = {"M": m, "E": 8, "N": n, "dtype": dtype, "device": device}
    return Row(data="vllm", kind="vllm-tables", group=device, family=f"E=8,N={n},dtype={dtype}", device=device,
               key=f"{device}|{n}|{dtype}|{m}", volume=float(m), problem=problem, best=best)


def series(ms: list[int], device: str = "H100") -> list[Row]:
    """A vLLM-like table: the best changes at M=64 and again at M=256."""
    return [vrow(m, A if m < 64 else B if m < 256 else C, device) for m in ms]


TRAIN = series([1, 4, 16, 64, 256])


def fitted(predictor: Any, train: list[Row]) -> Any:
    predictor.fit(train)
    return predictor


def test_nearest_log2_and_linear_differ_where_the_scales_do() -> None:
    log2, linear = fitted(Nearest("log2"), TRAIN), fitted(Nearest("linear"), TRAIN)
    assert log2.name == "nearest-log2" and linear.name == "nearest-linear"
    # M=40: 64 is 0.68 octaves away, 16 is 1.32; linearly both are 24 away (a tie: the smaller M).
    assert log2.rank(vrow(40, B), 1) == [B]
    assert linear.rank(vrow(40, B), 1) == [A]
    # M=150: 256 is nearer in octaves, 64 in absolute value.
    assert log2.rank(vrow(150, B), 1) == [C]
    assert linear.rank(vrow(150, B), 1) == [B]
    # Equally near in octaves (M=2 between 1 and 4): the smaller problem's best.
    assert log2.rank(vrow(2, A), 1) == [A]


def test_nearest_ranks_distinct_configurations_of_the_next_nearest_rows() -> None:
    log2 = fitted(Nearest("log2"), TRAIN)
    assert log2.rank(vrow(40, B), 3) == [B, A, C]
    assert log2.rank(vrow(40, B), 10) == [B, A, C]  # only three distinct bests exist
    assert log2.rank(vrow(2, A), 2) == [A, B]


def test_nearest_keeps_to_the_group_and_the_kind_of_problem() -> None:
    other_dtype = [vrow(m, C, dtype="fp8_w8a8") for m in (32, 48)]
    other_device = series([40, 48], device="A100")
    log2 = fitted(Nearest("log2"), TRAIN + other_dtype + other_device)
    assert log2.rank(vrow(40, B), 1) == [B]  # neither the fp8 table's M=48 nor the A100's M=40
    # No row of this kind in its group: the group's rows.
    assert log2.rank(vrow(40, B, dtype="int8"), 1) == [C]  # the fp8 row at M=48 is nearest
    assert log2.rank(vrow(40, B, device="L40S"), 5) == []


def test_nearest_prefers_the_same_family_among_equally_near_rows() -> None:
    # Another table (N=2048, one octave away) at the held-out M ties with the own table's
    # M=4, one octave away, and is the smaller problem.
    train = [*series([4]), vrow(2, C, n=2048)]
    assert fitted(Nearest("log2"), train).rank(vrow(2, A), 1) == [A]


def test_nearest_on_many_rows_matches_a_full_sort() -> None:
    # More rows than the prefilter keeps: the answer must not change.
    train = [vrow(m, {"BLOCK_SIZE_M": m % 7, "num_warps": 4}) for m in range(1, 2000, 3)]
    ranked = fitted(Nearest("log2"), train).rank(vrow(1000, A), 7)
    expect = sorted(train, key=lambda r: (abs(math.log2(r.volume) - math.log2(1000)), r.volume))
    seen: list[dict[str, Any]] = []
    for r in expect:
        if r.best not in seen:
            seen.append(dict(r.best))
    assert ranked == seen[:7]


def perfdb_row(fil: int, channels: int, best: dict[str, Any], direction: str = "F") -> Row:
    problem = {"layout": "NCHW", "data_type": "FP32", "direction": direction, "in_channels": channels,
               "out_channels": channels, "in_h": 14, "in_w": 14, "fil_h": fil, "fil_w": fil, "pad_h": fil // 2,
               "pad_w": fil // 2, "conv_stride_h": 1, "conv_stride_w": 1, "batchsize": 16, "device": "gfx906"}
    return Row(data="perfdb", kind="miopen-perfdb", group="ConvAsm", family=f"{fil}-{channels}", device="gfx906",
               key=f"{fil}-{channels}-{direction}", volume=float(channels * channels * fil * fil),
               problem=problem, best=best)


def test_nearest_on_miopen_matches_the_filter_and_padding() -> None:
    train = [perfdb_row(3, 64, A), perfdb_row(1, 128, B)]
    assert dict(signature(train[0]))["fil_h"] == 3 and "in_channels" not in dict(signature(train[0]))
    # 128 channels are nearer, but the 1x1 filter is another kind of problem.
    assert fitted(Nearest("log2"), train).rank(perfdb_row(3, 128, C), 1) == [A]
    # Kernel Tuner and vLLM rows: their filter-like numbers are sizes, no such rule.
    assert "N" not in dict(signature(vrow(1, A)))


def test_majority_ranks_by_frequency() -> None:
    train = series([1, 2, 4, 64, 128, 256])  # A three times, B twice, C once
    majority = fitted(Majority(), train)
    assert majority.rank(vrow(8, B), 5) == [A, B, C]
    assert majority.rank(vrow(8, B, device="A100"), 5) == []


def test_copy_best_takes_the_same_problem_on_another_device() -> None:
    train = [vrow(64, C, "L40S"), vrow(64, B, "A100"), vrow(64, A, "H100"), vrow(32, A, "B200")]
    copy = fitted(CopyBest(), train)
    # Its own device's row aside; the other devices by name (A100, then L40S).
    assert copy.rank(vrow(64, A, "H100"), 5) == [B, C]
    assert copy.rank(vrow(64, A, "H100"), 1) == [B]
    assert copy.rank(vrow(16, A, "H100"), 5) == []  # no other device tuned M=16
    assert copy.rank(vrow(64, A, "H100", dtype="fp8"), 5) == []  # another kind of problem


def test_default_is_the_rows_default() -> None:
    row = vrow(8, A)
    assert Default().rank(row, 3) == []
    with_default = Row(**{**row.__dict__, "default": B})
    assert Default().rank(with_default, 3) == [B]


def timed(device: str, times: dict[str, float], invalid: tuple[dict[str, Any], ...] = ()) -> Row:
    keyed = {config_key(c): t for c, t in zip((A, B, C), times.values(), strict=False)}
    best = (A, B, C)[list(times.values()).index(min(times.values()))]
    return Row(data="kt", kind="kt-caches", group="gemm", family="gemm", device=device, key=f"gemm|{device}",
               volume=4096.0, problem={"size_0": 4096, "device": device}, best=best, times=keyed,
               invalid=frozenset(config_key(c) for c in invalid))


def test_fleet_ranks_by_the_mean_log_slowdown_on_the_other_devices() -> None:
    # On X: A 1.0, B 1.1, C 4.0; on Y: A 2.0, B 1.0, C 1.2 (log ratios: A .35, B .05, C .74 mean).
    train = [timed("X", {"a": 1.0, "b": 1.1, "c": 4.0}), timed("Y", {"a": 2.0, "b": 1.0, "c": 1.2})]
    fleet = fitted(Fleet(), train)
    assert fleet.rank(timed("Z", {"a": 1.0, "b": 1.0, "c": 1.0}), 3) == [B, A, C]
    # A configuration that failed on one device is out.
    train[1] = Row(**{**train[1].__dict__, "invalid": frozenset({config_key(A)}),
                      "times": {config_key(B): 1.0, config_key(C): 1.2}})
    assert fitted(Fleet(), train).rank(timed("Z", {"a": 1.0}), 3) == [B, C]
    # No times on the other devices (vLLM tables): nothing to go on.
    assert fitted(Fleet(), [vrow(64, B, "A100")]).rank(vrow(64, B), 3) == []


def kt_row(size: int, device: str = "X") -> Row:
    """A landscape whose optimum (bx=64, tile=2) is the same at every size."""
    times: dict[str, float] = {}
    invalid = set()
    for bx in (16, 32, 64, 128):
        for tile in (1, 2, 4):
            c = {"bx": bx, "tile": tile}
            if bx * tile > 256:
                invalid.add(config_key(c))
                continue
            times[config_key(c)] = size / 1000 * (1 + abs(math.log2(bx) - 6) * 0.4 + abs(math.log2(tile) - 1) * 0.3)
    return Row(data="kt", kind="kt-caches", group="conv", family="conv", device=device, key=f"conv|{device}|{size}",
               volume=float(size), problem={"size_0": size, "device": device}, best={"bx": 64, "tile": 2},
               times=times, invalid=frozenset(invalid))


def test_gp_recommends_from_other_sizes_of_the_kernel_on_the_device() -> None:
    gp = fitted(GaussianProcess(), [kt_row(1024), kt_row(4096), kt_row(2048, device="Y")])
    assert gp.rank(kt_row(2048), 10) == [{"bx": 64, "tile": 2}]
    assert gp.rank(kt_row(2048, device="Z"), 10) == []  # nothing tuned on this device
    assert fitted(GaussianProcess(), TRAIN).rank(vrow(40, B), 10) == []  # not Kernel Tuner data


def test_the_registry() -> None:
    assert set(PREDICTORS) | {"occupancy"} == set(NAMES)
    for name in ("nearest-log2", "nearest-linear", "majority", "copy-best", "default", "fleet", "gp"):
        assert make(name).name == name
    assert not applicable("occupancy", TRAIN)
    assert not applicable("gp", TRAIN) and applicable("gp", [kt_row(1024)])
    assert not applicable("fleet", TRAIN) and not applicable("default", TRAIN)
    assert applicable("copy-best", TRAIN + series([1], device="A100"))


@pytest.mark.parametrize("name", ["nearest-log2", "nearest-linear", "majority", "copy-best", "default", "fleet"])
def test_no_predictor_looks_at_the_answer(name: str) -> None:
    row = timed("Z", {"a": 1.0, "b": 2.0, "c": 3.0})
    swapped = Row(**{**row.__dict__, "best": C, "times": {config_key(C): 1.0}})
    train = [timed("X", {"a": 1.0, "b": 1.1, "c": 4.0}), timed("Y", {"a": 2.0, "b": 1.0, "c": 1.2})]
    predictor = fitted(make(name), train)
    assert predictor.rank(row, 3) == predictor.rank(swapped, 3)


def gpu(device: str, times: dict[str, float]) -> Row:
    keyed = {config_key({"c": c}): t for c, t in times.items()}
    best = {"c": min(times, key=lambda c: times[c])}
    return Row(data="kt", kind="kt-caches", group="k", family="k", device=device, key=f"k|{device}", volume=1.0,
               problem={"size_0": 1, "device": device}, best=best, times=keyed)


def test_measuring_the_fleet_follows_the_devices_that_rank_like_this_gpu() -> None:
    # Two kinds of GPU: on "n*" configurations p.. run fast, on "a*" configurations q..; the
    # consensus (three n-like devices against two a-like ones) starts on the n side. The
    # held-out GPU is a-like: once three picks ran, the a devices lead and its best comes next.
    n_like = {"p0": 1.0, "p1": 1.1, "p2": 1.2, "p3": 1.3, "q0": 3.0, "q1": 3.2, "m": 1.2}
    a_like = {"p0": 3.0, "p1": 2.0, "p2": 2.2, "p3": 4.0, "q0": 1.0, "q1": 1.1, "m": 1.2}
    train = [gpu(d, n_like) for d in ("n1", "n2", "n3")] + [gpu(d, a_like) for d in ("a1", "a2")]
    target = gpu("a3", {c: 2 * t for c, t in a_like.items()})
    asked: list[str] = []

    def measure(config: dict[str, Any]) -> float | None:
        asked.append(config["c"])
        return 2 * a_like[config["c"]]

    fleet = fitted(Fleet(), train)
    plain = [c["c"] for c in fleet.rank(target, 7)]
    measured = [c["c"] for c in fleet.rank_measured(target, 7, measure)]
    assert measured[0] == plain[0] == "m"  # no measurement yet: the consensus
    assert plain.index("q0") > 3 and measured.index("q0") == 3  # right after the third measurement
    assert asked == measured  # it measured exactly what it ranked, one by one
