"""Services kept with the local cluster, and the build's output (no control plane needed)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fleettune_dev.cluster import LocalCluster, binaries, processes

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="uses /proc")


def test_services_outlive_their_starter_and_cluster_down_stops_them(tmp_path):
    cluster = LocalCluster(tmp_path / "state")
    cluster.state_dir.mkdir()
    rec, started = cluster.start_service("simulator", ["sh", "-c", "echo answering; sleep 60"])
    assert started and processes.is_alive(rec)
    again, started = cluster.start_service("simulator", ["sleep", "60"])
    assert again == rec and not started, "a running service is not started twice"
    op, _ = cluster.start_service("operator", ["sleep", "60"])
    assert set(cluster.services()) == {"simulator", "operator"}
    st = cluster.status()
    assert st["services"]["operator"] == {"running": True, "pid": op.pid, "log": str(cluster.logs_dir / "operator.log")}
    assert all(not c["running"] for c in st["components"].values())
    with pytest.raises(ValueError, match="component"):
        cluster.start_service("etcd", ["sleep", "1"])
    cluster.down()
    assert not processes.is_alive(rec) and not processes.is_alive(op)
    assert not cluster.state_dir.exists()


def _fake_fleettune(tmp_path):
    """A `fleettune` entry point as pip installs it (a script run by the venv's Python) that
    only waits: what `ps` shows of `fleettune operator` started by hand. It says `ready` once
    its interpreter runs: before that, its command line may still be a launcher's."""
    script = tmp_path / "bin" / "fleettune"
    script.parent.mkdir(exist_ok=True)
    script.write_text(f"#!{sys.executable}\nimport time\nprint('ready', flush=True)\ntime.sleep(120)\n")
    script.chmod(0o755)
    return script


def _spawn(argv, env):
    """Start a program in its own session; for the fake `fleettune`, wait until it runs."""
    proc = subprocess.Popen(argv, env=env, start_new_session=True, stdout=subprocess.PIPE, text=True)
    if any(Path(a).name == "fleettune" for a in argv[:2]):
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc


def _record(proc):
    st = processes._stat(proc.pid)
    assert st is not None
    return processes.ProcessRecord("p", proc.pid, st[1], [])


def test_cluster_down_stops_an_operator_restarted_by_hand_and_nothing_else(tmp_path):
    cluster = LocalCluster(tmp_path / "state")
    cluster.state_dir.mkdir()
    fleettune = _fake_fleettune(tmp_path)
    ours = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    other = {**os.environ, "KUBECONFIG": str(tmp_path / "state2" / "kubeconfig")}  # another cluster's
    started = []

    def spawn(argv, env):
        started.append(_spawn(argv, env))
        return _record(started[-1])

    try:
        service, _ = cluster.start_service("operator", ["sleep", "60"])  # the demo's, with its pid file
        # As README/`demo --keep` say: `export KUBECONFIG=…; fleettune operator` after stopping it.
        by_hand = spawn([str(fleettune), "operator", "--all-namespaces"], ours)
        by_flag = spawn([sys.executable, str(fleettune), "simulate", "--kubeconfig", str(cluster.kubeconfig)],
                        os.environ)
        shell = spawn(["sleep", "120"], ours)  # the user's shell that exported KUBECONFIG: not a fleettune program
        elsewhere = spawn([str(fleettune), "operator"], other)
        cluster.down()
        assert not any(processes.is_alive(r) for r in (service, by_hand, by_flag))
        assert processes.is_alive(shell) and processes.is_alive(elsewhere)
        assert not cluster.state_dir.exists()
    finally:
        for proc in started:
            proc.kill()
            proc.wait()


def test_cluster_down_without_a_state_dir_still_stops_what_was_left(tmp_path, capsys):
    from fleettune_dev.cluster.cli import main

    state = tmp_path / "gone"
    fleettune = _fake_fleettune(tmp_path)
    proc = _spawn([str(fleettune), "operator"], {**os.environ, "KUBECONFIG": str(state / "kubeconfig")})
    try:
        rec = _record(proc)
        assert main(["down", "--state-dir", str(state)]) == 0
        assert not processes.is_alive(rec)
        assert capsys.readouterr().out == (f"no cluster in {state}; stopped 1 process(es) started against it "
                                           f"(pids {proc.pid})\n")
    finally:
        proc.kill()
        proc.wait()


def test_paths_are_named_whole_and_fleettune_programs_recognised():
    root = "/c/default"
    assert processes.names_path("KUBECONFIG=/c/default/kubeconfig", root)
    assert processes.names_path("--data-dir=/c/default/etcd", root) and processes.names_path("/c/default", root)
    assert processes.names_path("KUBECONFIG=/x/config:/c/default/kubeconfig", root)
    assert not processes.names_path("KUBECONFIG=/c/default2/kubeconfig", root)
    assert not processes.names_path("/b/c/default/kubeconfig", root)
    assert processes.is_fleettune_program(["/v/bin/python", "/v/bin/fleettune", "operator"])
    assert processes.is_fleettune_program(["/v/bin/python3", "-m", "fleettune.cli", "operator"])
    assert not processes.is_fleettune_program(["/bin/bash"])
    assert not processes.is_fleettune_program(["python", "-m", "pytest", "/w/fleettune"])


def test_the_build_says_little_and_logs_everything(tmp_path, monkeypatch):
    monkeypatch.setattr(binaries, "_go_env", lambda: dict(os.environ))
    said: list[str] = []
    log = tmp_path / "build.log"
    script = "print('go: downloading k8s.io/api v0.34.10'); print('k8s.io/api/core/v1')"
    binaries._run([sys.executable, "-c", script], tmp_path, said.append, "kubernetes", log)
    assert said == []
    assert "go: downloading k8s.io/api v0.34.10" in log.read_text()
    monkeypatch.setattr(binaries, "HEARTBEAT_S", 0.0)
    binaries._run([sys.executable, "-c", script], tmp_path, said.append, "kubernetes", log)
    assert said[-1].startswith("kubernetes: still building (1 modules downloaded, 1 packages compiled")
    with pytest.raises(RuntimeError) as failed:
        binaries._run([sys.executable, "-c", "print('go: k8s.io/x: 404 Not Found'); raise SystemExit(1)"],
                      tmp_path, said.append, "kubernetes", log)
    text = str(failed.value)
    assert "exit code 1" in text and "404 Not Found" in text and text.endswith(f"full log: {log}")


def test_two_callers_needing_one_tool_build_it_once(tmp_path, monkeypatch):
    """`make test`'s two workers both ask for every cached tool before their first test."""
    monkeypatch.setenv("FLEETTUNE_CACHE", str(tmp_path))
    out, builds, said = tmp_path / "tool", [], []
    building = threading.Event()

    @binaries.exclusive("tool")
    def ensure(progress=None):
        if out.exists():
            return out
        building.set()
        builds.append(threading.get_ident())
        time.sleep(0.3)  # the other caller arrives while this one builds
        out.write_text("built")
        return out

    first = threading.Thread(target=ensure)
    first.start()
    assert building.wait(10)
    assert ensure(said.append) == out  # waits for the first, then finds the tool built
    first.join()
    assert len(builds) == 1
    assert said == ["waiting for another process to finish building tool"]
    assert (tmp_path / "locks" / "tool.lock").exists()
