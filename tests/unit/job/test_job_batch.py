"""The batch supervisor: one worker for the batch, answers streamed into the termination
log, each configuration's own timeout, fresh workers after crashes and sticky faults,
compile-ahead verdicts without the GPU — with a fake worker (``batch_fakes``) and fake
compilers, no GPU needed."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Collection
from concurrent.futures import Executor, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from fleettune_job import batch, entrypoint, nvrtc, watchdog
from fleettune_job.ahead import AheadOptions, Artefact, Build, Compiler
from fleettune_job.batch import BatchLog, rewrite, run_batch
from fleettune_job.protocol import (
    ANSWER_PREFIX,
    MAX_MESSAGE_BYTES,
    TRIAL_ENV,
    Batch,
    BatchResult,
    Entry,
    KernelRef,
    Outcome,
    TrialResult,
    decode_batch,
)

HERE = Path(__file__).resolve().parent
JOB_IMAGE = HERE.parents[2] / "job_image"
BLOCKS = [32, 64, 128, 256, 512, 1024]


def scan_batch(n: int = 4, timeout_s: float = 30, configs: list[dict[str, Any]] | None = None) -> Batch:
    configs = configs or [{"block_size_x": BLOCKS[i % 6], "rows_per_block": 1 + (i // 6) % 4 if BLOCKS[i % 6] <= 256
                           else 1, "items_per_thread": 4 * (1 + i // 24)} for i in range(n)]
    return Batch(run="scan-rtx", target="rtx", kernel=KernelRef(builtin="scan"), problem_size=[4096, 64],
                 entries=[Entry(index=10 + i, config=c) for i, c in enumerate(configs)], timeout_s=timeout_s)


class Fake:
    """One test's fake worker: its environment, its command log, the termination log."""

    def __init__(self, tmp: Path, **env: str) -> None:
        self.tmp = tmp
        self.log_path = tmp / "termination-log"
        self.commands = tmp / "commands.jsonl"
        self.env = {"PYTHONPATH": os.pathsep.join([str(HERE), str(JOB_IMAGE)]), "FAKE_LOG": str(self.commands),
                    "FLEETTUNE_TERMINATION_LOG": str(self.log_path)} | env

    def run(self, work: Batch, ahead: AheadOptions | None = None) -> BatchResult:
        return run_batch(work, self.log_path, worker_module="batch_fakes", extra_env=self.env, ahead=ahead)

    def seen(self) -> list[dict[str, Any]]:
        if not self.commands.exists():
            return []
        return [json.loads(line) for line in self.commands.read_text().splitlines()]

    def message(self) -> BatchResult:
        return decode_batch(self.log_path.read_text())


def by_index(result: BatchResult) -> dict[int, Any]:
    return {a.i: a for a in result.answers}


def test_answers_stream_into_the_termination_log_one_by_one(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    fake = Fake(tmp_path)
    result = fake.run(scan_batch(4))
    assert result.done and result.exit_code == 0 and not result.error
    assert [a.i for a in result.answers] == [10, 11, 12, 13]
    assert all(a.o == Outcome.OK for a in result.answers)
    assert result.answers[2].t == 1.12 and result.answers[2].c == 0.5 and result.answers[2].r == 0.25
    assert result.fingerprint.product == "Fake GPU"
    # When the worker got configuration k, the k answers before it were already in the file
    # (a valid batch result from the start: a Pod lost before its first answer reads as such).
    seen = fake.seen()
    assert [s["answers"] for s in seen] == [0, 1, 2, 3]
    assert len({s["pid"] for s in seen}) == 1  # one worker, one CUDA context, for the whole batch
    assert fake.message() == result
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith(ANSWER_PREFIX)]
    assert [json.loads(line[len(ANSWER_PREFIX):])["i"] for line in lines] == [10, 11, 12, 13]


