"""The entrypoint: trial input, the one result document, exit codes, the watchdog."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fleettune_job import entrypoint, watchdog
from fleettune_job.entrypoint import TrialInputError, load_trial, parse_args, supervise, termination_log_path
from fleettune_job.protocol import TRIAL_ENV, KernelRef, Outcome, Trial, TrialResult, decode

JOB_IMAGE = Path(__file__).resolve().parents[3] / "job_image"
TRIAL = Trial(run="conv-a100", target="a100", index=7, kernel=KernelRef(builtin="convolution"),
              config={"block_size_x": 32, "block_size_y": 4}, problem_size=[4096, 4096], timeout_s=30)

FAKE_WORKER = '''
import argparse, json, os, signal, sys, time
p = argparse.ArgumentParser()
p.add_argument("--result-file")
p.add_argument("--progress-file")
a = p.parse_args()
mode = os.environ["FAKE_MODE"]
trial = json.loads(os.environ["FLEETTUNE_TRIAL"])
with open(a.progress_file, "w") as f:
    json.dump({"phase": os.environ.get("FAKE_PHASE", "run"),
               "fingerprint": {"product": "Fake GPU", "compute_capability": "8.0"}}, f)
if mode == "slow_setup":  # cupy compiling its verification kernels on a cold Pod
    with open(a.progress_file, "w") as f:
        json.dump({"phase": "setup", "fingerprint": {"product": "Fake GPU"}}, f)
    time.sleep(2.0)
    mode = "ok"
if mode == "hang":
    time.sleep(600)
elif mode == "crash":
    sys.exit(3)
elif mode == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
elif mode == "garbage":
    open(a.result_file, "w").write("not json")
elif mode == "ok":
    open(a.result_file, "w").write(json.dumps(
        {"version": 1, "outcome": "ok", "objective": 1.25, "times": [1.25], "error": str(trial["index"])}))
'''


def env_with_path(*paths: Path) -> dict[str, str]:
    parts = [str(p) for p in paths] + [os.environ.get("PYTHONPATH", "")]
    return {"PYTHONPATH": os.pathsep.join(p for p in parts if p)}


@pytest.fixture
def fake_worker(tmp_path: Path) -> Path:
    (tmp_path / "fake_worker.py").write_text(FAKE_WORKER)
    return tmp_path


def test_parse_args() -> None:
    args = parse_args(["--trial-file", "/t.json", "--termination-log", "/tmp/log"])
    assert args.trial_file == Path("/t.json") and args.termination_log == Path("/tmp/log")
    assert not args.in_process and args.trial is None
    with pytest.raises(SystemExit):
        parse_args(["--trial", "{}", "--trial-file", "x"])


def test_trial_sources_and_precedence(tmp_path: Path) -> None:
    env = {TRIAL_ENV: TRIAL.to_env()}
    assert load_trial(parse_args([]), env) == TRIAL
    other = TRIAL.model_copy(update={"index": 8})
    assert load_trial(parse_args(["--trial", other.to_env()]), env).index == 8
    path = tmp_path / "trial.json"
    path.write_text(other.to_env())
    assert load_trial(parse_args(["--trial-file", str(path)]), env).index == 8
    with pytest.raises(TrialInputError, match="no trial given"):
        load_trial(parse_args([]), {})
    with pytest.raises(TrialInputError, match="cannot read"):
        load_trial(parse_args(["--trial-file", str(tmp_path / "missing")]), {})
    with pytest.raises(TrialInputError, match=r"invalid trial in \$FLEETTUNE_TRIAL: index"):
        load_trial(parse_args([]), {TRIAL_ENV: '{"run": "r", "target": "t", "index": -1, "kernel": {}, '
                                               '"config": {}, "problem_size": []}'})
    with pytest.raises(TrialInputError, match="invalid trial in --trial"):
        load_trial(parse_args(["--trial", "{not json"]), {})


def test_termination_log_path() -> None:
    assert termination_log_path(parse_args([]), {}) == Path("/dev/termination-log")
    assert termination_log_path(parse_args([]), {"FLEETTUNE_TERMINATION_LOG": "/x"}) == Path("/x")
    assert termination_log_path(parse_args(["--termination-log", "/y"]), {"FLEETTUNE_TERMINATION_LOG": "/x"}) \
        == Path("/y")


def test_a_missing_trial_still_writes_one_infra_result(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "termination-log"
    monkeypatch.delenv(TRIAL_ENV, raising=False)
    assert entrypoint.main(["--termination-log", str(log)]) == 20
    result = decode(log.read_text())
    assert result.outcome == Outcome.INFRA_ERROR and "no trial given" in result.error
    assert capsys.readouterr().out.strip() == log.read_text()


def _run_entrypoint(tmp_path: Path, extra_env: dict[str, str]) -> tuple[int, TrialResult, str]:
    log = tmp_path / "termination-log"
    env = dict(os.environ) | {TRIAL_ENV: TRIAL.to_env(), "FLEETTUNE_TERMINATION_LOG": str(log)} | extra_env
    proc = subprocess.run([sys.executable, "-m", "fleettune_job.entrypoint"], env=env, capture_output=True,
                          text=True, timeout=60)
    return proc.returncode, decode(log.read_text()), proc.stderr


def test_without_a_gpu_the_job_exits_cleanly_with_an_infra_error(tmp_path: Path) -> None:
    # CUDA_VISIBLE_DEVICES="" hides any GPU, so this holds on GPU machines too.
    code, result, stderr = _run_entrypoint(tmp_path, env_with_path(JOB_IMAGE) | {"CUDA_VISIBLE_DEVICES": ""})
    assert code == 20, stderr
    assert result.outcome == Outcome.INFRA_ERROR
    assert result.error.startswith("no GPU"), result.error
    assert "Traceback" not in stderr


def test_without_cupy_the_job_exits_cleanly_with_an_infra_error(tmp_path: Path) -> None:
    stub = tmp_path / "stub"
    stub.mkdir()
    (stub / "cupy.py").write_text("raise ImportError('No module named cupy')\n")
    code, result, stderr = _run_entrypoint(tmp_path, env_with_path(stub, JOB_IMAGE))
    assert code == 20, stderr
    assert result.error.startswith("no GPU: cupy cannot be imported"), result.error


def test_worker_result_is_passed_through(fake_worker: Path) -> None:
    result = supervise(TRIAL, worker_module="fake_worker",
                       extra_env=env_with_path(fake_worker, JOB_IMAGE) | {"FAKE_MODE": "ok"})
    assert result.outcome == Outcome.OK and result.objective == 1.25
    assert result.error == "7"  # the worker received the trial


def test_a_hung_worker_is_killed_and_reported_as_timeout(fake_worker: Path) -> None:
    trial = TRIAL.model_copy(update={"timeout_s": 1.5})
    started = time.monotonic()
    result = supervise(trial, worker_module="fake_worker",
                       extra_env=env_with_path(fake_worker, JOB_IMAGE) | {"FAKE_MODE": "hang"})
    assert time.monotonic() - started < 10
    assert result.outcome == Outcome.TIMEOUT and result.exit_code == 14
    assert "1.5 s timeout while in phase run" in result.error
    assert result.fingerprint.product == "Fake GPU"


def test_the_timeout_starts_after_the_workers_setup(fake_worker: Path) -> None:
    trial = TRIAL.model_copy(update={"timeout_s": 1.0})
    result = supervise(trial, worker_module="fake_worker",
                       extra_env=env_with_path(fake_worker, JOB_IMAGE) | {"FAKE_MODE": "slow_setup"})
    assert result.outcome == Outcome.OK, result.error


@pytest.mark.parametrize("phase", ["device", "setup", "reference"])
def test_hanging_before_the_kernel_exists_or_in_the_reference_is_not_the_configurations_fault(
        fake_worker: Path, phase: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watchdog, "SETUP_LIMIT_S", 1.0)  # a start-up that never ends, cut short
    trial = TRIAL.model_copy(update={"timeout_s": 1.0})
    result = supervise(trial, worker_module="fake_worker",
                       extra_env=env_with_path(fake_worker, JOB_IMAGE) | {"FAKE_MODE": "hang", "FAKE_PHASE": phase})
    assert result.outcome == Outcome.INFRA_ERROR and f"phase {phase}" in result.error


@pytest.mark.parametrize(
    ("mode", "fragment"),
    [("crash", "exited with code 3"), ("kill", "killed by SIGKILL (out of memory?)"),
     ("garbage", "invalid result")],
)
def test_a_worker_without_a_valid_result_is_an_infra_error(fake_worker: Path, mode: str, fragment: str) -> None:
    result = supervise(TRIAL, worker_module="fake_worker",
                       extra_env=env_with_path(fake_worker, JOB_IMAGE) | {"FAKE_MODE": mode})
    assert result.outcome == Outcome.INFRA_ERROR
    assert fragment in result.error


def test_sigterm_ends_the_trial_as_an_infra_error(fake_worker: Path, tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    script = ("import sys; from fleettune_job import entrypoint; entrypoint.WORKER_MODULE = 'fake_worker'; "
              "sys.exit(entrypoint.main())")
    env = dict(os.environ) | env_with_path(fake_worker, JOB_IMAGE) | {
        TRIAL_ENV: TRIAL.to_env(), "FLEETTUNE_TERMINATION_LOG": str(log), "FAKE_MODE": "hang",
        "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    deadline = time.monotonic() + 20
    while not list(tmp_path.glob("fleettune-*/progress.json")) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 20
    result = decode(log.read_text())
    assert result.outcome == Outcome.INFRA_ERROR and "terminated by SIGTERM" in result.error


def test_list_kernels_prints_the_registry(capsys: pytest.CaptureFixture[str]) -> None:
    assert entrypoint.main(["--list-kernels"]) == 0
    kernels = json.loads(capsys.readouterr().out)
    assert set(kernels) == {"convolution", "gemm", "scan"}
    assert kernels["gemm"]["parameters"][0]["name"] == "block_size_x"
