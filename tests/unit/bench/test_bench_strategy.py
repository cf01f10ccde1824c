"""`fleettune bench strategy --variant`: a strategy option judged per kernel family, with
paired differences over the seeds (a gain must not be one space's luck)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_bench_warmstart import write_cache

from fleettune_dev.bench.strategy import family, main, paired_by_family
from fleettune_dev.bench.strategy_tables import format_variant_comparison


def runs(levels: dict[str, list[float]], budget: int = 20) -> dict[str, dict[int, np.ndarray]]:
    """Per space, per seed: a run at that fraction of the optimum from its first evaluation."""
    return {space: {seed: np.full(budget, v) for seed, v in enumerate(per_seed)} for space, per_seed in levels.items()}


def test_a_variant_is_compared_per_family_and_over_all_spaces() -> None:
    base = runs({"gemm-A.json.gz": [0.8, 0.8, 0.8], "gemm-B.json.gz": [0.9, 0.9, 0.9],
                 "pnpoly-A.json.gz": [0.5, 0.6, 0.7]})
    variant = runs({"gemm-A.json.gz": [0.9, 0.9, 0.9], "gemm-B.json.gz": [0.9, 0.9, 0.9],
                    "pnpoly-A.json.gz": [0.5, 0.8, 0.7]})
    rows = {r["family"]: r for r in paired_by_family(base, variant, 20)}
    assert list(rows) == ["gemm", "pnpoly", "all"]
    gemm, pnpoly, every = rows["gemm"], rows["pnpoly"], rows["all"]
    assert (gemm["spaces"], gemm["seeds"]) == (2, 3) and every["spaces"] == 3
    # A seed's difference is the mean over the family's spaces: +0.1 on one of two.
    assert gemm["baseline"]["20"] == pytest.approx(0.85) and gemm["variant"]["20"] == pytest.approx(0.9)
    assert gemm["difference"]["20"] == pytest.approx(0.05) and gemm["standard_error"]["20"] == pytest.approx(0)
    # One seed of three gained 0.2: mean +0.067, standard error 0.2 / 3 (the paired one).
    assert pnpoly["difference"]["20"] == pytest.approx(0.2 / 3)
    assert pnpoly["standard_error"]["20"] == pytest.approx(np.std([0, 0.2, 0], ddof=1) / np.sqrt(3))
    assert every["difference"]["20"] == pytest.approx(np.mean([0.1 / 3, (0.1 + 0.2) / 3, 0.1 / 3]))
    text = format_variant_comparison(list(rows.values()), "bayes with x=1 vs bayes")
    assert "| gemm | 2 | 3 | 0.850 → 0.900 (+0.050 ± 0.000) |" in text
    assert "| **all** | 3 | 3 |" in text


def test_only_seeds_run_everywhere_by_both_are_paired() -> None:
    base = runs({"gemm-A": [0.8, 0.8, 0.8], "gemm-B": [0.8, 0.8]})
    variant = runs({"gemm-A": [0.9, 0.9, 0.1], "gemm-B": [0.9]})
    (only,) = paired_by_family(base, variant, 20)  # one family: no "all" row repeating it
    assert only["family"] == "gemm" and only["seeds"] == 1
    assert only["difference"]["20"] == pytest.approx(0.1)
    assert np.isnan(only["standard_error"]["20"])  # one seed has no spread
    assert "(+0.100)" in format_variant_comparison([only], "v")
    assert paired_by_family(base, runs({"gemm-A": []}), 20) == []
    assert family("convolution_milo-A100.json.gz") == "convolution_milo"


def test_the_command_runs_both_and_prints_the_comparison(tmp_path: Path, capsys) -> None:
    a = write_cache(tmp_path / "toy-A.json.gz", 4)
    b = write_cache(tmp_path / "toy-B.json.gz", 2)
    traces, out = tmp_path / "runs.jsonl", tmp_path / "out.json"
    argv = ["--cache", str(a), "--cache", str(b), "--seeds", "2", "--budget", "20", "--traces", str(traces),
            "--variant", "initial=3", "--json", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "bayes with initial=3 vs bayes" in text and "| toy | 2 | 2 |" in text
    doc = json.loads(out.read_text())
    assert doc["variant"]["options"] == {"initial": 3}
    (toy,) = doc["variant"]["comparison"]
    assert toy["family"] == "toy" and set(toy["difference"]) == {"20"}
    assert len(doc["results"]) == len(doc["variant"]["results"]) == 2
    # Both settings' runs went to the traces, and are read back, not run again.
    assert len(traces.read_text().splitlines()) == 8
    assert main([*argv, "--summarise-only"]) == 0
    assert capsys.readouterr().out == text
    with pytest.raises(SystemExit, match="did you mean 'initial'"):
        main([*argv, "--variant", "inital=2"])
    with pytest.raises(SystemExit, match='--option transform: no longer an option: it is now fixed at "log"'):
        main([*argv, "--variant", 'transform="copula"'])
    with pytest.raises(SystemExit):
        main([*argv, "--batch", "4"])


def test_a_variant_of_a_tuning_knob_reaches_the_study_through_the_development_hook(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--variant rank_every=0`: a knob a TuningRun cannot set; the benchmark hands it to
    `Study` as ``tuning``, beside the options (``--option``) it hands as ``options``."""
    import fleettune.optimize as optimize

    seen: list[tuple[dict, dict]] = []

    class Spy(optimize.Study):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            seen.append((dict(kwargs.get("options") or {}), dict(kwargs.get("tuning") or {})))

    monkeypatch.setattr(optimize, "Study", Spy)
    out = tmp_path / "out.json"
    argv = ["--cache", str(write_cache(tmp_path / "toy-A.json.gz", 4)), "--seeds", "1", "--budget", "12",
            "--option", "initial=3", "--variant", "rank_every=0", "--json", str(out)]
    assert main(argv) == 0
    assert seen == [({"initial": 3}, {}), ({"initial": 3}, {"rank_every": 0})]
    assert seen[1] != seen[0] and json.loads(out.read_text())["variant"]["options"] == {"initial": 3, "rank_every": 0}


