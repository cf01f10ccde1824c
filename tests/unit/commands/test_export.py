"""`fleettune export`: a run's records as a Kernel Tuner cache or T4 results, checked by Kernel
Tuner itself (it loads the cache and replays it in its simulation mode; T4 against the results
schema it ships)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from fleettune.api import TuningRunSpec
from fleettune.commands.export import ExportError, choose_pool, export_records, main, write
from fleettune.results import TrialRecord
from fleettune.space import SearchSpace
from fleettune.space.kernel_tuner import read_kernel_tuner_cache
from fleettune.space.t4 import read_t4
from fleettune_job.protocol import Fingerprint, Outcome

kernel_tuner = pytest.importorskip("kernel_tuner", reason="Kernel Tuner is in the dev extra")

PARAMETERS = [
    {"name": "block_size_x", "type": "ordinal", "values": [16, 32, 64, 128]},
    {"name": "tile", "type": "integer", "range": {"min": 1, "max": 4}},
    {"name": "use_shared", "type": "boolean"},
    {"name": "order", "type": "categorical", "values": ["row", "col"]},
]
CONSTRAINTS = ["block_size_x * tile <= 256"]
SPEC = {
    "kernel": {"builtin": "gemm", "problemSize": [512, 256]},
    "parameters": PARAMETERS,
    "constraints": CONSTRAINTS,
    "targets": [{"name": "a100"}, {"name": "orin"}],
}
# What a Kernel Tuner user writes for the same space (tune_params in the spec's order).
TUNE_PARAMS = {"block_size_x": [16, 32, 64, 128], "tile": [1, 2, 3, 4], "use_shared": [False, True],
               "order": ["row", "col"]}
A100 = Fingerprint(product="NVIDIA A100-SXM4-40GB", driver_version="550.54")
# Every 7th configuration fails, in turn as each invalid outcome.
INVALID = [Outcome.COMPILE_ERROR, Outcome.LAUNCH_ERROR, Outcome.RUNTIME_ERROR, Outcome.CORRECTNESS_ERROR,
           Outcome.TIMEOUT]


def spec() -> TuningRunSpec:
    return TuningRunSpec.model_validate(SPEC)


def valid_configs() -> list[dict]:
    space = SearchSpace.from_spec(PARAMETERS, CONSTRAINTS)
    return space.to_configs(space.enumerate())


def record(target: str, index: int, config: dict, outcome: Outcome, ms: float | None = None, round_: int = 1,
           fp: Fingerprint | None = A100) -> TrialRecord:
    key = ",".join(f"{k}={v}" for k, v in config.items())
    return TrialRecord(target=target, index=index, config=config, key=key, outcome=outcome, objective=ms,
                       times=[ms] * 3 if ms else [], fingerprint=fp, round=round_,
                       recorded_at=f"2025-01-01T00:{index // 60:02d}:{index % 60:02d}Z")


def round_records(target: str, round_: int, scale: float) -> tuple[list[TrialRecord], dict[str, float | Outcome]]:
    """Every valid configuration measured once, and what each should read back as (by KT key)."""
    records, expected = [], {}
    for i, config in enumerate(valid_configs()):
        ktkey = ",".join(str(config[k]) for k in TUNE_PARAMS)
        if i % 7 == 3:
            outcome = INVALID[(i // 7) % len(INVALID)]
            records.append(record(target, i, config, outcome, round_=round_))
            expected[ktkey] = outcome
        else:
            ms = round(scale * (1.0 + ((i * 37) % 101) / 50), 6)
            records.append(record(target, i, config, Outcome.OK, ms, round_=round_))
            expected[ktkey] = ms
    return records, expected


@pytest.fixture
def history() -> tuple[list[TrialRecord], dict[str, float | Outcome]]:
    """Round 1 (an older driver), then round 2 of pool a100 with an infrastructure failure and a
    configuration measured twice; pool orin has results of its own."""
    old, _ = round_records("a100", 1, scale=3.0)
    new, expected = round_records("a100", 2, scale=1.0)
    n = len(new)
    again = new[0].config
    new.append(record("a100", n, again, Outcome.INFRA_ERROR, round_=2))
    new.append(record("a100", n + 1, again, Outcome.OK, 0.25, round_=2))  # measured again: this one counts
    expected[",".join(str(again[k]) for k in TUNE_PARAMS)] = 0.25
    orin, _ = round_records("orin", 1, scale=9.0)
    return old + new + orin, expected


def replay(cache: Path, strategy: str, **options) -> list[dict]:
    """Kernel Tuner's own reading of the cache: `tune_kernel` in simulation mode (no GPU)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. its notes on the simulated device
        results, env = kernel_tuner.tune_kernel(
            "gemm", "__global__ void gemm(float *c) {}", (512, 256), [np.zeros(1, np.float32)], TUNE_PARAMS,
            restrictions=CONSTRAINTS, simulation_mode=True, cache=str(cache), strategy=strategy,
            strategy_options=options or None, quiet=True,
        )
    assert env["device_name"] == A100.product
    return results


