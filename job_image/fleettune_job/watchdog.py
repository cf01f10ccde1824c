"""The batch supervisor's watchdog: the verdicts on a worker that hung or died, the
progress file it keeps, and the signals that end a Pod.

A worker keeps a small progress file (phase and device fingerprint) up to date, so that a
supervisor that has to kill it can still say where it hung and on which GPU. A hang
before the kernel exists or in a user kernel's reference is the node's or the run's
problem, never the configuration's: those phases give ``infra_error``, the others
``timeout``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from pathlib import Path
from types import FrameType
from typing import Any

from pydantic import ValidationError

from fleettune_job.classify import Phase, short
from fleettune_job.protocol import Fingerprint, Outcome, TrialResult

# Time the worker gets to exit after SIGKILL before we stop waiting for it.
REAP_TIMEOUT_S = 10.0
# Phases before the kernel exists, and the reference's run: a timeout there is not the
# configuration's fault.
INFRA_PHASES = frozenset({Phase.DEVICE, Phase.SETUP, Phase.ALLOCATE, Phase.REFERENCE})


# A configuration's timeout covers compiling, launching, running, verifying and timing it
# (the TuningRun's `trialTimeoutSeconds`), not the worker's start: while a worker is still
# finding the GPU or setting up (which includes compiling the verification kernels, under
# a second on an H200; seconds where cupy's array code must verify), its deadline moves on,
# for at most SETUP_LIMIT_S.
START_PHASES = frozenset({Phase.DEVICE, Phase.SETUP})
SETUP_LIMIT_S = 60.0
POLL_S = 0.2  # how often a supervisor reads the progress file while it waits


class Deadline:
    """When a worker that started at ``started`` is out of time for its configuration, by
    the phase in its progress file."""

    def __init__(self, started: float, timeout_s: float, progress_file: Path) -> None:
        self.started, self.timeout_s, self.progress_file = started, timeout_s, progress_file
        self.at = started + timeout_s

    def update(self, now: float) -> float:
        """The deadline, moved on while the worker is still starting."""
        if read_progress(self.progress_file)[0] in START_PHASES and now - self.started < SETUP_LIMIT_S:
            self.at = max(self.at, now + self.timeout_s)
        return self.at


class Terminated(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class StopSignals:
    """While active, the first SIGTERM (eviction, drain, the Job's deadline) or SIGINT raises
    :class:`Terminated`; later ones are ignored, so that writing what is done cannot be cut
    short by a second signal. ``disarm`` ignores them from then on."""

    def __init__(self) -> None:
        self.armed = True
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        self._previous = {s: signal.signal(s, self._handle) for s in (signal.SIGTERM, signal.SIGINT)}
        return self

    def __exit__(self, *exc_info: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def disarm(self) -> None:
        self.armed = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.armed:
            self.armed = False
            raise Terminated(signum)


def atomic_write(path: Path, text: str) -> None:
    # A reader never sees a half-written file, even if we are killed mid-write.
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_progress(path: Path, phase: Phase, fingerprint: Fingerprint) -> None:
    doc = {"phase": str(phase), "fingerprint": fingerprint.model_dump(exclude_none=True)}
    atomic_write(path, json.dumps(doc))


def read_progress(path: Path) -> tuple[Phase | None, Fingerprint]:
    try:
        raw = json.loads(path.read_text())
        return Phase(raw["phase"]), Fingerprint.model_validate(raw.get("fingerprint", {}))
    except (OSError, ValueError, KeyError, TypeError, ValidationError):
        return None, Fingerprint()


def _where(phase: Phase | None, word: str = "in") -> str:
    return f" {word} phase {phase}" if phase else ""


def timeout_result(timeout_s: float, phase: Phase | None, fingerprint: Fingerprint) -> TrialResult:
    """The verdict on a worker killed at its deadline."""
    outcome = Outcome.INFRA_ERROR if phase in INFRA_PHASES or phase is None else Outcome.TIMEOUT
    return TrialResult(outcome=outcome, fingerprint=fingerprint,
                       error=f"no result within the {timeout_s:g} s timeout{_where(phase, 'while in')}; worker killed")


def death_result(returncode: int, phase: Phase | None, fingerprint: Fingerprint) -> TrialResult:
    """The verdict on a worker that ended without a result: the node's problem."""
    return TrialResult(outcome=Outcome.INFRA_ERROR, fingerprint=fingerprint,
                       error=short(f"worker {how_it_ended(returncode)}{_where(phase)} without a result"))


def how_it_ended(returncode: int) -> str:
    if returncode < 0:
        hint = " (out of memory?)" if returncode == -signal.SIGKILL else ""
        return f"killed by {signal.Signals(-returncode).name}{hint}"
    return f"exited with code {returncode}"


def kill(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.kill()
    # A process stuck in an uninterruptible driver call may not die: the container's exit reaps it.
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=REAP_TIMEOUT_S)
