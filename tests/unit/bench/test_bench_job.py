"""`fleettune bench job` without a GPU: the draw, the figures and their verdict, the
refusals; the tools themselves are stood in for (the GPU tier and docs/benchmarks.md ran
them on an H200)."""

from __future__ import annotations

import gzip
import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from fleettune_dev.bench import job
from fleettune_dev.bench.job import BOUND_FACTOR, Measured, draw_configs, main, summarise

SIZES = {"block_size_x": [16, 32, 64], "block_size_y": [1, 2], "tile_size_x": [1, 2]}


def write_recording(path: Path) -> Path:
    cache = {}
    for i, (bx, by, tx) in enumerate(itertools.product(*SIZES.values())):
        c = {"block_size_x": bx, "block_size_y": by, "tile_size_x": tx}
        cache[f"{bx},{by},{tx}"] = {**c, "time": 1.0 + i, "times": [1.0 + i] * 3, "compile_time": 900.0,
                                    "verification_time": 0, "benchmark_time": 100.0, "framework_time": 5.0}
    doc = {"device_name": "synthetic", "kernel_name": "convolution_kernel", "problem_size": [256, 128],
           "tune_params_keys": list(SIZES), "tune_params": SIZES, "cache": cache}
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return path


def test_the_draw_is_distinct_and_repeatable() -> None:
    records = [type("R", (), {"config": {"x": i}})() for i in range(30)]
    a, b, c = draw_configs(records, 10, 0), draw_configs(records, 10, 0), draw_configs(records, 10, 1)
    assert a == b and a != c and len({r["x"] for r in a}) == 10
    assert len(draw_configs(records, 99, 0)) == 30


def _measured(n: int, ok: list[bool], time_ms: list[float], gpu_s: float, compile_s: float) -> list[Measured]:
    return [Measured({"i": i}, ok=ok[i], time_ms=time_ms[i] if ok[i] else None, compile_s=compile_s,
                     gpu_s=gpu_s, detail="" if ok[i] else "compile_error: x") for i in range(n)]


def test_the_bound_uses_kernel_tuners_gpu_work_and_the_start_up_spread() -> None:
    n = 4
    batch = _measured(n, [True, True, True, False], [1.0, 2.0, 3.0, 0.0], gpu_s=0.05, compile_s=0.1)
    kt = _measured(n, [True, True, False, False], [1.1, 2.2, 0.0, 0.0], gpu_s=0.2, compile_s=0.15)
    s = summarise(batch, batch_wall=1.0, startup_s=0.8, kt=kt, kt_wall=3.0, recorded={0: 5.0, 1: 6.0, 2: 4.0})
    assert s["batch_gpu_s_per_eval"] == pytest.approx(0.25) and s["kt_gpu_s_per_eval"] == pytest.approx(0.2)
    assert s["batch_first_run_s"] == s["batch_rest_run_s_median"] == pytest.approx(0.05)
    assert s["bound_s_per_eval"] == pytest.approx(BOUND_FACTOR * 0.2 + 0.8 / n) and s["bound_met"]
    assert s["wall_ratio_batch_to_kt"] == pytest.approx(1 / 3)
    assert s["median_time_ratio_batch_to_kt"] == pytest.approx(1 / 1.1)
    assert [d["config"] for d in s["outcome_disagreements"]] == [{"i": 2}]
    assert s["spearman_batch_vs_recording"] == pytest.approx(-0.5)
    slow = summarise(batch, batch_wall=2.0, startup_s=0.8, kt=kt, kt_wall=3.0)
    assert not slow["bound_met"] and "spearman_batch_vs_recording" not in slow
    alone = summarise(batch, batch_wall=1.0, startup_s=0.8, kt=None, kt_wall=None)
    assert "bound_met" not in alone and alone["batch_ok"] == 3


def test_no_gpu_and_no_built_in_are_refused_with_the_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    other = write_recording(tmp_path / "gemm-synthetic.json.gz")
    assert main(["--space", str(other)]) == 2
    assert "no built-in kernel has the parameters of 'gemm'" in capsys.readouterr().err
    space = write_recording(tmp_path / "convolution_milo-synthetic.json.gz")
    monkeypatch.setattr(job, "gpu_missing_reason", lambda: "cupy is not importable (test)")
    assert main(["--space", str(space)]) == 2
    assert "needs an NVIDIA GPU: cupy is not importable (test)" in capsys.readouterr().err


def test_a_run_prints_and_writes_every_figure(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    space = write_recording(tmp_path / "convolution_milo-synthetic.json.gz")
    seen: dict[str, Any] = {}

    def batch(builtin: str, configs: list[dict[str, Any]], problem_size: list[int], *rest: Any) -> Any:
        seen.update(builtin=builtin, configs=configs, problem_size=problem_size)
        return [Measured(c, ok=True, time_ms=1.0 + i, gpu_s=0.01) for i, c in enumerate(configs)], 0.5

    def kernel_tuner(builtin: str, configs: list[dict[str, Any]], *rest: Any) -> Any:
        assert configs == seen["configs"]  # the very same configurations
        return [Measured(c, ok=True, time_ms=1.1 + i, gpu_s=0.1) for i, c in enumerate(configs)], 2.0

    monkeypatch.setattr(job, "gpu_missing_reason", lambda: None)
    monkeypatch.setattr(job, "device_name", lambda: "Test GPU")
    monkeypatch.setattr(job, "measure_startup", lambda n: [0.5] * n)
    monkeypatch.setattr(job, "run_fleettune_batch", batch)
    monkeypatch.setattr(job, "run_fleettune_single", lambda b, configs, *rest: ([], [1.5] * len(configs)))
    monkeypatch.setattr(job, "run_kernel_tuner", kernel_tuner)
    out = tmp_path / "out.json"
    assert main(["--space", str(space), "--configs", "6", "--single", "2", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert seen["builtin"] == "convolution" and seen["problem_size"] == [256, 128] and len(seen["configs"]) == 6
    assert "batch: 0.50 s wall" in text and "Kernel Tuner: 2.00 s wall" in text and ": met" in text
    assert "single (one worker per configuration): median 1.50 s" in text
    assert "first configuration's run_s 0.010 s, the others' median 0.010 s" in text
    doc = json.loads(out.read_text())
    assert doc["device"] == "Test GPU" and len(doc["batch"]) == len(doc["kernel_tuner"]) == 6
    assert doc["summary"]["spearman_batch_vs_kt"] == pytest.approx(1.0)
    assert doc["summary"]["spearman_batch_vs_recording"] == pytest.approx(
        job.spearman([m["time_ms"] for m in doc["batch"]],
                     [1.0 + list(itertools.product(*SIZES.values())).index(tuple(m["config"].values()))
                      for m in doc["batch"]]))