def check_against(results: list[dict], expected: dict[str, float | Outcome]) -> None:
    from kernel_tuner.util import CompilationFailedConfig, RuntimeFailedConfig

    assert results
    for res in results:
        want = expected[",".join(str(res[k]) for k in TUNE_PARAMS)]
        if isinstance(want, Outcome):
            error = CompilationFailedConfig if want == Outcome.COMPILE_ERROR else RuntimeFailedConfig
            assert isinstance(res["__error__"], error), (res, want)
        else:
            assert "__error__" not in res and res["time"] == pytest.approx(want), (res, want)
            assert res["times"] == pytest.approx([want] * 3)


def test_kernel_tuner_replays_the_exported_cache_with_brute_force(history, tmp_path):
    records, expected = history
    export = export_records(spec(), records, choose_pool(spec()), "kernel-tuner")
    cache = tmp_path / "a100.json"
    write(export, "kernel-tuner", cache)
    results = replay(cache, "brute_force")
    # Every configuration of the space that passes the restrictions, each read from the cache.
    assert len(results) == len(valid_configs()) == len(expected)
    check_against(results, expected)
    ok = [r for r in results if "__error__" not in r]
    best = min(ok, key=lambda r: r["time"])
    assert best["time"] == min(v for v in expected.values() if not isinstance(v, Outcome)) == 0.25
    assert (export.round, export.infra_failures, export.repeated, export.outside_space) == (2, 1, 1, 0)


def test_kernel_tuner_replays_the_exported_cache_with_a_sampling_strategy(history, tmp_path):
    records, expected = history
    cache = tmp_path / "a100.json"
    write(export_records(spec(), records, choose_pool(spec()), "kernel-tuner"), "kernel-tuner", cache)
    results = replay(cache, "random_sample", max_fevals=20)
    assert 0 < len({tuple(r[k] for k in TUNE_PARAMS) for r in results}) <= 20
    check_against(results, expected)


def test_kernel_tuner_refuses_a_cache_of_other_parameters(history, tmp_path):
    """The replay is a real check: Kernel Tuner compares the cache's parameters with its own."""
    records, _ = history
    cache = tmp_path / "a100.json"
    write(export_records(spec(), records, choose_pool(spec()), "kernel-tuner"), "kernel-tuner", cache)
    data = json.loads(cache.read_text())
    data["tune_params_keys"] = list(reversed(data["tune_params_keys"]))
    cache.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="order is wrong"):
        replay(cache, "brute_force")


def test_an_older_round_is_exported_on_request(history, tmp_path):
    records, _ = history
    export = export_records(spec(), records, choose_pool(spec()), "kernel-tuner", round_=1)
    assert export.round == 1 and export.infra_failures == 0
    times = [r.time_ms for r in export.recorded.records if r.time_ms is not None]
    assert min(times) >= 3.0  # round 1's times (scale 3)
    with pytest.raises(ExportError, match=r"no results of round 5 \(rounds: 1, 2\)"):
        export_records(spec(), records, choose_pool(spec()), "kernel-tuner", round_=5)


def test_fleettunes_own_cache_reader_reads_the_export_back(history, tmp_path):
    """What `fleettune predict --cache` reads."""
    records, expected = history
    export = export_records(spec(), records, choose_pool(spec(), "a100"), "kernel-tuner")
    cache = tmp_path / "a100.json.gz"
    write(export, "kernel-tuner", cache)
    back = read_kernel_tuner_cache(cache)
    assert (back.device_name, back.kernel_name, back.problem_size) == (A100.product, "gemm", [512, 256])
    assert [p.name for p in back.space.parameters] == list(TUNE_PARAMS)
    assert len(back.records) == len(expected)
    assert back.best() is not None and back.best().time_ms == 0.25


def test_t4_export_follows_the_schema_kernel_tuner_ships(history, tmp_path):
    import jsonschema
    from kernel_tuner.file_utils import output_file_schema

    records, expected = history
    export = export_records(spec(), records, choose_pool(spec()), "t4", metadata={"fleettune": {"round": 2}})
    path = tmp_path / "a100-t4.json"
    write(export, "t4", path)
    doc = json.loads(path.read_text())
    version, schema = output_file_schema("results")
    jsonschema.validate(doc, schema)
    assert doc["schema_version"] == version
    assert doc["metadata"]["device_name"] == A100.product and doc["metadata"]["fleettune"] == {"round": 2}
    by_key = {",".join(str(r["configuration"][k]) for k in TUNE_PARAMS): r for r in doc["results"]}
    assert len(by_key) == len(doc["results"]) == len(expected)
    invalidity = {Outcome.COMPILE_ERROR: "compile", Outcome.LAUNCH_ERROR: "runtime", Outcome.RUNTIME_ERROR: "runtime",
                  Outcome.CORRECTNESS_ERROR: "correctness", Outcome.TIMEOUT: "timeout"}
    for key, want in expected.items():
        res = by_key[key]
        if isinstance(want, Outcome):
            assert (res["invalidity"], res["correctness"]) == (invalidity[want], 0)
        else:
            assert res["invalidity"] == "correct"
            assert res["measurements"] == [{"name": "time", "value": want, "unit": "milliseconds"}]
            assert res["times"]["runtimes"] == [want] * 3
        assert res["timestamp"].startswith("2025-01-01T")
    back = read_t4(path)
    assert back.best() is not None and back.best().time_ms == 0.25


