"""A stand-in for the batch worker (``fleettune_job.batch_worker``), driven by environment
variables, for the batch supervisor's tests: it speaks the worker's pipe protocol and does
what ``FAKE_PLAN`` says for each configuration, without cupy or a GPU.

* ``FAKE_HELLO``: ``ok`` (default), ``nogpu``, ``die`` or ``hang``; ``FAKE_HELLO_ONCE`` names
  a marker file: only the first worker of a test starts, later ones find no GPU.
* ``FAKE_PLAN``: JSON ``{index: mode}``; modes ``ok`` (default), ``hang``, ``crash``, ``kill``,
  ``sticky`` (an illegal address), ``toomany`` (a refused launch), ``longerror``, ``exit_after``
  (answers, then ends), ``slow_setup`` (``FAKE_SETUP_S`` in the setup phase, then answers),
  ``garbage`` (a result that is not one).
* ``FAKE_PHASE``: the phase a hang is reported in (default ``run``).
* ``FAKE_LOG``: where each command is recorded, one JSON line: the worker's pid, the
  index, the cubins it was given, and the answers already in the termination log.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

FINGERPRINT = {"product": "Fake GPU", "compute_capability": "8.0"}
LIMITS = {"maxThreadsPerBlock": 1024, "sharedMemPerBlock": 49152, "regsPerBlock": 65536}
ILLEGAL_ADDRESS = "runtime error: CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered"
TOO_MANY = "launch error: CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: too many resources requested for launch"


def result(index: int, mode: str) -> dict[str, Any]:
    if mode == "sticky":
        return {"version": 1, "outcome": "runtime_error", "error": ILLEGAL_ADDRESS}
    if mode == "toomany":
        return {"version": 1, "outcome": "launch_error", "error": TOO_MANY}
    if mode == "longerror":
        return {"version": 1, "outcome": "correctness_error", "error": f"#{index} wrong: " + "x" * 2000,
                "compile_s": 0.5, "run_s": 0.25}
    return {"version": 1, "outcome": "ok", "objective": 1.0 + index / 100, "times": [1.0 + index / 100] * 7,
            "compile_s": 0.5, "run_s": 0.25}


def answers_in_log() -> int:
    try:
        return len(json.loads(Path(os.environ["FLEETTUNE_TERMINATION_LOG"]).read_text()).get("answers", []))
    except (OSError, KeyError, ValueError):
        return -1


def hello_mode() -> str:
    once = os.environ.get("FAKE_HELLO_ONCE")
    if once:
        if Path(once).exists():
            return "nogpu"
        Path(once).touch()
    return os.environ.get("FAKE_HELLO", "ok")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--progress-file", type=Path)
    parser.add_argument("--answer-fd", type=int)
    args = parser.parse_args()
    out = os.fdopen(args.answer_fd, "w")

    def send(doc: dict[str, Any]) -> None:
        out.write(json.dumps(doc) + "\n")
        out.flush()

    def progress(phase: str) -> None:
        args.progress_file.write_text(json.dumps({"phase": phase, "fingerprint": FINGERPRINT}))

    progress("device")
    mode = hello_mode()
    if mode == "nogpu":
        send({"error": "no GPU: no CUDA device is visible to this container"})
        return 0
    if mode == "die":
        return 4
    if mode == "hang":
        time.sleep(600)
    send({"hello": {"fingerprint": FINGERPRINT, "limits": LIMITS}})
    plan = {int(k): v for k, v in json.loads(os.environ.get("FAKE_PLAN", "{}")).items()}
    for line in sys.stdin:
        command = json.loads(line)
        index = command["index"]
        with open(os.environ["FAKE_LOG"], "a") as fh:
            fh.write(json.dumps({"pid": os.getpid(), "index": index, "cubins": command["cubins"],
                                 "cubin_bytes": [Path(path).read_bytes()[:4].decode(errors="replace")
                                                 for path, _ in command["cubins"].values()],
                                 "answers": answers_in_log(),
                                 "log_bytes": len(Path(os.environ["FLEETTUNE_TERMINATION_LOG"]).read_bytes())
                                 if Path(os.environ["FLEETTUNE_TERMINATION_LOG"]).exists() else 0}) + "\n")
        mode = plan.get(index, "ok")
        if mode == "slow_setup":  # a cold Pod's first configuration: cupy compiling its own kernels
            progress("setup")
            time.sleep(float(os.environ.get("FAKE_SETUP_S", "2")))
        progress(os.environ.get("FAKE_PHASE", "run") if mode == "hang" else "time")
        if mode == "hang":
            time.sleep(600)
        elif mode == "crash":
            return 3
        elif mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        send({"index": index, "result": "not json" if mode == "garbage" else json.dumps(result(index, mode))})
        if mode == "exit_after":
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
