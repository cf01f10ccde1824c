"""Fixtures of the integration tier: a real control plane with a simulated GPU fleet.

* ``cluster`` (session): a :class:`LocalCluster` (etcd, kube-apiserver, controller-manager,
  scheduler, kwok) in a temporary state dir with the demo fleet's nodes, started once per
  test session and stopped at its end. The control-plane binaries are built before the
  first test if they are not cached (about 15 minutes on 2 cores, 20-30 under load, progress on stderr).
* ``namespace`` (function): a fresh namespace, deleted after the test.
* ``simulator`` (function): a running :class:`FleetSimulator` answering trial Pods.
* ``api_client`` (session): a kubernetes ``ApiClient`` for the cluster.
* ``kueue`` (module): the real Kueue manager (built from the Go module proxy like the
  control plane) running against the cluster, with its webhooks (docs/operations/multikueue.md).
* ``crd`` (module): the TuningRun CRD installed; ``operator`` (function): the real
  operator in a subprocess watching the test's namespace, authenticated as the Helm
  chart's ServiceAccount with the chart's RBAC (tests may SIGKILL and restart it).
"""

from __future__ import annotations

import re
import shutil
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from fleettune_dev.cluster import LocalCluster, default_fleet
from fleettune_dev.sim import FleetSimulator

# Trials take ~0.25 s of wall time in tests (compile 0.85 s + runs, × 0.3).
TEST_TIME_SCALE = 0.3

_build_error: str | None = None


def _progress(msg: str) -> None:
    # sys.__stderr__: shown even while pytest captures the output of tests and fixtures.
    stream = sys.__stderr__ or sys.stderr
    stream.write(f"[fleettune cluster] {msg}\n")
    stream.flush()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build missing binaries before the first test, outside any per-test timeout."""
    global _build_error
    if not any(item.get_closest_marker("integration") for item in session.items):
        return
    if shutil.which("go") is None:
        _build_error = "skip: the Go toolchain is needed to build the control plane"
        return
    from fleettune_dev.cluster.binaries import ensure_binaries

    try:
        ensure_binaries(_progress)
    except Exception as exc:  # reported by the `cluster` fixture, test by test
        _build_error = f"building the control-plane binaries failed: {exc}"
    if any("kueue" in getattr(item, "fixturenames", ()) for item in session.items):
        from fleettune_dev.cluster.binaries import ensure_kueue

        try:
            ensure_kueue(_progress)
        except Exception as exc:  # the `kueue` fixture tries again and reports it
            _progress(f"building Kueue failed: {exc}")


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    if _build_error is not None:
        if _build_error.startswith("skip: "):
            pytest.skip(_build_error.removeprefix("skip: "))
        pytest.fail(_build_error, pytrace=False)
    c = LocalCluster(tmp_path_factory.mktemp("cluster"), default_fleet(), die_with_parent=True)
    with c.session(_progress):
        yield c


@pytest.fixture(scope="session")
def api_client(cluster: LocalCluster) -> Iterator[Any]:
    client = cluster.api_client()
    yield client
    client.close()


@pytest.fixture
def namespace(cluster: LocalCluster, api_client: Any, request: pytest.FixtureRequest) -> Iterator[str]:
    from kubernetes import client

    stem = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"{stem}-{uuid.uuid4().hex[:6]}"
    core = client.CoreV1Api(api_client)
    core.create_namespace({"metadata": {"name": name, "labels": {"fleettune.dev/test": "true"}}})
    yield name
    # The namespace controller finalises it (and everything in it) in the background.
    try:
        core.delete_namespace(name)
    except client.ApiException as exc:
        if exc.status != 404:
            raise


@pytest.fixture(scope="module")
def kueue(cluster: LocalCluster) -> Iterator[Any]:
    """Kueue's manager on the session's cluster, for one test module (its webhooks see every
    Job created while it runs); its CRDs stay, its objects and webhooks go at the end."""
    if shutil.which("go") is None:
        pytest.skip("the Go toolchain is needed to build Kueue")
    from fleettune_dev.cluster.binaries import ensure_kueue
    from fleettune_dev.cluster.kueue import KueueManager

    try:
        ensure_kueue()  # built by the collection hook; cached
    except Exception as exc:
        pytest.fail(f"building Kueue failed: {exc}", pytrace=False)
    manager = KueueManager(cluster).start()
    _progress(f"kueue ready in {manager.startup_s:.1f}s")
    yield manager
    try:
        manager.delete_all()  # the tests delete their Jobs first
    finally:
        manager.stop()


@pytest.fixture(scope="module")
def crd(cluster: LocalCluster) -> None:
    """The TuningRun CRD, generated from the models, installed for real."""
    from operator_support import install_crd

    install_crd(cluster)


@pytest.fixture
def operator(cluster: LocalCluster, crd: None, namespace: str, tmp_path: Any) -> Iterator[Any]:
    """The real operator in a subprocess, watching the test's namespace, with only the
    chart's ServiceAccount and RBAC (no admin credential)."""
    from operator_support import ChartIdentity, OperatorProcess

    identity = ChartIdentity(cluster, namespace, tmp_path)
    proc = OperatorProcess(identity.kubeconfig, namespace, tmp_path)
    proc.start()
    yield proc
    proc.stop()
    identity.remove()


@pytest.fixture
def simulator(cluster: LocalCluster) -> Iterator[FleetSimulator]:
    sim = FleetSimulator(cluster.kubeconfig, cluster.fleet, time_scale=TEST_TIME_SCALE).start()
    yield sim
    sim.stop()