@pytest.mark.parametrize("mode", ["kill", "crash"])
def test_a_worker_that_dies_mid_batch_keeps_what_was_done_and_a_fresh_worker_goes_on(tmp_path: Path,
                                                                                     mode: str) -> None:
    fake = Fake(tmp_path, FAKE_PLAN=json.dumps({"11": mode}))
    result = fake.run(scan_batch(4))
    answers = by_index(result)
    assert result.done and result.exit_code == 0
    assert answers[10].o == Outcome.OK and answers[12].o == Outcome.OK and answers[13].o == Outcome.OK
    assert answers[11].o == Outcome.INFRA_ERROR  # the node's fault: retried, never an invalid configuration
    assert ("killed by SIGKILL (out of memory?)" if mode == "kill" else "exited with code 3") in answers[11].e
    pids = [s["pid"] for s in fake.seen()]
    assert pids[0] == pids[1] and pids[2] == pids[3] and pids[1] != pids[2]


def test_a_worker_that_sends_no_valid_result_is_the_nodes_fault_and_a_fresh_worker_goes_on(tmp_path: Path) -> None:
    fake = Fake(tmp_path, FAKE_PLAN=json.dumps({"11": "garbage"}))
    result = fake.run(scan_batch(3))
    answers = by_index(result)
    assert result.done and answers[10].o == answers[12].o == Outcome.OK
    assert answers[11].o == Outcome.INFRA_ERROR and "worker sent an invalid result" in answers[11].e
    pids = [s["pid"] for s in fake.seen()]
    assert pids[1] != pids[2]


@pytest.mark.parametrize(("phase", "outcome"), [("run", Outcome.TIMEOUT), ("reference", Outcome.INFRA_ERROR)])
def test_a_hang_is_answered_for_that_configuration_only(tmp_path: Path, phase: str, outcome: Outcome) -> None:
    fake = Fake(tmp_path, FAKE_PLAN=json.dumps({"11": "hang"}), FAKE_PHASE=phase)
    started = time.monotonic()
    result = fake.run(scan_batch(3, timeout_s=1.0))
    assert time.monotonic() - started < 10
    answers = by_index(result)
    assert result.done
    assert answers[11].o == outcome and f"1 s timeout while in phase {phase}" in answers[11].e
    assert answers[10].o == Outcome.OK and answers[12].o == Outcome.OK
    pids = [s["pid"] for s in fake.seen()]
    assert pids[1] != pids[2]  # the hung worker was killed, a fresh one measured the rest


def test_a_configurations_timeout_starts_after_the_workers_setup(tmp_path: Path) -> None:
    fake = Fake(tmp_path, FAKE_PLAN=json.dumps({"10": "slow_setup"}), FAKE_SETUP_S="2")
    result = fake.run(scan_batch(2, timeout_s=1.0))
    assert result.done and [a.o for a in result.answers] == [Outcome.OK, Outcome.OK], result.answers
    assert len({s["pid"] for s in fake.seen()}) == 1


def test_a_setup_that_never_ends_is_the_nodes_fault(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watchdog, "SETUP_LIMIT_S", 1.0)
    fake = Fake(tmp_path, FAKE_PLAN=json.dumps({"10": "hang"}), FAKE_PHASE="setup")
    started = time.monotonic()
    result = fake.run(scan_batch(2, timeout_s=1.0))
    assert time.monotonic() - started < 10
    answers = by_index(result)
    assert answers[10].o == Outcome.INFRA_ERROR and "1 s timeout while in phase setup" in answers[10].e
    assert answers[11].o == Outcome.OK


def test_a_sticky_fault_gets_a_fresh_worker_and_a_refused_launch_does_not(tmp_path: Path) -> None:
    fake = Fake(tmp_path, FAKE_PLAN=json.dumps({"11": "sticky", "12": "toomany"}))
    result = fake.run(scan_batch(4))
    answers = by_index(result)
    assert answers[11].o == Outcome.RUNTIME_ERROR and "ILLEGAL_ADDRESS" in answers[11].e
    assert answers[12].o == Outcome.LAUNCH_ERROR and answers[13].o == Outcome.OK
    pids = [s["pid"] for s in fake.seen()]
    assert pids[0] == pids[1] != pids[2] == pids[3]


