"""The batch supervisor: one Pod measures the configurations of one target (one or several).

PID 1 never touches CUDA: a hung kernel blocks its host thread inside the CUDA driver,
where no Python-level timer can interrupt it, and a kernel fault leaves the CUDA context
unusable, so the supervisor must always be able to kill the worker at a deadline and still
write the verdict. It runs one persistent worker process
(:mod:`fleettune_job.batch_worker`: one CUDA context, one interpreter) that measures the
configurations in order, while the upcoming ones compile on the CPU
(:mod:`fleettune_job.ahead`). After every answer it rewrites the termination log with the
answers so far (``BatchResult``, ``done`` false until the last) and prints the answer as a
``fleettune-answer {...}`` log line: the kubelet reads the file however the container
ends, so what the Pod finished is kept whatever kills it.

Each configuration keeps its own ``timeout_s``: a worker that hangs is killed, that
configuration gets the watchdog's verdict (``timeout``, or ``infra_error`` when it hung
before its kernel existed or in the reference), and a fresh worker goes on with the rest;
so does one after a crash, or after a fault that leaves the CUDA context unusable. A
worker that cannot start (no GPU) ends the batch early: the unanswered configurations are
retried by the operator, never recorded as invalid.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from fleettune_job import watchdog
from fleettune_job.ahead import AheadOptions, CompileAhead, Verdict, stop_executor
from fleettune_job.classify import poisons_context, short
from fleettune_job.protocol import (
    TRIAL_ENV,
    Answer,
    Batch,
    BatchResult,
    Fingerprint,
    Outcome,
    ProtocolError,
    Trial,
    TrialResult,
    decode,
    infra_failure,
)
from fleettune_job.watchdog import (
    POLL_S,
    REAP_TIMEOUT_S,
    Deadline,
    StopSignals,
    Terminated,
    death_result,
    how_it_ended,
    kill,
    read_progress,
    timeout_result,
)

BATCH_WORKER_MODULE = "fleettune_job.batch_worker"
BATCH_PREFIX = "fleettune-batch "
# Configurations in a row that cost the worker without a verdict on the configuration
# (crash, hang before the kernel existed): the node is sick, the rest is for another Pod.
MAX_WORKERS_LOST = 3


def log(message: str) -> None:
    print(f"fleettune-job: batch: {message}", file=sys.stderr, flush=True)


def rewrite(path: Path, text: str) -> None:
    """Replace the file's content in place (``/dev/termination-log`` is a bind mount: no
    rename onto it). The new text goes first, padded with blanks to the old length, then
    the file is cut to size: whenever the process dies, the file holds one whole JSON
    document (trailing blanks are valid JSON)."""
    data = text.encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        old = os.fstat(fd).st_size
        os.pwrite(fd, data + b" " * max(0, old - len(data)), 0)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)


class BatchLog:
    """The answers so far: in the termination log after every one, and on stdout."""

    def __init__(self, path: Path, expected: Iterable[int] = ()) -> None:
        self.path = path
        self.expected = set(expected)
        self.answers: list[Answer] = []
        self.fingerprint = Fingerprint()

    @property
    def done(self) -> bool:
        return bool(self.expected) and self.expected <= {a.i for a in self.answers}

    def start(self) -> None:
        """An empty, valid document: a Pod lost before its first answer reads as such."""
        self._write(BatchResult(fingerprint=self.fingerprint))

    def record(self, index: int, result: TrialResult) -> None:
        answer = Answer.of(index, result)
        self.answers.append(answer)
        # The termination log first: an answer the operator read from the log is then also in
        # the record, whenever the Pod dies.
        self._write(BatchResult(answers=self.answers, fingerprint=self.fingerprint))
        print(answer.line(), flush=True)

    def finish(self, error: str = "") -> BatchResult:
        done = self.done
        doc = BatchResult(answers=self.answers, fingerprint=self.fingerprint, done=done,
                          error="" if done else error or "stopped before every configuration was answered")
        print(BATCH_PREFIX + self._write(doc), flush=True)
        return doc

    def _write(self, doc: BatchResult) -> str:
        text = doc.encode()
        try:
            rewrite(self.path, text)
        except OSError as exc:
            print(f"fleettune-job: cannot write termination log {self.path}: {exc}", file=sys.stderr, flush=True)
        return text


@dataclass(frozen=True)
class Hello:
    fingerprint: Fingerprint
    limits: dict[str, int]


class WorkerFailed(Exception):
    """The worker could not start: no GPU, or it died or hung before reporting one."""


class Worker:
    """One batch worker process (one CUDA context), with its command pipe (stdin) and its
    answer pipe; ``lost`` once it is gone or had to be killed."""

    def __init__(self, cmd: list[str], env: Mapping[str, str], progress_file: Path) -> None:
        self.progress_file = progress_file
        self.lost = False
        self._buffer = b""
        self._fd, write_fd = os.pipe()
        try:
            self._proc = subprocess.Popen(
                [*cmd, "--progress-file", str(progress_file), "--answer-fd", str(write_fd)],
                env=dict(env), stdin=subprocess.PIPE, pass_fds=(write_fd,))
        except OSError as exc:
            os.close(self._fd)
            raise WorkerFailed(f"cannot start the worker: {exc}") from None
        finally:
            os.close(write_fd)

    def hello(self, timeout_s: float) -> Hello:
        try:
            message = self._receive(time.monotonic() + timeout_s)
        except TimeoutError:
            phase, _ = read_progress(self.progress_file)
            where = f" (hung in phase {phase})" if phase else ""
            raise WorkerFailed(f"the worker did not report its GPU within {timeout_s:g} s{where}") from None
        if message is None:
            raise WorkerFailed(f"the worker {how_it_ended(self._reap())} before reporting its GPU")
        try:
            hello = message["hello"]
            limits = {str(k): int(v) for k, v in hello.get("limits", {}).items()}
            return Hello(Fingerprint.model_validate(hello["fingerprint"]), limits)
        except (KeyError, TypeError, ValueError, AttributeError, ValidationError):
            error = message.get("error")
            raise WorkerFailed(str(error) if error else f"the worker said {short(json.dumps(message), 200)}") from None

    def run(self, trial: Trial, cubins: Mapping[str, tuple[str, float]]) -> TrialResult:
        """The worker's result for ``trial``, or the watchdog's verdict when there is none."""
        self.progress_file.unlink(missing_ok=True)  # the phases in it must be this configuration's
        deadline = Deadline(time.monotonic(), trial.timeout_s, self.progress_file)
        if not self._send({"index": trial.index, "cubins": dict(cubins)}):
            return self._died()
        while True:
            now = time.monotonic()
            at = deadline.update(now)
            try:
                message = self._receive(min(at, now + POLL_S))
                break
            except TimeoutError:
                if time.monotonic() >= at:
                    self.stop()
                    return timeout_result(trial.timeout_s, *read_progress(self.progress_file))
        if message is None:
            return self._died()
        try:
            result = message.get("result")
            if message.get("index") != trial.index or not isinstance(result, str):
                raise ProtocolError(f"expected the result of #{trial.index}, got {short(json.dumps(message), 200)}")
            return decode(result)
        except ProtocolError as exc:
            self.stop()
            return infra_failure(f"worker sent an invalid result: {exc}")

    def exited(self) -> bool:
        return self._proc.poll() is not None

    def stop(self) -> None:
        self.lost = True
        kill(self._proc)
        if self._proc.stdin is not None and not self._proc.stdin.closed:
            with contextlib.suppress(OSError):  # its reader is gone: nothing left to flush to
                self._proc.stdin.close()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def _died(self) -> TrialResult:
        code = self._reap()
        self.stop()
        return death_result(code, *read_progress(self.progress_file))

    def _reap(self) -> int:
        try:
            return self._proc.wait(timeout=REAP_TIMEOUT_S)
        except subprocess.TimeoutExpired:  # it closed the pipe yet lives on: it is no worker of ours any more
            kill(self._proc)
            return self._proc.returncode if self._proc.returncode is not None else -signal.SIGKILL

    def _send(self, doc: dict[str, Any]) -> bool:
        stdin = self._proc.stdin
        if stdin is None:
            return False
        try:
            stdin.write((json.dumps(doc) + "\n").encode())
            stdin.flush()
            return True
        except OSError:  # BrokenPipeError: the worker is gone
            return False

    def _receive(self, deadline: float) -> dict[str, Any] | None:
        """The worker's next message; None when it is gone; TimeoutError at ``deadline``."""
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            ready, _, _ = select.select([self._fd], [], [], remaining)
            if ready:
                chunk = os.read(self._fd, 1 << 16)
                if not chunk:
                    return None
                self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        try:
            doc = json.loads(line)
        except ValueError:
            doc = None
        return doc if isinstance(doc, dict) else {"invalid": line.decode(errors="replace")[:200]}


