"""Loopback ports and the one non-loopback address the apiserver insists on."""

from __future__ import annotations

import contextlib
import itertools
import socket
import time
from pathlib import Path

# TEST-NET-1 (RFC 5737): never routed, so using it can reach nothing by accident.
_FALLBACK_ADVERTISE = "192.0.2.1"


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def wait_port_free(port: int, timeout: float = 15.0) -> bool:
    """Whether ``port`` can be bound within ``timeout``.

    After a crash the dead component's accepted connections linger on its port in
    FIN-WAIT for a moment (their peers died with it); they block the bind but clear
    by themselves, unlike a process that really listens there.
    """
    deadline = time.monotonic() + timeout
    while not port_is_free(port):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def _local_ipv4_addresses() -> list[str]:
    """IPv4 addresses assigned to this host's interfaces (from /proc, no `ip` needed)."""
    addrs: list[str] = []
    with contextlib.suppress(OSError):
        lines = Path("/proc/net/fib_trie").read_text().splitlines()
        for prev, line in itertools.pairwise(lines):
            if "/32 host LOCAL" in line:
                addr = prev.split()[-1]
                if addr not in addrs:
                    addrs.append(addr)
    return addrs


def advertise_address() -> str:
    """A non-loopback address for kube-apiserver's ``--advertise-address``.

    The apiserver only writes it into the `kubernetes` Service's endpoints (it listens on
    127.0.0.1 regardless), but it refuses loopback and, given no address, exits when the
    host has no default route. Prefer a real address of this host; else a TEST-NET one.
    """
    for addr in _local_ipv4_addresses():
        if not addr.startswith("127.") and not addr.startswith("169.254."):
            return addr
    return _FALLBACK_ADVERTISE
