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


def test_pruning_goes_by_the_mean_of_the_first_launches() -> None:
    """One slow first launch (a cold cache) does not prune a configuration near the cut-off."""
    durations = iter([9.0, 1.0, 1.0] + [1.0] * 10)
    times = measure(lambda: None, lambda launch: next(durations), warmups=0, repeats=7, prune_above_ms=4.0)
    assert len(times) == 7


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