def test_without_a_gpu_nothing_is_answered(tmp_path: Path) -> None:
    fake = Fake(tmp_path, FAKE_HELLO="nogpu")
    result = fake.run(scan_batch(3))
    assert not result.answers and not result.done and result.exit_code == 20
    assert result.error.startswith("no GPU")
    assert fake.message() == result


@pytest.mark.parametrize(("hello", "fragment"), [("die", "exited with code 4 before reporting its GPU"),
                                                 ("hang", "did not report its GPU within 1 s (hung in phase device)")])
def test_a_worker_that_never_starts_answers_nothing(tmp_path: Path, hello: str, fragment: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watchdog, "SETUP_LIMIT_S", 1.0)  # the start's own allowance, cut short
    result = Fake(tmp_path, FAKE_HELLO=hello).run(scan_batch(2, timeout_s=1.0))
    assert not result.answers and result.exit_code == 20 and fragment in result.error


def test_when_a_fresh_worker_cannot_start_the_rest_is_left_unanswered(tmp_path: Path) -> None:
    fake = Fake(tmp_path, FAKE_PLAN=json.dumps({"11": "sticky"}), FAKE_HELLO_ONCE=str(tmp_path / "started"))
    result = fake.run(scan_batch(4))
    assert [a.i for a in result.answers] == [10, 11]
    assert not result.done and result.exit_code == 20
    assert result.error.startswith("a fresh worker could not start: no GPU")
    assert all(not a.o.is_invalid_configuration or a.i == 11 for a in result.answers)


def test_a_worker_gone_between_two_configurations_is_replaced_without_an_answer(tmp_path: Path) -> None:
    fake = Fake(tmp_path, FAKE_PLAN=json.dumps({"11": "exit_after"}))

    def slow_for_12(build: Build, compute_capability: str, out_dir: str) -> Artefact:
        if "#define block_size_x 128\n" in build.source:  # #12 is ready once the worker has answered #11 and ended
            deadline = time.monotonic() + 10
            while len(fake.seen()) < 2 and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(0.5)
        return Artefact(note="not compiled ahead: fake")

    result = fake.run(scan_batch(4), ahead=AheadOptions(1, slow_for_12, threads))
    assert result.done and all(a.o == Outcome.OK for a in result.answers)
    pids = [s["pid"] for s in fake.seen()]
    assert pids[1] != pids[2]


def test_workers_lost_again_and_again_end_the_batch(tmp_path: Path) -> None:
    fake = Fake(tmp_path, FAKE_PLAN=json.dumps({str(10 + i): "crash" for i in range(6)}))
    result = fake.run(scan_batch(6))
    assert [a.o for a in result.answers] == [Outcome.INFRA_ERROR] * batch.MAX_WORKERS_LOST
    assert result.exit_code == 20 and "lost on 3 configurations in a row" in result.error


def test_the_message_fits_4_kib_for_48_configurations_with_long_errors(tmp_path: Path) -> None:
    fake = Fake(tmp_path, FAKE_PLAN=json.dumps({str(10 + i): "longerror" for i in range(48)}))
    result = fake.run(scan_batch(48))
    assert result.done and len(result.answers) == 48
    assert all(s["log_bytes"] <= MAX_MESSAGE_BYTES for s in fake.seen())
    text = fake.log_path.read_text()
    assert len(text.encode()) <= MAX_MESSAGE_BYTES
    assert {a.o for a in decode_batch(text).answers} == {Outcome.CORRECTNESS_ERROR}


def test_sigterm_mid_batch_keeps_the_answers_and_exits_20(tmp_path: Path) -> None:
    fake = Fake(tmp_path, FAKE_PLAN=json.dumps({"12": "hang"}), FLEETTUNE_COMPILE_WORKERS="0")
    script = ("import sys; from fleettune_job import batch, entrypoint; batch.BATCH_WORKER_MODULE = 'batch_fakes'; "
              "sys.exit(entrypoint.main())")
    env = dict(os.environ) | fake.env | {TRIAL_ENV: scan_batch(4).to_env()}
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 20
    while len(fake.seen()) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 20
    result = fake.message()
    assert [a.i for a in result.answers] == [10, 11] and not result.done
    assert result.error == "terminated by SIGTERM after 2 of 4 configurations, while on #12 in phase run"
    out = proc.stdout.read().decode() if proc.stdout else ""
    assert out.count(ANSWER_PREFIX) == 2 and "fleettune-batch " in out