class _Supervisor:
    """Runs the configurations in order, with one worker at a time and compile-ahead."""

    def __init__(self, batch: Batch, log: BatchLog, tmp: Path, cmd: list[str], env: Mapping[str, str],
                 ahead: AheadOptions | None) -> None:
        self.batch = batch
        self.trials = batch.trials()
        self.log = log
        self.tmp = tmp
        self.cmd = cmd
        self.env = env
        self.ahead_options = ahead
        self.ahead: CompileAhead | None = None
        self.executor: Executor | None = None
        self.worker: Worker | None = None
        self.current: Trial | None = None
        self.workers_started = 0
        self.lost_in_a_row = 0
        self.measuring = False  # the worker has the current configuration (else it waits for its compile)

    def run(self) -> str:
        """Answers every configuration it can; returns why it stopped early ("" when it did not)."""
        for position, trial in enumerate(self.trials):
            self.current = trial
            # A worker lost on the last configuration is replaced now: its start overlaps the compile.
            failed = self._ensure_worker(self.trials[position:])
            if failed:
                return failed
            verdict = self.ahead.verdict(trial, trial.timeout_s) if self.ahead else Verdict()
            if verdict.result is not None:
                self.log.record(trial.index, verdict.result)
                continue
            failed = self._ensure_worker(self.trials[position:])
            if failed:
                return failed
            stopped = self._measure(trial, verdict.cubins)
            if stopped:
                return stopped
        self.current = None
        return ""

    def _ensure_worker(self, upcoming: list[Trial]) -> str:
        """A live worker, started if need be; why none could start otherwise."""
        if self.worker is not None and self.worker.exited():
            # Gone between two configurations: no configuration's doing, none is answered for it.
            log("the worker ended between two configurations: a fresh worker goes on")
            self.worker.stop()
            self.worker = None
        if self.worker is None:
            try:
                self._start_worker(upcoming)
            except WorkerFailed as exc:
                fresh = "a fresh worker could not start: " if self.workers_started > 1 else ""
                return short(f"{fresh}{exc}")
        return ""

    def _measure(self, trial: Trial, cubins: Mapping[str, tuple[str, float]]) -> str:
        assert self.worker is not None
        self.measuring = True
        result = self.worker.run(trial, cubins)
        self.measuring = False
        self.log.record(trial.index, result)
        lost = self.worker.lost
        if lost or poisons_context(result.outcome, result.error):
            log(f"#{trial.index}: {result.outcome} ({short(result.error, 120)}): a fresh worker goes on")
            self.worker.stop()
            self.worker = None
        self.lost_in_a_row = self.lost_in_a_row + 1 if lost and result.outcome == Outcome.INFRA_ERROR else 0
        if self.lost_in_a_row >= MAX_WORKERS_LOST:
            return short(f"the worker was lost on {self.lost_in_a_row} configurations in a row, last: {result.error}")
        return ""

    def _start_worker(self, upcoming: list[Trial]) -> None:
        self.workers_started += 1
        worker = Worker(self.cmd, self.env, self.tmp / f"progress-{self.workers_started}.json")
        try:
            # Starting is set-up, not a configuration's time (watchdog.Deadline).
            hello = worker.hello(max(self.batch.timeout_s, watchdog.SETUP_LIMIT_S))
        except WorkerFailed:
            worker.stop()
            raise
        self.worker = worker
        self.log.fingerprint = hello.fingerprint
        if self.ahead is None:
            self._start_compile_ahead(upcoming, hello)

    def _start_compile_ahead(self, upcoming: list[Trial], hello: Hello) -> None:
        options, arch = self.ahead_options, hello.fingerprint.compute_capability
        if options is None or not arch:
            return
        out_dir = self.tmp / "cubins"
        try:
            out_dir.mkdir(exist_ok=True)
            self.executor = options.executor(options.workers)
            self.ahead = CompileAhead(upcoming, compute_capability=arch, limits=hello.limits, out_dir=out_dir,
                                      executor=self.executor, compiler=options.compiler)
        except Exception as exc:  # e.g. no /dev/shm for the pool's queues: the worker compiles, as ever
            log(f"compile-ahead off: {type(exc).__name__}: {exc}")
            return
        log(f"compiling {len(upcoming)} configurations ahead for sm {arch} in {options.workers} processes")

    def where(self) -> str:
        """Where the batch stands, for the message of a batch that stopped early."""
        text = f"after {len(self.log.answers)} of {len(self.trials)} configurations"
        if self.current is None:
            return text
        phase = read_progress(self.worker.progress_file)[0] if self.worker and self.measuring else None
        return text + f", while on #{self.current.index}" + (f" in phase {phase}" if phase else "")

    def close(self) -> None:
        if self.worker is not None:
            self.worker.stop()
        if self.executor is not None:
            stop_executor(self.executor)


