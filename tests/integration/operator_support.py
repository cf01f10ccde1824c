"""Helpers for tests that run the real operator against the local control plane."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from fleettune import GROUP, PLURAL, VERSION
from fleettune.crd import render
from fleettune.labels import RESULTS_OF_LABEL
from fleettune.names import label_value
from fleettune.store import DATA_KEY, decode_shard
from fleettune_dev.cluster.network import free_port

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "convolution-fleet.yaml"
CHART = ROOT / "charts" / "fleettune"


class ChartIdentity:
    """The chart's ServiceAccount and least-privilege RBAC for the watched namespaces (the
    first is the operator's own), and a kubeconfig that authenticates as that ServiceAccount:
    the operator under test gets exactly what a Helm install would give it, never the admin
    credential."""

    def __init__(self, cluster: Any, namespace: str, workdir: Path, *also: str) -> None:
        from fleettune_dev.cluster.binaries import ensure_helm

        self.cluster = cluster
        rendered = subprocess.run(
            [str(ensure_helm()), "template", "ft", str(CHART), "-n", namespace,
             "--set", f"watchNamespaces={{{','.join([namespace, *also])}}}",
             "--show-only", "templates/serviceaccount.yaml", "--show-only", "templates/rbac.yaml"],
            capture_output=True, text=True, check=True,
        ).stdout
        self.manifests = workdir / f"rbac-{namespace}.yaml"
        self.manifests.write_text(rendered)
        cluster.kubectl("apply", "-f", str(self.manifests))
        account = next(d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "ServiceAccount")
        token = cluster.kubectl(
            "create", "token", account["metadata"]["name"], "-n", namespace, "--duration=4h"
        ).stdout.strip()
        config = yaml.safe_load(Path(cluster.kubeconfig).read_text())
        for user in config["users"]:
            user["user"] = {"token": token}
        self.kubeconfig = workdir / f"kubeconfig-{namespace}-operator"
        self.kubeconfig.write_text(yaml.safe_dump(config))
        self.kubeconfig.chmod(0o600)

    def remove(self) -> None:
        # The ClusterRole and its binding outlive the namespace: delete them explicitly.
        self.cluster.kubectl("delete", "-f", str(self.manifests), "--ignore-not-found", "--wait=false", check=False)


def install_crd(cluster: Any) -> None:
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=render())
    cluster.wait_established(f"{PLURAL}.{GROUP}")


class OperatorProcess:
    """The real operator in a subprocess, so a test can SIGKILL it and start another."""

    def __init__(self, kubeconfig: Path, namespace: str, log_dir: Path, env: dict[str, str] | None = None,
                 also: tuple[str, ...] = ()) -> None:
        """``env``: extra environment of the operator (its configuration, e.g. the trial
        policy's FLEETTUNE_ALLOW_PRIVILEGED_TRIALS / FLEETTUNE_ALLOWED_IMAGES); ``also``:
        more namespaces it watches."""
        self.kubeconfig, self.namespace, self.log_dir, self.also = kubeconfig, namespace, log_dir, also
        self.env = dict(env or {})
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.metrics_port = free_port()

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def start(self) -> None:
        self.starts += 1
        # The child writes to its own copy of the descriptor: the test's is closed at once.
        with open(self.log_dir / f"operator-{self.namespace}-{self.starts}.log", "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "fleettune.cli", "operator",
                 *(arg for ns in (self.namespace, *self.also) for arg in ("--namespace", ns)),
                 "--metrics-port", str(self.metrics_port), "--metrics-address", "127.0.0.1"],
                # TMPDIR: the kubernetes client's copy of the CA certificate, left behind by a kill.
                env={**os.environ, **self.env, "KUBECONFIG": str(self.kubeconfig), "PYTHONPATH": _pythonpath(),
                     "TMPDIR": str(self.log_dir)},
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()

    def logs(self) -> str:
        logs = sorted(self.log_dir.glob(f"operator-{self.namespace}-*"))
        return "\n".join(p.read_text(errors="replace") for p in logs)


def _pythonpath() -> str:
    return os.pathsep.join([str(ROOT / "operator"), str(ROOT / "job_image"), os.environ.get("PYTHONPATH", "")])


def example(name: str, **budget: int) -> dict[str, Any]:
    doc = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text()))
    doc["metadata"] = {"name": name}
    doc["spec"]["budget"].update(budget)
    return doc


def apply(cluster: Any, namespace: str, doc: dict[str, Any], *extra: str) -> subprocess.CompletedProcess[str]:
    # JSON, not YAML: PyYAML writes a string such as "659e18" (a random suffix) bare, and
    # kubectl's YAML 1.2 reader takes it for a number.
    return cluster.kubectl("apply", "-n", namespace, "-f", "-", *extra, check=False, input=json.dumps(doc))


def get_run(cluster: Any, namespace: str, name: str) -> dict[str, Any]:
    out = cluster.kubectl("get", "-n", namespace, f"{PLURAL}.{VERSION}.{GROUP}", name, "-o", "json")
    return json.loads(out.stdout)


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 1.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def wait_phase(cluster: Any, namespace: str, name: str, timeout: float, operator: OperatorProcess) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        assert operator.proc is None or operator.proc.poll() is None, "operator died:\n" + operator.logs()[-4000:]
        run = get_run(cluster, namespace, name)
        return run if (run.get("status") or {}).get("phase") in ("Succeeded", "Failed") else None

    try:
        return wait_for(done, timeout, f"{name} to finish")
    except AssertionError:
        print(operator.logs()[-6000:])
        raise


def stored_records(cluster: Any, namespace: str, run: str) -> list[Any]:
    selector = f"{RESULTS_OF_LABEL}={label_value(run)}"
    out = cluster.kubectl("get", "configmaps", "-n", namespace, "-l", selector, "-o", "json")
    records = []
    for cm in json.loads(out.stdout)["items"]:
        records += decode_shard(cm["binaryData"][DATA_KEY])
    return records


def jobs(cluster: Any, namespace: str, run: str) -> list[dict[str, Any]]:
    out = cluster.kubectl("get", "jobs", "-n", namespace, "-l", f"{GROUP}/run={label_value(run)}", "-o", "json")
    return json.loads(out.stdout)["items"]