# Compile-ahead, with fake compilers in threads (the pool's processes are for real NVRTC).

def fake_compiler(fail: Collection[int] = (), registers: dict[int, int] | None = None) -> Compiler:
    """Compile error for the block sizes in ``fail``; ``registers`` per block size."""
    def compile_build(build: Build, compute_capability: str, out_dir: str) -> Artefact:
        assert compute_capability == "8.0"
        block = int(re.search(r"^#define block_size_x (\d+)$", build.source, re.M)[1])
        if block in fail:
            return Artefact(seconds=0.75, error="compile error: line 3: error: identifier \"oops\" is undefined")
        path = Path(out_dir, f"{build.key}.cubin")
        path.write_bytes(b"\x7fELF fake")
        return Artefact(path=str(path), seconds=0.25, resources={"num_regs": (registers or {}).get(block, 32),
                                                                 "shared_size_bytes": 1024})
    return compile_build


def threads(workers: int) -> Executor:
    return ThreadPoolExecutor(workers)


def test_a_configuration_that_does_not_compile_is_answered_without_the_worker(tmp_path: Path) -> None:
    fake = Fake(tmp_path)
    result = fake.run(scan_batch(4), ahead=AheadOptions(2, fake_compiler(fail={64}), threads))
    answers = by_index(result)
    assert result.done
    assert answers[11].o == Outcome.COMPILE_ERROR and "oops" in answers[11].e and answers[11].c == 0.75
    seen = fake.seen()
    assert [s["index"] for s in seen] == [10, 12, 13]
    # The others were measured from their cubins: one per configuration, compiled ahead.
    for s in seen:
        ((key, (path, seconds)),) = s["cubins"].items()
        assert path.endswith(f"{key}.cubin") and seconds == 0.25


def test_a_configuration_beyond_the_devices_registers_is_a_launch_error_without_the_gpu(tmp_path: Path) -> None:
    fake = Fake(tmp_path)
    # 1024 threads x 128 registers: twice the 65536 registers of a block.
    result = fake.run(scan_batch(6), ahead=AheadOptions(2, fake_compiler(registers={1024: 128, 512: 128}), threads))
    answers = by_index(result)
    assert answers[15].o == Outcome.LAUNCH_ERROR
    assert "128 registers/thread x 1024 threads = 131072 registers, the device has 65536" in answers[15].e
    assert "block 1024x1x1 = 1024 threads" in answers[15].e
    assert answers[14].o == Outcome.OK  # 512 x 128 = 65536: fits, at the margin the GPU decides
    assert 15 not in [s["index"] for s in fake.seen()]


def test_a_compile_ahead_that_gives_nothing_leaves_the_compile_to_the_worker(tmp_path: Path) -> None:
    def unavailable(build: Build, compute_capability: str, out_dir: str) -> Artefact:
        if "#define block_size_x 64\n" in build.source:
            raise RuntimeError("a pool process died")
        return Artefact(seconds=0.1, note="not compiled ahead (NVRTC status 5): invalid value for --gpu-architecture")

    fake = Fake(tmp_path)
    result = fake.run(scan_batch(3), ahead=AheadOptions(1, unavailable, threads))
    assert result.done and all(a.o == Outcome.OK for a in result.answers)
    assert [s["cubins"] for s in fake.seen()] == [{}, {}, {}]


def user_batch(tmp_path: Path, data: bool = True) -> Batch:
    source = tmp_path / "vadd.cu"
    source.write_text('extern "C" __global__ void vadd(float *c, const float *a, int n) '
                      "{ int i = blockIdx.x * BS + threadIdx.x; if (i < n) c[i] = a[i] + 1; }\n")
    if data:
        (tmp_path / "a.txt").write_text(" ".join(str(i) for i in range(1000)))
    kernel = KernelRef(source_path=str(source), function="vadd", grid=["cdiv(problem_size[0], BS)"], block=["BS"],
                       arguments=[{"name": "c", "length": "problem_size[0]", "output": True},
                                  {"name": "a", "length": "problem_size[0]", "init": "data",
                                   "data_path": str(tmp_path / "a.txt")},
                                  {"name": "n", "kind": "scalar", "dtype": "int32", "value": "problem_size[0]"}],
                       verification={"reference_config": {"BS": 128}})
    return Batch(run="u", target="t", kernel=kernel, problem_size=[1000],
                 entries=[Entry(index=i, config={"BS": bs}) for i, bs in enumerate([64, 256, 128])])


