"""The warm-start benchmark's replay, counting and summary (tiny recordings, fast strategies)."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import numpy as np
import pytest

from fleettune_dev.bench.strategy import family, load_replay, parse_options, run_once
from fleettune_dev.bench.warmstart import main, ordered_pairs
from fleettune_dev.bench.warmstart_run import drive, evals_to, run_seed, study_for
from fleettune_dev.bench.warmstart_summary import (
    format_ordered_summary,
    format_reach,
    ordered_summary,
    seed_spread,
    summarise,
)

VALUES = {"bx": [16, 32, 64, 128, 256], "tile": [1, 2, 4, 8], "vec": [1, 2]}


def landscape(c: dict, best_tile: int) -> float | str:
    if c["bx"] * c["tile"] > 1024:
        return "CompilationFailedConfig"
    return 1.0 + abs(math.log2(c["bx"]) - 6) * 0.3 + abs(math.log2(c["tile"]) - math.log2(best_tile)) * 0.5 + (
        0.1 if c["vec"] == 1 else 0.0)


def write_cache(path: Path, best_tile: int) -> Path:
    cache = {}
    for bx in VALUES["bx"]:
        for tile in VALUES["tile"]:
            for vec in VALUES["vec"]:
                c = {"bx": bx, "tile": tile, "vec": vec}
                t = landscape(c, best_tile)
                cache[f"{bx},{tile},{vec}"] = {**c, "time": t, "times": [t] * 3 if isinstance(t, float) else []}
    doc = {"device_name": "synthetic", "kernel_name": "k", "problem_size": [1024], "tune_params_keys": list(VALUES),
           "tune_params": VALUES, "cache": cache}
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return path


@pytest.fixture
def caches(tmp_path: Path) -> tuple[Path, Path]:
    return write_cache(tmp_path / "src.json.gz", 4), write_cache(tmp_path / "tgt.json.gz", 2)


def test_evals_to() -> None:
    best = np.array([np.inf, 2.0, 1.04, 1.0])
    assert evals_to(best, 1.0, 0.95) == 3
    assert evals_to(best, 1.0, 0.99) == 4
    assert evals_to(best[:3], 1.0, 0.99) == 4  # never: budget + 1
    assert evals_to(np.full(3, np.inf), 1.0, 0.5) == 4


def test_drive_follows_the_strategy_benchmarks_protocol(caches) -> None:
    src, _ = caches
    replay = load_replay(src)
    for seed in (0, 1):
        ours = drive(replay, study_for(replay, "random", seed, None, None), 25)
        theirs = run_once(replay, "random", seed, 25)
        np.testing.assert_array_equal(ours.best, theirs.best)
        assert sum(o[1].value != "ok" for o in ours.observations) == theirs.invalid


def test_drive_stops_at_a_level_and_keeps_the_trace_full(caches) -> None:
    _, tgt = caches
    replay = load_replay(tgt)
    run = drive(replay, study_for(replay, "random", 0, None, None), 30, stop_at=0.99)
    assert len(run.best) == 30
    first = evals_to(run.best, replay.optimum, 0.99)
    assert len(run.observations) == first
    assert (run.best[first - 1 :] == replay.optimum).all()


def test_warm_start_from_an_identical_recording_finds_the_optimum_first(caches) -> None:
    src, _ = caches
    replay = load_replay(src)
    row = run_seed(replay, replay, "bayes", 0, source_budget=len(replay.rows), budget=20)
    assert row["source_best_on_target"] == 1.0 and row["source_reach"] == 1.0
    assert row["warm_0.99"] == 1  # the source's best is re-measured first
    assert row["warm_0.95"] <= row["cold_0.95"]


def test_summary_counts_censored_runs() -> None:
    rows = [{"seed": 0, "source_best_on_target": 1.0, "warm_0.95": 1, "warm_0.99": 2, "cold_0.95": 9,
             "cold_0.99": 21, "warm_at_5": 1.0, "cold_at_5": 0.5},
            {"seed": 1, "source_best_on_target": 0.5, "warm_0.95": 3, "warm_0.99": 21, "cold_0.95": 6,
             "cold_0.99": 21, "warm_at_5": 0.9, "cold_at_5": 0.7}]
    res = summarise("a → b", rows, budget=20)
    assert res["warm_0.95"] == 2.0 and res["cold_0.95"] == 7.5
    assert res["ratio_0.95"] == pytest.approx(2 / 7.5)
    assert res["meets_target"]
    assert res["cold_0.99_censored"] == 2 and res["warm_0.99_censored"] == 1
    assert res["warm_at_5"] == pytest.approx(0.95)
    assert res["source_best_on_target"] == 0.75


def test_summary_splits_seeds_by_what_the_source_measured() -> None:
    """Seeds whose source data hold a configuration within 0.95 of the target's optimum
    are summarised apart from those whose source data do not."""
    def row(seed: int, reach: float, warm: int, cold: int) -> dict:
        return {"seed": seed, "source_best_on_target": 0.5, "source_reach": reach, "warm_0.95": warm,
                "warm_0.99": 21, "cold_0.95": cold, "cold_0.99": 21}

    rows = [row(0, 0.97, 2, 10), row(1, 0.95, 4, 12), row(2, 0.8, 21, 6)]
    res = summarise("a → b", rows, budget=20)
    info = res["informed"]
    assert info["with"] == {"seeds": 2, "warm": 3.0, "cold": 11.0, "ratio": pytest.approx(6 / 22)}
    assert info["without"] == {"seeds": 1, "warm": 21.0, "cold": 6.0, "ratio": pytest.approx(3.5)}
    assert info["cold_parity_ratio"] == pytest.approx((2 + 4 + 6) / 28)
    assert res["ratio_0.95"] == pytest.approx(27 / 28)
    line = format_reach(res)
    assert line is not None and "in 2/3 seeds" in line and "ratio 0.27" in line and "would give 0.43" in line
    # Rows from traces written before the field existed: no split, no line.
    old = [{k: v for k, v in r.items() if k != "source_reach"} for r in rows]
    assert "informed" not in summarise("a → b", old, budget=20)
    assert format_reach(summarise("a → b", old, budget=20)) is None


def test_command(caches, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, tgt = caches
    out = tmp_path / "ws.json"
    assert main(["--source", str(src), "--target", str(tgt), "--seeds", "2", "--budget", "15",
                 "--source-budget", "15", "--strategy", "random", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "src → tgt" in text and "warm →0.95" in text
    assert "src → tgt: the source measured a configuration ≥0.95 of the target's optimum in" in text
    doc = json.loads(out.read_text())
    (res,) = doc["results"]
    assert res["seeds"] == 2 and len(doc["per_seed"]["src → tgt"]) == 2
    with pytest.raises(SystemExit):
        main(["--source", str(src)])


def test_options_are_checked_against_the_strategy(caches) -> None:
    """A misspelt option would be ignored by the study and the benchmark would compare
    two identical runs: it is refused, naming the options there are."""
    src, tgt = caches
    refusal = (r"prior_path: neither an option nor a tuning knob of strategy 'bayes' \(did you mean 'prior_paths'\?\) "
               r"\(options: ")
    with pytest.raises(SystemExit, match=refusal):
        main(["--source", str(src), "--target", str(tgt), "--option", "prior_path=2"])
    with pytest.raises(SystemExit, match="--strategy: 'nope' is not a strategy"):
        main(["--source", str(src), "--target", str(tgt), "--strategy", "nope"])
    # Options and tuning knobs (the development hook) alike; a deleted alternative is refused.
    assert parse_options(["prior_paths=2", "initial=4"], "bayes") == {"prior_paths": 2, "initial": 4}
    with pytest.raises(SystemExit, match='--option transform: no longer an option: it is now fixed at "log"'):
        parse_options(['transform="copula"'], "bayes")


def test_command_resumes_from_traces(caches, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, tgt = caches
    traces = tmp_path / "ws.jsonl"
    args = ["--source", str(src), "--target", str(tgt), "--budget", "15", "--source-budget", "15",
            "--strategy", "random", "--traces", str(traces)]
    assert main([*args, "--seeds", "2"]) == 0
    assert len(traces.read_text().splitlines()) == 2
    first = capsys.readouterr().out
    # A second run with one more seed only runs that seed, and summarises all three.
    assert main([*args, "--seeds", "3", "--json", str(tmp_path / "ws.json")]) == 0
    assert len(traces.read_text().splitlines()) == 3
    doc = json.loads((tmp_path / "ws.json").read_text())
    rows = doc["per_seed"]["src → tgt"]
    assert [r["seed"] for r in rows] == [0, 1, 2]
    assert "src → tgt" in first


def test_ordered_pairs_are_every_pair_of_one_kernel(tmp_path: Path) -> None:
    """Recordings pair by kernel family (the name before the first '-'), in both
    directions; a file that is no Kernel Tuner cache is left out with a note."""
    for name, tile in (("k-A", 4), ("k-B", 2), ("k-C", 1), ("other-A", 4)):
        write_cache(tmp_path / f"{name}.json.gz", tile)
    (tmp_path / "k-B_T4.json.gz").write_bytes(gzip.compress(json.dumps({"schema_version": "1.0.0"}).encode()))
    pairs, skipped = ordered_pairs(tmp_path)
    names = [(s.name.split(".")[0], t.name.split(".")[0]) for s, t in pairs]
    assert names == [("k-A", "k-B"), ("k-A", "k-C"), ("k-B", "k-A"), ("k-B", "k-C"), ("k-C", "k-A"), ("k-C", "k-B")]
    assert len(skipped) == 1 and skipped[0].startswith("k-B_T4.json.gz: ")
    assert family("convolution_milo-A100") == "convolution_milo"


def test_ordered_summary_names_the_worst_pair_and_each_family() -> None:
    def res(pair: str, warm: float, cold: float) -> dict:
        return {"pair": pair, "seeds": 3, **{f"{k}_{lvl}": v for lvl in (0.95, 0.99)
                                             for k, v in (("warm", warm), ("cold", cold), ("ratio", warm / cold))}}

    results = [res("a-X → a-Y", 2, 10), res("a-Y → a-X", 12, 10), res("b-X → b-Y", 1, 10)]
    s = ordered_summary(results)
    assert s["worst_ratio_0.95"] == pytest.approx(1.2) and s["worst_pair_0.95"] == "a-Y → a-X"
    assert s["mean_ratio_0.95"] == pytest.approx((0.2 + 1.2 + 0.1) / 3)
    assert s["over_0.95"] == ["a-Y → a-X"] and not s["meets_target"]
    assert s["families"]["a"]["pairs"] == 2 and s["families"]["a"]["ratio_0.95"] == pytest.approx(0.7)
    assert s["families"]["a"]["worst_ratio_0.95"] == pytest.approx(1.2)
    text = format_ordered_summary(s)
    assert "worst ratio 1.20 (a-Y → a-X)" in text and "pairs over 1.1: 1 (a-Y → a-X)" in text and "not met" in text
    assert ordered_summary([res("a-X → a-Y", 2, 10)])["meets_target"]


def test_the_spread_over_seeds_says_how_much_the_figures_owe_to_them() -> None:
    """Seed-bootstrap intervals of the mean and the worst ratio: a point where every seed
    gives the same, an interval around the observed figures where they differ, and the
    share of resamples that meet the warm-start target."""
    def rows(pairs: dict[str, list[tuple[int, int]]]) -> dict[str, list[dict]]:
        return {p: [{"seed": s, "warm_0.95": w, "cold_0.95": c} for s, (w, c) in enumerate(v)]
                for p, v in pairs.items()}

    same = seed_spread(rows({"a": [(2, 10)] * 4, "b": [(1, 10)] * 4}), 0.95, resamples=200)
    assert same is not None and same["seeds"] == 4
    assert same["mean_ratio"] == pytest.approx([0.15, 0.15]) and same["worst_ratio"] == pytest.approx([0.2, 0.2])
    assert same["meets_target"] == 1.0
    # One pair is harmed in one seed of four: the worst ratio's interval spans harm and none.
    mixed = seed_spread(rows({"a": [(2, 10), (2, 10), (2, 10), (30, 10)], "b": [(1, 10)] * 4}), 0.95)
    assert mixed is not None
    lo, hi = mixed["worst_ratio"]
    assert lo < 1.1 < hi and lo <= (2 + 2 + 2 + 30) / 40 <= hi
    assert 0.0 < mixed["meets_target"] < 1.0
    assert seed_spread(rows({"a": [(2, 10)], "b": [(1, 10)]}), 0.95) is None  # one seed: nothing to resample
    text = format_ordered_summary(ordered_summary(
        [{"pair": p, "seeds": 4, **{f"{k}_{lvl}": 1.0 for lvl in (0.95, 0.99) for k in ("warm", "cold", "ratio")}}
         for p in ("a-X → a-Y", "a-Y → a-X")],
        rows({"a-X → a-Y": [(2, 10)] * 4, "a-Y → a-X": [(1, 10)] * 4})))
    assert "over the seeds (2,000 resamples of the 4 seeds, 90 % intervals)" in text
    assert "the target met in 100 % of the resamples" in text


def test_command_over_all_ordered_pairs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for name, tile in (("k-A", 4), ("k-B", 2)):
        write_cache(tmp_path / f"{name}.json.gz", tile)
    out = tmp_path / "ws.json"
    assert main(["--all-ordered-pairs", str(tmp_path), "--seeds", "2", "--budget", "12", "--source-budget", "12",
                 "--strategy", "random", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "| k-A → k-B | 2 |" in text and "| k-B → k-A | 2 |" in text
    assert "| k | 2 | 2 |" in text and "warm-start target" in text
    doc = json.loads(out.read_text())
    assert [r["pair"] for r in doc["results"]] == ["k-A → k-B", "k-B → k-A"]
    assert doc["summary"]["pairs"] == 2 and set(doc["summary"]["families"]) == {"k"}
    # The same seeds' rows as one pair run on its own: shared source and cold runs change nothing.
    assert main(["--source", str(tmp_path / "k-B.json.gz"), "--target", str(tmp_path / "k-A.json.gz"), "--seeds", "2",
                 "--budget", "12", "--source-budget", "12", "--strategy", "random", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["per_seed"]["k-B → k-A"] == doc["per_seed"]["k-B → k-A"]
    with pytest.raises(SystemExit):
        main(["--all-ordered-pairs", str(tmp_path), "--all-pairs", str(tmp_path)])


def test_a_variant_is_judged_against_the_baseline_on_the_same_seeds(
        caches, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`--variant`: the source runs as the baseline's, once per seed; the warm and cold
    studies run with the variant's options, except that a variant of warm-only options
    keeps the baseline's cold runs; both settings' rows are traced and resumed."""
    import fleettune_dev.bench.warmstart_run as ws

    src, tgt = caches
    calls: list[tuple[str, dict[str, object]]] = []

    def counting(replay, study, budget, stop_at=None):
        calls.append((replay.name.split(".")[0], {**study.strategy.options.as_dict(),
                                                  **study.strategy.tuning.as_dict()}))
        return drive(replay, study, budget, stop_at)

    monkeypatch.setattr(ws, "drive", counting)
    traces = tmp_path / "ws.jsonl"
    base = ["--source", str(src), "--target", str(tgt), "--seeds", "2", "--budget", "12", "--source-budget", "12",
            "--option", "initial=3", "--traces", str(traces)]
    out = tmp_path / "ws.json"
    assert main([*base, "--variant", "prior_top=1", "--json", str(out)]) == 0
    # Per seed: the baseline's source, warm and cold runs, then the variant's warm run alone.
    assert len(calls) == 8 and sum(c[0] == "src" for c in calls) == 2
    assert [c[1]["prior_top"] for c in calls if c[0] == "tgt"] == [3, 3, 1] * 2
    doc = json.loads(out.read_text())
    v = doc["variant"]
    assert v["options"] == {"initial": 3, "prior_top": 1} and v["reused_cold"] is True
    for b, w in zip(doc["per_seed"]["src → tgt"], v["per_seed"]["src → tgt"], strict=True):
        assert {k: x for k, x in b.items() if k.startswith("cold_")} == {k: x for k, x in w.items()
                                                                           if k.startswith("cold_")}
    (row,) = v["comparison"]["pairs"]
    diffs = [w["warm_0.95"] - b["warm_0.95"] for b, w in zip(doc["per_seed"]["src → tgt"],
                                                               v["per_seed"]["src → tgt"], strict=True)]
    assert row["seeds"] == 2 and row["difference"] == pytest.approx(np.mean(diffs))
    assert row["changed"] == sum(d != 0 for d in diffs)
    text = capsys.readouterr().out
    assert "### bayes with prior_top=1 (the baseline's cold runs" in text
    assert "### bayes with prior_top=1 against the baseline (baseline → variant)" in text
    assert len(traces.read_text().splitlines()) == 4

    # Resumed from the traces: nothing runs, the same comparison is printed.
    calls.clear()
    assert main([*base, "--variant", "prior_top=1"]) == 0
    assert calls == [] and "against the baseline" in capsys.readouterr().out

    # A variant a cold study reads runs its own cold studies. The baseline is traced, so each
    # seed's source runs again, with the baseline's options.
    calls.clear()
    assert main([*base, "--variant", "stall=2"]) == 0
    assert [(name, o["stall"]) for name, o in calls] == [("src", 30), ("tgt", 2), ("tgt", 2)] * 2
    assert "cold runs" not in capsys.readouterr().out.split("### bayes with stall=2")[1].splitlines()[0]

    # A tuning knob, through the development hook a TuningRun has no way to: it reaches the
    # target's studies, and a warm-only one keeps the baseline's cold runs.
    calls.clear()
    assert main([*base, "--variant", "prior_hedge=0"]) == 0
    assert [(name, o["prior_hedge"], o["initial"]) for name, o in calls] == [("src", 2, 3), ("tgt", 0, 3)] * 2
    assert "### bayes with prior_hedge=0 (the baseline's cold runs" in capsys.readouterr().out