def test_pools_of_a_run_of_several_sizes(tmp_path):
    doc = {**SPEC, "kernel": {"builtin": "gemm", "problemSizes": [[512, 256], [1024, 256]]}}
    several = TuningRunSpec.model_validate(doc)
    pool = choose_pool(several, "orin", (1024, 256))
    assert (pool.key, pool.size) == ("orin.1024x256", (1024, 256))
    assert choose_pool(several).key == "a100.512x256"
    with pytest.raises(ExportError, match=r"no target 'h100' \(targets: a100, orin; sizes: 512x256, 1024x256\)"):
        choose_pool(several, "h100")
    records = [record("orin.1024x256", i, c, Outcome.OK, 1.0 + i) for i, c in enumerate(valid_configs()[:5])]
    export = export_records(several, records, pool, "kernel-tuner")
    assert export.recorded.problem_size == [1024, 256] and len(export.recorded.records) == 5


def test_configurations_outside_the_runs_parameters_are_left_out():
    records = [record("a100", 0, {**valid_configs()[0], "tile": 9}, Outcome.OK, 1.0),
               record("a100", 1, valid_configs()[1], Outcome.OK, 2.0)]
    export = export_records(spec(), records, choose_pool(spec()), "t4")
    assert export.outside_space == 1 and [r.time_ms for r in export.recorded.records] == [2.0]


# ---------------------------------------------------------------------- the command


@pytest.fixture
def stored(monkeypatch, history):
    from fleettune import store

    records, _ = history
    run = {"metadata": {"name": "mm", "namespace": "ns", "uid": "u-1"}, "spec": SPEC,
           "status": {"targets": [{"name": "a100", "device": "NVIDIA A100-SXM4-40GB"}]}}
    monkeypatch.setattr(store, "read_run", lambda name, namespace=None, kubeconfig=None, context=None:
                        (run, records, namespace or "default"))
    return run


def test_the_command_writes_a_cache_kernel_tuner_replays(stored, history, tmp_path, capsys):
    _, expected = history
    out = tmp_path / "mm.json"
    assert main(["mm", "-n", "ns", "--format", "kernel-tuner", "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"{len(expected)} results of ns/mm pool a100 (round 2, NVIDIA A100-SXM4-40GB) to {out}" in err
    assert "left out 1 infrastructure failures, 1 earlier measurements" in err
    assert "other pools with results: orin" in err
    check_against(replay(out, "brute_force"), expected)


def test_the_command_prints_t4_to_standard_output(stored, capsys):
    assert main(["mm", "--format", "t4", "--target", "orin"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["metadata"]["fleettune"]["pool"] == "orin"
    assert doc["metadata"]["fleettune"]["tuning_run"] == "ns/mm"
    assert min(r["measurements"][0]["value"] for r in doc["results"] if r["invalidity"] == "correct") >= 9.0


def test_the_command_says_what_is_wrong_in_one_line(stored, capsys):
    assert main(["mm", "--format", "t4", "--target", "h100"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("fleettune export: the run has no target 'h100'")


@pytest.mark.parametrize("fmt", ["kernel-tuner", "t4"])
@pytest.mark.parametrize("output", [True, False])
def test_a_pool_without_results_is_an_error_and_writes_nothing(monkeypatch, tmp_path, capsys, fmt, output):
    """An empty cache or results file reads as a space never measured; the user asked for
    results, so say there are none (and where there are some) and leave no file behind."""
    from fleettune import store

    orin = [record("orin", i, c, Outcome.OK, 1.0 + i) for i, c in enumerate(valid_configs()[:3])]
    a100 = [record("a100", 9, valid_configs()[0], Outcome.INFRA_ERROR)]
    run = {"metadata": {"name": "mm", "namespace": "ns", "uid": "u-1"}, "spec": SPEC}
    monkeypatch.setattr(store, "read_run", lambda name, namespace=None, kubeconfig=None, context=None:
                        (run, orin + a100, "ns"))
    out = tmp_path / "mm.json"
    assert main(["mm", "--format", fmt, *(["-o", str(out)] if output else [])]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and not out.exists()
    assert captured.err == ("fleettune export: pool a100 has no results to export in round 1 (left out 1 "
                            "infrastructure failures); pools with results: orin (--target, --size); "
                            "nothing written\n")
    monkeypatch.setattr(store, "read_run", lambda *a, **k: (run, [], "ns"))
    assert main(["mm", "--format", fmt, "--target", "orin"]) == 1
    assert capsys.readouterr().err == "fleettune export: pool orin has no results to export yet; nothing written\n"