def recording_compiler(compiled: list[Build]) -> Compiler:
    def record(build: Build, compute_capability: str, out_dir: str) -> Artefact:
        compiled.append(build)
        path = Path(out_dir, f"{build.key}.cubin")
        path.write_bytes(b"fake")
        return Artefact(path=str(path), seconds=0.5, resources={"num_regs": 16})
    return record


def test_a_pool_that_cannot_start_leaves_the_compiles_to_the_worker(tmp_path: Path) -> None:
    def no_pool(workers: int) -> Executor:
        raise OSError("this platform lacks a functioning sem_open implementation")

    fake = Fake(tmp_path)
    result = fake.run(scan_batch(2), ahead=AheadOptions(2, fake_compiler(), no_pool))
    assert result.done and all(a.o == Outcome.OK for a in result.answers)


def test_a_user_kernels_reference_compiles_once_per_batch(tmp_path: Path) -> None:
    compiled: list[Build] = []
    fake = Fake(tmp_path)
    result = fake.run(user_batch(tmp_path), ahead=AheadOptions(1, recording_compiler(compiled), threads))
    assert result.done
    # BS=128 is the reference configuration itself: three builds in all, the reference first.
    assert [b.source.split("\n")[0] for b in compiled] == ["#define BS 128", "#define BS 64", "#define BS 256"]
    reference = compiled[0].key
    assert all(reference in s["cubins"] for s in fake.seen())


def test_a_batch_that_cannot_be_prepared_is_left_to_the_worker(tmp_path: Path) -> None:
    # A missing data file fails every configuration alike (infra_error, from the worker): no
    # compile-ahead verdict may come first.
    compiled: list[Build] = []
    fake = Fake(tmp_path)
    result = fake.run(user_batch(tmp_path, data=False), ahead=AheadOptions(1, recording_compiler(compiled), threads))
    assert result.done and compiled == [] and [s["index"] for s in fake.seen()] == [0, 1, 2]


@pytest.mark.skipif(not nvrtc.available(), reason="libnvrtc not found (pip install nvidia-cuda-nvrtc-cu12)")
def test_the_entrypoint_compiles_ahead_in_a_process_pool_with_the_real_nvrtc(tmp_path: Path) -> None:
    fake = Fake(tmp_path, FLEETTUNE_COMPILE_WORKERS="2")
    configs = [{"block_size_x": 64}, {"block_size_x": 128, "items_per_thread": 3, "vector_width": 1}]
    script = ("import sys; from fleettune_job import batch, entrypoint; batch.BATCH_WORKER_MODULE = 'batch_fakes'; "
              "sys.exit(entrypoint.main())")
    env = dict(os.environ) | fake.env | {TRIAL_ENV: scan_batch(configs=configs).to_env()}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "compiling 2 configurations ahead for sm 8.0 in 2 processes" in proc.stderr
    assert fake.message().done
    for seen in fake.seen():  # each was loaded from a real sm_80 cubin, none compiled by the worker
        assert len(seen["cubins"]) == 1 and seen["cubin_bytes"] == ["\x7fELF"]


# The entrypoint: every work is a batch (of one configuration or several).

def test_the_entrypoint_reads_a_batch_and_refuses_anything_else(tmp_path: Path) -> None:
    work = scan_batch(2)
    args = entrypoint.parse_args(["--trial", work.to_env()])
    assert entrypoint.load_batch(args, {}) == work
    with pytest.raises(entrypoint.TrialInputError, match="invalid batch in --trial"):
        entrypoint.load_batch(entrypoint.parse_args(["--trial", "{not json"]), {})
    # A one-configuration document of an earlier version is not a batch.
    trial = work.trials()[0].model_dump_json()
    with pytest.raises(entrypoint.TrialInputError, match="invalid batch in --trial: entries: Field required"):
        entrypoint.load_batch(entrypoint.parse_args(["--trial", trial]), {})


