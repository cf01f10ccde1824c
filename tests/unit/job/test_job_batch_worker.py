"""The batch's CUDA worker on a numpy-backed stand-in for cupy: it loads the cubins compiled
ahead (and compiles itself when one does not load), reports its GPU, answers each
configuration the supervisor sends, and says how long the GPU was busy."""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from cuda_fakes import CUDADriverError, CUDARuntimeError
from test_job_runner import FakeCupy, scan_correct, trial

from fleettune_job import batch_worker, fingerprint, gpu, runner, verification
from fleettune_job.prepare import prepare
from fleettune_job.protocol import TRIAL_ENV, Batch, Entry, KernelRef, Outcome, decode


class CubinCupy(FakeCupy):
    """Also loads modules from a path (``RawModule(path=...)``), as cupy does for a cubin."""

    def __init__(self, behaviour: Any, bad_cubin: bool = False, **kw: Any) -> None:
        super().__init__(behaviour, **kw)
        self.loaded: list[str] = []
        self.compiled = 0
        from_source = self.RawModule
        fake = self

        def raw_module(code: str | None = None, options: tuple[str, ...] = (), path: str | None = None) -> Any:
            if path is not None:
                fake.loaded.append(path)
                if bad_cubin:
                    raise CUDADriverError("CUDA_ERROR_INVALID_IMAGE: device kernel image is invalid")
                return from_source("", ())
            fake.compiled += 1
            return from_source(code or "", options)

        self.RawModule = raw_module


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu, "_MODULES", {})
    monkeypatch.setattr(gpu, "_CUBINS", {})
    # The array code verifies here: only the trial's own modules count as compiled.
    monkeypatch.setattr(verification, "_MODULE", {"module": None})
    monkeypatch.setattr(fingerprint, "nvml_driver_version", lambda: "550.54.15")


def test_a_cubin_compiled_ahead_is_loaded_not_compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = CubinCupy(scan_correct)
    monkeypatch.setattr(gpu, "load_cupy", lambda: fake)
    work = trial()
    gpu.use_cubins({prepare(work).key: ("/tmp/ahead/k.cubin", 0.4)})
    result = runner.run_trial(work)
    assert result.outcome == Outcome.OK, result.error
    assert fake.loaded == ["/tmp/ahead/k.cubin"] and fake.compiled == 0
    assert result.compile_s is not None and result.compile_s >= 0.4  # compiled ahead: its CPU seconds count


def test_a_cubin_that_does_not_load_is_compiled_here(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = CubinCupy(scan_correct, bad_cubin=True)
    monkeypatch.setattr(gpu, "load_cupy", lambda: fake)
    work = trial()
    gpu.use_cubins({prepare(work).key: ("/tmp/ahead/k.cubin", 0.4)})
    result = runner.run_trial(work)
    assert result.outcome == Outcome.OK, result.error
    assert fake.loaded == ["/tmp/ahead/k.cubin"] and fake.compiled == 1
    assert result.compile_s is not None and result.compile_s < 0.4


def test_a_fault_after_the_first_launch_still_says_how_long_the_gpu_was_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    err = CUDARuntimeError("cudaErrorIllegalAddress: an illegal memory access was encountered")
    monkeypatch.setattr(gpu, "load_cupy", lambda: FakeCupy(scan_correct, sync_error=err))
    result = runner.run_trial(trial())
    assert result.outcome == Outcome.RUNTIME_ERROR and result.run_s is not None


def run_worker(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, work: Batch, commands: list[dict[str, Any]],
               fake: FakeCupy | None) -> list[dict[str, Any]]:
    """batch_worker.main in this process, its stdin and answer pipe faked; the messages it sent."""
    if fake is None:
        from fleettune_job.classify import NoGpu

        def no_gpu() -> Any:
            raise NoGpu("no GPU: no CUDA device is visible to this container")

        monkeypatch.setattr(gpu, "load_cupy", no_gpu)
    else:
        monkeypatch.setattr(gpu, "load_cupy", lambda: fake)
    monkeypatch.setenv(TRIAL_ENV, work.to_env())
    monkeypatch.setattr(sys, "stdin", io.StringIO("".join(json.dumps(c) + "\n" for c in commands)))
    read_fd, write_fd = os.pipe()
    assert batch_worker.main(["--progress-file", str(tmp_path / "progress.json"), "--answer-fd", str(write_fd)]) == 0
    with os.fdopen(read_fd) as answers:
        return [json.loads(line) for line in answers]


def scan_batch() -> Batch:
    return Batch(run="run", target="rtx", kernel=KernelRef(builtin="scan"), problem_size=[64, 3],
                 entries=[Entry(index=4, config={}), Entry(index=9, config={"items_per_thread": 3})])


def test_the_batch_worker_reports_its_gpu_then_answers_each_command(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    fake = CubinCupy(scan_correct)
    work = scan_batch()
    key = prepare(work.trials()[0]).key
    messages = run_worker(monkeypatch, tmp_path, work, [{"index": 4, "cubins": {key: ["/tmp/a.cubin", 0.5]}},
                                                        {"index": 9, "cubins": {}}, {"index": 99}], fake)
    hello, first, second, unknown = messages
    assert hello["hello"]["fingerprint"]["product"] == "Fake GPU"
    assert hello["hello"]["limits"]["maxThreadsPerBlock"] == 1024
    assert first["index"] == 4 and decode(first["result"]).outcome == Outcome.OK
    assert fake.loaded == ["/tmp/a.cubin"]
    assert second["index"] == 9 and decode(second["result"]).outcome == Outcome.COMPILE_ERROR
    assert decode(unknown["result"]).outcome == Outcome.INFRA_ERROR
    progress = json.loads((tmp_path / "progress.json").read_text())
    assert progress["phase"] == "setup" and progress["fingerprint"]["product"] == "Fake GPU"


def test_the_batch_worker_without_a_gpu_says_so_and_ends(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (message,) = run_worker(monkeypatch, tmp_path, scan_batch(), [{"index": 4}], None)
    assert message == {"error": "no GPU: no CUDA device is visible to this container"}
