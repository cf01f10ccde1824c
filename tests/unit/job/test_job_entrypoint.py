"""The entrypoint: where the batch comes from, where its verdicts go, and a Pod that cannot
measure (no batch, no GPU, no cupy) ending as a batch that answered nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleettune_job import entrypoint
from fleettune_job.entrypoint import TrialInputError, load_batch, parse_args, termination_log_path
from fleettune_job.protocol import TRIAL_ENV, Batch, BatchResult, Entry, KernelRef, decode_batch

JOB_IMAGE = Path(__file__).resolve().parents[3] / "job_image"
BATCH = Batch(run="conv-a100", target="a100", kernel=KernelRef(builtin="convolution"), problem_size=[4096, 4096],
              entries=[Entry(index=7, config={"block_size_x": 32, "block_size_y": 4})], timeout_s=30)


def env_with_path(*paths: Path) -> dict[str, str]:
    parts = [str(p) for p in paths] + [os.environ.get("PYTHONPATH", "")]
    return {"PYTHONPATH": os.pathsep.join(p for p in parts if p)}


def test_parse_args() -> None:
    args = parse_args(["--trial-file", "/t.json", "--termination-log", "/tmp/log"])
    assert args.trial_file == Path("/t.json") and args.termination_log == Path("/tmp/log")
    assert not args.in_process and args.trial is None
    with pytest.raises(SystemExit):
        parse_args(["--trial", "{}", "--trial-file", "x"])


def test_batch_sources_and_precedence(tmp_path: Path) -> None:
    env = {TRIAL_ENV: BATCH.to_env()}
    assert load_batch(parse_args([]), env) == BATCH
    other = BATCH.model_copy(update={"entries": [Entry(index=8, config={})]})
    assert load_batch(parse_args(["--trial", other.to_env()]), env).entries[0].index == 8
    path = tmp_path / "batch.json"
    path.write_text(other.to_env())
    assert load_batch(parse_args(["--trial-file", str(path)]), env).entries[0].index == 8
    with pytest.raises(TrialInputError, match="no batch given"):
        load_batch(parse_args([]), {})
    with pytest.raises(TrialInputError, match="cannot read"):
        load_batch(parse_args(["--trial-file", str(tmp_path / "missing")]), {})
    with pytest.raises(TrialInputError, match=r"invalid batch in \$FLEETTUNE_TRIAL: entries.0.index"):
        load_batch(parse_args([]), {TRIAL_ENV: json.dumps(json.loads(BATCH.to_env())
                                                          | {"entries": [{"index": -1, "config": {}}]})})


def test_termination_log_path() -> None:
    assert termination_log_path(parse_args([]), {}) == Path("/dev/termination-log")
    assert termination_log_path(parse_args([]), {"FLEETTUNE_TERMINATION_LOG": "/x"}) == Path("/x")
    assert termination_log_path(parse_args(["--termination-log", "/y"]), {"FLEETTUNE_TERMINATION_LOG": "/x"}) \
        == Path("/y")


def test_a_missing_batch_still_writes_one_result_that_answers_nothing(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "termination-log"
    monkeypatch.delenv(TRIAL_ENV, raising=False)
    assert entrypoint.main(["--termination-log", str(log)]) == 20
    result = decode_batch(log.read_text())
    assert not result.answers and not result.done and "no batch given" in result.error
    assert log.read_text() in capsys.readouterr().out


def _run_entrypoint(tmp_path: Path, extra_env: dict[str, str]) -> tuple[int, BatchResult, str]:
    log = tmp_path / "termination-log"
    env = dict(os.environ) | {TRIAL_ENV: BATCH.to_env(), "FLEETTUNE_TERMINATION_LOG": str(log),
                              "FLEETTUNE_COMPILE_WORKERS": "0"} | extra_env
    proc = subprocess.run([sys.executable, "-m", "fleettune_job.entrypoint"], env=env, capture_output=True,
                          text=True, timeout=60)
    return proc.returncode, decode_batch(log.read_text()), proc.stderr


def test_without_a_gpu_the_job_exits_cleanly_having_answered_nothing(tmp_path: Path) -> None:
    # CUDA_VISIBLE_DEVICES="" hides any GPU, so this holds on GPU machines too.
    code, result, stderr = _run_entrypoint(tmp_path, env_with_path(JOB_IMAGE) | {"CUDA_VISIBLE_DEVICES": ""})
    assert code == 20, stderr
    assert not result.answers and result.error.startswith("no GPU"), result.error
    assert "Traceback" not in stderr


def test_without_cupy_the_job_exits_cleanly_having_answered_nothing(tmp_path: Path) -> None:
    stub = tmp_path / "stub"
    stub.mkdir()
    (stub / "cupy.py").write_text("raise ImportError('No module named cupy')\n")
    code, result, stderr = _run_entrypoint(tmp_path, env_with_path(stub, JOB_IMAGE))
    assert code == 20, stderr
    assert not result.answers and result.error.startswith("no GPU: cupy cannot be imported"), result.error


def test_list_kernels_prints_the_registry(capsys: pytest.CaptureFixture[str]) -> None:
    assert entrypoint.main(["--list-kernels"]) == 0
    kernels = json.loads(capsys.readouterr().out)
    assert set(kernels) == {"convolution", "gemm", "scan"}
    assert kernels["gemm"]["parameters"][0]["name"] == "block_size_x"