@pytest.mark.parametrize("peer", ["optuna-tpe", "kernel-tuner-genetic-algorithm", "kernel-tuner-bayes-opt"])
def test_a_peer_measures_each_configuration_of_the_space_once(tmp_path: Path, peer: str) -> None:
    from fleettune_dev.bench.peers import PEERS
    from fleettune_dev.bench.replay import load_replay, restrict

    run = PEERS[peer]
    # A subspace: a peer's proposals outside it cost it nothing, and Kernel Tuner's own
    # search space is restricted to it.
    replay = restrict(load_replay(write_cache(tmp_path / "toy-A.json.gz", 4)), ["tile>=2"])
    n, failures = len(replay.rows), int(np.isnan(replay.time_ms).sum())
    every = run(replay, 0, n + 5)
    assert len(every.best) == n and every.invalid == failures and every.best[-1] == replay.optimum
    assert (np.diff(every.best[np.isfinite(every.best)]) <= 0).all()
    first = run(replay, 1, 12)
    assert np.array_equal(first.best, run(replay, 1, 12).best)
    assert any(not np.array_equal(first.best, run(replay, s, 12).best) for s in (2, 3, 4, 5, 6))


def test_the_command_compares_the_strategy_with_a_peer_on_the_same_seeds(tmp_path: Path, capsys) -> None:
    a = write_cache(tmp_path / "toy-A.json.gz", 4)
    out = tmp_path / "out.json"
    assert main(["--cache", str(a), "--seeds", "2", "--budget", "20", "--strategy", "random",
                 "--peer", "optuna-tpe", "--json", str(out)]) == 0
    assert "optuna-tpe → random" in capsys.readouterr().out
    (toy,) = json.loads(out.read_text())["peers"]["optuna-tpe"]["comparison"]
    assert toy["family"] == "toy" and toy["seeds"] == 2
    with pytest.raises(SystemExit):
        main(["--cache", str(a), "--peer", "optuna-tpe", "--variant", "initial=3"])


def test_a_scrambled_space_keeps_every_measurement_under_relabelled_values(tmp_path: Path) -> None:
    from fleettune_dev.bench.replay import load_replay, random_expectation, scramble

    replay = load_replay(write_cache(tmp_path / "toy-A.json.gz", 4))
    mixed = scramble(replay)
    assert mixed.name == "toy~scrambled-A.json.gz" and family(mixed.name) == "toy~scrambled"
    # Each parameter's values are a permutation of its own (on this full product of values,
    # the same set of rows), every row keeping its time and failure under its new label...
    assert sorted(map(tuple, mixed.rows)) == sorted(map(tuple, replay.rows))
    for column in range(replay.rows.shape[1]):
        relabel = dict(zip(replay.rows[:, column], mixed.rows[:, column], strict=True))
        assert all(relabel[a] == b for a, b in zip(replay.rows[:, column], mixed.rows[:, column], strict=True))
        assert len(set(relabel.values())) == len(relabel)
    assert np.array_equal(mixed.time_ms, replay.time_ms, equal_nan=True) and mixed.failure == replay.failure
    # ...which is what random sampling cannot tell apart, while some neighbour moved.
    assert np.allclose(random_expectation(mixed, 10), random_expectation(replay, 10))
    assert not np.array_equal(mixed.rows, replay.rows)
    assert np.array_equal(scramble(replay).rows, mixed.rows)
