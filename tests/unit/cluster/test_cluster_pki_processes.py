"""Certificates and process handling of the local cluster (no control plane needed)."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time

import pytest

from fleettune_dev.cluster import processes
from fleettune_dev.cluster.network import advertise_address, free_port, port_is_free, wait_port_free
from fleettune_dev.cluster.pki import ensure_pki

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="uses /proc")


def _openssl(*args: str) -> str:
    return subprocess.run(["openssl", *args], capture_output=True, text=True, check=True).stdout


def test_pki_certificates_verify_and_name_the_apiserver(tmp_path):
    pki = ensure_pki(tmp_path / "pki")
    assert pki.complete()
    for crt in (pki.apiserver_crt, pki.admin_crt):
        assert ": OK" in _openssl("verify", "-CAfile", str(pki.ca_crt), str(crt))
    text = _openssl("x509", "-in", str(pki.apiserver_crt), "-noout", "-text")
    assert "IP Address:127.0.0.1" in text and "DNS:kubernetes.default.svc" in text
    subject = _openssl("x509", "-in", str(pki.admin_crt), "-noout", "-subject")
    assert "system:masters" in subject
    assert oct(pki.ca_key.stat().st_mode & 0o777) == "0o600"
    # Idempotent: a second call keeps the same CA.
    before = pki.ca_crt.read_bytes()
    assert ensure_pki(tmp_path / "pki").ca_crt.read_bytes() == before


def test_started_process_group_is_stopped_entirely(tmp_path):
    # A shell with a child: stopping the component must take the child with it.
    rec = processes.start("sleeper", ["sh", "-c", "sleep 60 & sleep 60; wait"], log=tmp_path / "log",
                          pid_dir=tmp_path / "pids", cwd=tmp_path)
    assert processes.is_alive(rec)
    assert processes.load(tmp_path / "pids", "sleeper") == rec
    deadline = time.monotonic() + 5
    while len(processes.group_members(rec.pid)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(processes.group_members(rec.pid)) == 3
    processes.stop(rec, pid_dir=tmp_path / "pids", timeout=5)
    assert not processes.is_alive(rec)
    assert processes.group_members(rec.pid) == []
    assert processes.load(tmp_path / "pids", "sleeper") is None


def test_a_reused_pid_is_not_mistaken_for_ours(tmp_path):
    rec = processes.start("s", ["sleep", "60"], log=tmp_path / "log", pid_dir=tmp_path / "p", cwd=tmp_path)
    try:
        fake = processes.ProcessRecord(rec.name, rec.pid, rec.start_ticks + 1, rec.argv)
        assert not processes.is_alive(fake)
        processes.stop(fake)  # must not signal the live process
        assert processes.is_alive(rec)
    finally:
        processes.kill(rec)
    assert not processes.is_alive(rec)


def test_ports_and_advertise_address():
    port = free_port()
    assert 1024 < port < 65536 and port_is_free(port)
    addr = advertise_address()
    assert not addr.startswith("127.")
    assert addr.count(".") == 3


def test_wait_port_free_waits_for_a_port_to_clear_but_not_for_a_listener():
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    t0 = time.monotonic()
    assert not wait_port_free(port, timeout=0.5)
    assert time.monotonic() - t0 >= 0.5
    threading.Timer(0.3, listener.close).start()
    assert wait_port_free(port, timeout=5)