def test_an_invalid_batch_is_answered_with_a_batch_result(tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    bad = json.loads(scan_batch(2).to_env()) | {"entries": []}
    assert entrypoint.main(["--trial", json.dumps(bad), "--termination-log", str(log)]) == 20
    result = decode_batch(log.read_text())
    assert not result.answers and "invalid batch in --trial: entries" in result.error


def test_a_batch_of_one_answers_an_invalid_configuration_and_exits_0(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # An invalid configuration is a verdict in the message: the Pod ends as answered, nothing retries it.
    from fleettune_job import runner

    wrong = TrialResult(outcome=Outcome.CORRECTNESS_ERROR, error="wrong")
    monkeypatch.setattr(runner, "run_trial", lambda trial: wrong)
    log = tmp_path / "termination-log"
    one = scan_batch(1)
    assert entrypoint.main(["--trial", one.to_env(), "--termination-log", str(log), "--in-process"]) == 0
    result = decode_batch(log.read_text())
    assert result.done and [(a.i, a.o, a.e) for a in result.answers] == [(10, Outcome.CORRECTNESS_ERROR, "wrong")]


def test_without_a_gpu_the_real_batch_worker_answers_nothing(tmp_path: Path) -> None:
    # The real worker: no cupy here (or no visible GPU where there is one).
    log = tmp_path / "termination-log"
    env = dict(os.environ) | {TRIAL_ENV: scan_batch(3).to_env(), "FLEETTUNE_TERMINATION_LOG": str(log),
                              "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(JOB_IMAGE),
                              "FLEETTUNE_COMPILE_WORKERS": "0"}
    proc = subprocess.run([sys.executable, "-m", "fleettune_job.entrypoint"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 20, proc.stderr
    result = decode_batch(log.read_text())
    assert not result.answers and not result.done and result.error.startswith("no GPU"), result.error
    assert "Traceback" not in proc.stderr


# The termination log, rewritten in place.

def test_rewrite_replaces_the_content_in_place(tmp_path: Path) -> None:
    path = tmp_path / "termination-log"
    rewrite(path, json.dumps({"a": "x" * 100}))
    inode = path.stat().st_ino
    rewrite(path, '{"a": 1}')
    assert path.read_text() == '{"a": 1}' and path.stat().st_ino == inode


def test_a_batch_log_is_never_done_before_every_entry_is_answered(tmp_path: Path) -> None:
    log = BatchLog(tmp_path / "log", [1, 2])
    log.record(1, TrialResult(outcome=Outcome.TIMEOUT, error="slow"))
    assert not log.done
    stopped = log.finish("terminated by SIGTERM")
    assert stopped.exit_code == 20 and stopped.error == "terminated by SIGTERM"
    log.record(2, TrialResult(outcome=Outcome.OK, objective=2.0))
    assert log.finish("ignored once done") == BatchResult(answers=log.answers, done=True)


def test_an_answer_is_in_the_termination_log_before_it_is_printed(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # The operator may learn an answer from the log line; the record must then hold it too,
    # whenever the Pod dies.
    path = tmp_path / "termination-log"
    book = BatchLog(path, expected=[3, 4])
    book.start()
    in_file_when_printed: list[list[int]] = []

    def printed(*args: Any, **_: Any) -> None:
        if str(args[0]).startswith(ANSWER_PREFIX):
            in_file_when_printed.append([a.i for a in decode_batch(path.read_text()).answers])

    monkeypatch.setattr("builtins.print", printed)
    book.record(3, TrialResult(outcome=Outcome.OK, objective=1.5, times=[1.5]))
    book.record(4, TrialResult(outcome=Outcome.COMPILE_ERROR, error="too many registers"))
    assert in_file_when_printed == [[3], [3, 4]]
