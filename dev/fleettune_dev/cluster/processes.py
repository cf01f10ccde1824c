"""Start, find and stop the control plane's processes.

Each component runs in its own session (so its own process group) and is recorded in a
small JSON pid file in the state directory. The record carries the kernel's start time of
the process, so a pid reused by an unrelated program after a reboot or crash is never
mistaken for ours (and never signalled).
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class ProcessRecord:
    name: str
    pid: int
    start_ticks: int
    argv: list[str]

    def to_json(self) -> str:
        return json.dumps({"name": self.name, "pid": self.pid, "start_ticks": self.start_ticks,
                           "argv": self.argv})

    @classmethod
    def from_json(cls, text: str) -> ProcessRecord:
        raw = json.loads(text)
        return cls(name=raw["name"], pid=int(raw["pid"]), start_ticks=int(raw["start_ticks"]),
                   argv=list(raw["argv"]))


def _stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks) of a process, or None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = text[text.rindex(")") + 2:].split()
    return fields[0], int(fields[19])


def _reap(pid: int) -> None:
    # Only possible when we are the parent (the same Python process ran `up`); otherwise
    # init reaps it. An unreaped child would stay a zombie and look alive to kill(pid, 0).
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def is_alive(rec: ProcessRecord) -> bool:
    _reap(rec.pid)
    st = _stat(rec.pid)
    return st is not None and st[0] not in ("Z", "X") and st[1] == rec.start_ticks


def group_members(pgid: int) -> list[int]:
    """Live processes (not zombies) of a process group."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2:].split()
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: ask the kernel to SIGTERM it when the
    # thread that started it exits, so a crashed test session leaves nothing behind.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def start(name: str, argv: list[str], *, log: Path, pid_dir: Path, cwd: Path,
          env: dict[str, str] | None = None, die_with_parent: bool = False) -> ProcessRecord:
    log.parent.mkdir(parents=True, exist_ok=True)
    pid_dir.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        out.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(argv)}\n".encode())
        out.flush()
        proc = subprocess.Popen(
            argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=_die_with_parent if die_with_parent else None,
        )
    st = _stat(proc.pid)
    rec = ProcessRecord(name=name, pid=proc.pid, start_ticks=st[1] if st else 0, argv=argv)
    (pid_dir / f"{name}.json").write_text(rec.to_json())
    return rec


def load(pid_dir: Path, name: str) -> ProcessRecord | None:
    try:
        return ProcessRecord.from_json((pid_dir / f"{name}.json").read_text())
    except (FileNotFoundError, ValueError, KeyError):
        return None


def stop(rec: ProcessRecord, *, pid_dir: Path | None = None, timeout: float = 10.0) -> None:
    """SIGTERM the component's process group, SIGKILL what is left after ``timeout``."""
    if is_alive(rec):
        pgid = rec.pid  # start_new_session made it the leader of its own group
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            _reap(rec.pid)
            if not group_members(pgid):
                break
            time.sleep(0.1)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            deadline = time.monotonic() + 5
            while group_members(pgid) and time.monotonic() < deadline:
                _reap(rec.pid)
                time.sleep(0.05)
        _reap(rec.pid)
    if pid_dir is not None:
        (pid_dir / f"{rec.name}.json").unlink(missing_ok=True)


def kill(rec: ProcessRecord) -> None:
    """SIGKILL without a grace period: simulates a crash (used by restart tests)."""
    if is_alive(rec):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(rec.pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while group_members(rec.pid) and time.monotonic() < deadline:
            _reap(rec.pid)
            time.sleep(0.05)
        _reap(rec.pid)


def find(predicate: Callable[[list[str]], bool]) -> list[int]:
    """Pids of live processes whose argv satisfies ``predicate`` (never this process)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
        except OSError:
            continue
        st = _stat(int(entry.name))
        if st is not None and st[0] not in ("Z", "X") and predicate(argv):
            found.append(int(entry.name))
    return found


def names_path(text: str, root: str) -> bool:
    """Whether ``text`` (an argument, an environment value such as ``KUBECONFIG=a:b``)
    names ``root`` or a path under it: ``/s/default`` is not ``/s/default2``."""
    start = 0
    while (i := text.find(root, start)) >= 0:
        end = i + len(root)
        if (i == 0 or text[i - 1] in "=:, ") and (end == len(text) or text[end] in "/:, "):
            return True
        start = i + 1
    return False


def is_fleettune_program(argv: Sequence[str]) -> bool:
    """The `fleettune` (or kopf) command or module: ``fleettune operator`` runs as
    ``python …/bin/fleettune operator``, the demo's services as ``python -m fleettune.cli``."""
    if any(Path(a).name in ("fleettune", "kopf") for a in argv[:2]):
        return True
    return any(a == "-m" and b.split(".")[0] in ("fleettune", "kopf") for a, b in itertools.pairwise(argv))


def _environ(pid: int) -> list[str]:
    try:
        return (Path(f"/proc/{pid}") / "environ").read_bytes().decode(errors="replace").split("\0")
    except OSError:  # gone, or another user's
        return []


def _ancestors() -> set[int]:
    """This process and those it descends from (a shell that ran `cluster down` with the
    state directory in its arguments must survive it)."""
    out, pid = set(), os.getpid()
    while pid > 1 and pid not in out:
        out.add(pid)
        try:
            text = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(text[text.rindex(")") + 2:].split()[1])
    return out


def started_against(root: Path, ours: Callable[[list[str]], bool]) -> list[int]:
    """Live processes started against the directory ``root``: programs that are ``ours``
    whose arguments or environment (``KUBECONFIG=<root>/kubeconfig``) name it. Others —
    the user's shell that exported that KUBECONFIG, an editor or `tail -f` on a log there
    — are never chosen, nor is this process or any of its ancestors."""
    where, mine = str(root), _ancestors()
    found = []
    for pid in find(ours):
        if pid in mine:
            continue
        try:
            argv = (Path(f"/proc/{pid}") / "cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
        except OSError:
            continue
        if any(names_path(a, where) for a in argv) or any(names_path(v, where) for v in _environ(pid)):
            found.append(pid)
    return found


def terminate_all(pids: Iterable[int], timeout: float = 10.0) -> None:
    """SIGTERM each process (not its group: one a user started may share the user's), then
    SIGKILL those still there after ``timeout``."""
    recs = [ProcessRecord("pid", pid, st[1], []) for pid in pids if (st := _stat(pid)) is not None]
    for rec in recs:
        with contextlib.suppress(ProcessLookupError):
            os.kill(rec.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while any(is_alive(r) for r in recs) and time.monotonic() < deadline:
        time.sleep(0.1)
    for rec in recs:
        if is_alive(rec):
            with contextlib.suppress(ProcessLookupError):
                os.kill(rec.pid, signal.SIGKILL)


def terminate_pid(pid: int, timeout: float = 5.0) -> None:
    """SIGTERM one process, SIGKILL it if it is still there after ``timeout``."""
    st = _stat(pid)
    if st is None:
        return
    rec = ProcessRecord("pid", pid, st[1], [])
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while is_alive(rec) and time.monotonic() < deadline:
        time.sleep(0.1)
    if is_alive(rec):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
