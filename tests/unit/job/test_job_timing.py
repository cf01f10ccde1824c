from __future__ import annotations

import pytest

from fleettune_job.timing import measure, reported, summarize


class FakeGpu:
    """Each launch 'takes' a fixed time; the clock advances by it."""

    def __init__(self, ms: float) -> None:
        self.ms = ms
        self.launches = 0
        self.now = 0.0

    def launch(self) -> None:
        self.launches += 1

    def timer(self, launch) -> float:  # type: ignore[no-untyped-def]
        launch()
        self.now += self.ms / 1000
        return self.ms

    def clock(self) -> float:
        return self.now


def test_warmups_are_run_but_not_reported() -> None:
    gpu = FakeGpu(2.0)
    times = measure(gpu.launch, gpu.timer, warmups=3, repeats=5, clock=gpu.clock)
    assert times == [2.0] * 5 and gpu.launches == 8


def test_minimum_duration_adds_repeats_for_short_kernels() -> None:
    gpu = FakeGpu(0.01)  # 10 microseconds
    times = measure(gpu.launch, gpu.timer, warmups=0, repeats=3, min_duration_s=0.001, clock=gpu.clock)
    assert len(times) == 100


def test_minimum_duration_stops_at_the_deadline_and_at_the_cap() -> None:
    gpu = FakeGpu(1.0)
    times = measure(gpu.launch, gpu.timer, warmups=0, repeats=2, min_duration_s=100.0, deadline=0.05,
                    clock=gpu.clock)
    assert len(times) == 50
    times = measure(gpu.launch, gpu.timer, warmups=0, repeats=2, min_duration_s=100.0, max_repeats=20,
                    clock=gpu.clock)
    assert len(times) == 20


def test_requested_repeats_always_run_even_past_the_deadline() -> None:
    gpu = FakeGpu(1.0)
    times = measure(gpu.launch, gpu.timer, warmups=0, repeats=4, deadline=-1.0, clock=gpu.clock)
    assert len(times) == 4


def test_a_clearly_slow_configuration_is_pruned_after_three_timed_launches() -> None:
    gpu = FakeGpu(5.0)
    times = measure(gpu.launch, gpu.timer, warmups=2, repeats=7, min_duration_s=10.0, prune_above_ms=4.0,
                    clock=gpu.clock)
    assert times == [5.0] * 3 and gpu.launches == 5  # nor does the minimum duration add any


@pytest.mark.parametrize(("ms", "repeats", "min_duration_s", "expected"),
                         [(3.0, 7, 0.0, 7), (5.0, 3, 0.0, 3), (5.0, 2, 0.0, 2), (5.0, 3, 0.048, 10)])
def test_a_configuration_under_the_cutoff_or_with_few_repeats_is_timed_in_full(
        ms: float, repeats: int, min_duration_s: float, expected: int) -> None:
    gpu = FakeGpu(ms)
    times = measure(gpu.launch, gpu.timer, warmups=0, repeats=repeats, min_duration_s=min_duration_s,
                    prune_above_ms=4.0, clock=gpu.clock)
    assert len(times) == expected


@pytest.mark.parametrize(("first", "pruned"), [
    ([9.0, 1.0, 1.0], False),  # one slow launch (a cold cache) prunes nothing
    ([13.0, 1.0, 1.0], False),  # nor does it when it lifts the mean over the cut-off
    ([5.0, 1.0, 5.0], True),  # one fast launch does not save a slow configuration
])
def test_pruning_goes_by_the_median_of_the_first_launches(first: list[float], pruned: bool) -> None:
    """The median is what a pruned configuration reports: it is always above the cut-off,
    so a pruned configuration can never look faster than the best it was measured against."""
    durations = iter(first + [1.0] * 10)
    times = measure(lambda: None, lambda launch: next(durations), warmups=0, repeats=7, prune_above_ms=4.0)
    assert len(times) == (3 if pruned else 7)
    if pruned:
        assert summarize(times).median > 4.0


@pytest.mark.parametrize(("ms", "prune_above_ms", "repeats", "verified_after"), [
    (1.0, None, 7, 0),  # nothing to prune: verified before any timed launch
    (1.0, 4.0, 3, 0),  # too few repeats to prune: the same
    (1.0, 4.0, 7, 3),  # may be pruned: verified once the first three did not prune it
    (5.0, 4.0, 7, None),  # pruned: never verified
])
def test_verification_waits_for_the_pruning_decision(ms: float, prune_above_ms: float | None, repeats: int,
                                                     verified_after: int | None) -> None:
    gpu = FakeGpu(ms)
    seen: list[int] = []
    times = measure(gpu.launch, gpu.timer, warmups=2, repeats=repeats, prune_above_ms=prune_above_ms,
                    clock=gpu.clock, verify=lambda: seen.append(gpu.launches))
    assert seen == ([] if verified_after is None else [(0 if verified_after == 0 else 2 + verified_after)])
    assert len(times) == (3 if verified_after is None else repeats)
    # A check between timed launches is followed by the warm-ups again: the GPU sat idle.
    assert gpu.launches == 2 + len(times) + (2 if verified_after == 3 else 0)


def test_a_wrong_result_stops_timing() -> None:
    gpu = FakeGpu(1.0)

    def wrong() -> None:
        raise ValueError("wrong result")

    with pytest.raises(ValueError, match="wrong result"):
        measure(gpu.launch, gpu.timer, warmups=1, repeats=7, prune_above_ms=4.0, verify=wrong)
    assert gpu.launches == 1 + 3


def test_summary_statistics() -> None:
    stats = summarize([1.0, 2.0, 3.0, 4.0, 100.0])
    assert stats.median == 3.0 and stats.minimum == 1.0 and stats.maximum == 100.0
    assert stats.iqr == pytest.approx(2.0) and stats.relative_spread == pytest.approx(2 / 3)
    assert stats.count == 5 and stats.total_ms == 110.0
    assert "median=3 ms" in stats.line()
    single = summarize([0.5])
    assert single.median == 0.5 and single.iqr == 0 and single.stdev == 0
    with pytest.raises(ValueError):
        summarize([])


def test_reported_times_are_bounded_and_rounded() -> None:
    assert reported([1.23456789, 2.0]) == [1.23457, 2.0]
    many = [float(i) for i in range(1000)]
    sample = reported(many)
    assert len(sample) == 32 and sample[0] == 0.0 and sample == sorted(sample)