def run_batch(batch: Batch, log_path: Path, *, python: str = sys.executable, worker_module: str | None = None,
              extra_env: Mapping[str, str] | None = None, ahead: AheadOptions | None = None) -> BatchResult:
    """Answer the batch's configurations, streaming them into ``log_path``; the final
    document's ``exit_code`` is the container's. ``ahead``: compile-ahead (None: off)."""
    batch_log = BatchLog(log_path, (entry.index for entry in batch.entries))
    batch_log.start()
    env = dict(os.environ) | dict(extra_env or {}) | {TRIAL_ENV: batch.to_env()}
    cmd = [python, "-m", worker_module or BATCH_WORKER_MODULE]
    with tempfile.TemporaryDirectory(prefix="fleettune-") as tmp, StopSignals() as signals:
        supervisor = _Supervisor(batch, batch_log, Path(tmp), cmd, env, ahead)
        try:
            error = supervisor.run()
            signals.disarm()
        except Terminated as exc:
            # Eviction, drain or the Job's deadline: what is done is kept, the rest retried.
            error = f"terminated by {exc} {supervisor.where()}"
        except Exception as exc:  # a fault of this program must not lose the answers given
            signals.disarm()
            error = short(f"internal error of the batch supervisor {supervisor.where()}: {type(exc).__name__}: {exc}")
        supervisor.close()
        return batch_log.finish(error)


def run_in_process(batch: Batch, log_path: Path) -> BatchResult:
    """The configurations one after the other in this process: no watchdog, no compile-ahead (debugging)."""
    from fleettune_job.runner import run_trial

    batch_log = BatchLog(log_path, (entry.index for entry in batch.entries))
    for trial in batch.trials():
        result = run_trial(trial)
        if not batch_log.fingerprint.product:
            batch_log.fingerprint = result.fingerprint
        batch_log.record(trial.index, result)
    return batch_log.finish()
