"""The real Kueue manager (kubernetes-sigs/kueue) on a local control plane, as a plain process.

`KueueManager` installs Kueue's CRDs, writes a Kueue ``Configuration`` and runs the manager
built by `binaries.ensure_kueue` as a service of the `LocalCluster` (so ``fleettune cluster
down`` stops it), with the cluster's admin kubeconfig. A local apiserver has no kube-proxy,
so nothing can reach a Service: the webhook configurations and the CRDs' conversion webhooks
point at ``https://127.0.0.1:<port>/<path>`` instead, with a serving certificate for that
address.

Certificates. Kueue 0.15 cannot run with ``internalCertManagement.enable: false`` outside a
Pod: the manager then reads its metrics certificate from the fixed path
``/etc/kueue/metrics/certs`` (cmd/kueue/main.go) and exits when it is missing. So internal
cert management stays on, and is handed a certificate it accepts as is: the Secret it
manages (``kueue-webhook-server-cert``) is created beforehand with a CA named ``kueue-ca``
(an intermediate signed by the cluster's CA, the name cert-controller checks a CA against)
and a serving certificate from it for both the Service name cert-controller checks
(``kueue-webhook-service.kueue-system.svc``) and ``127.0.0.1``. Finding both valid,
cert-controller rotates nothing: it only writes the CA into the caBundle of the webhook
configurations and the conversion webhooks (the same CA this module put there), and the
metrics server serves a self-signed certificate of its own. The webhook server reads the
files of ``certDir``, which this module writes (a kubelet would mount the Secret there).

Disabled: the visibility on-demand API (feature gate ``VisibilityOnDemand``), an
aggregated API server on the fixed port 8082 that would need an APIService; and every job
integration but the configured ones (``batch/job`` by default): only their webhooks are
registered, so Pods, Deployments and StatefulSets of the cluster never pass through Kueue.

MultiKueue. Every port (webhook, health, metrics) is picked free at start and every file
lies under the cluster's state dir, so two `KueueManager` of two `LocalCluster` run side
by side on one host: `apply_multikueue` makes one the manager and the others its workers.
The manager reads each worker's admin kubeconfig (embedded certificates, a loopback
address: what Kueue's kubeconfig validation accepts) from its file (``locationType:
Path``; the manager is a host process) or from a Secret. Kueue's Job webhook sets a queued
Job's ``spec.managedBy: kueue.x-k8s.io/multikueue`` when its ClusterQueue has the
MultiKueue AdmissionCheck, so the manager cluster's Job controller makes no Pod for it;
Kueue copies it to a worker (``managedBy`` cleared), mirrors the worker Job's status back,
and deletes the copy once the manager's Job finished or is deleted.

The queues themselves (and the MultiKueue objects) are `fleettune_dev.cluster.queues`.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import yaml

from fleettune_dev.cluster import processes
from fleettune_dev.cluster.binaries import KUEUE_VERSION, ensure_kueue
from fleettune_dev.cluster.local import ClusterError, LocalCluster
from fleettune_dev.cluster.network import free_port
from fleettune_dev.cluster.pki import _openssl

Progress = Callable[[str], None]

SERVICE = "kueue"
NAMESPACE = "kueue-system"
API_GROUP = "kueue.x-k8s.io"
API_VERSION = f"{API_GROUP}/v1beta2"
QUEUE_LABEL = f"{API_GROUP}/queue-name"
PRIORITY_LABEL = f"{API_GROUP}/priority-class"
MULTIKUEUE_CONTROLLER = f"{API_GROUP}/multikueue"
# Kueue sets a manager's queued Job's spec.managedBy to this (feature
# MultiKueueBatchJobWithManagedBy, on by default in 0.15): the manager cluster's Job
# controller leaves the Job alone, and Kueue mirrors the worker's Job status into it.
MULTIKUEUE_MANAGED_BY = MULTIKUEUE_CONTROLLER
MULTIKUEUE_ORIGIN_LABEL = f"{API_GROUP}/multikueue-origin"
_MULTIKUEUE_KINDS = ("multikueueclusters", "multikueueconfigs", "admissionchecks")
# What Kueue's release kustomization (config/default) names things: namePrefix "kueue-".
WEBHOOK_SERVICE = "kueue-webhook-service"
WEBHOOK_SECRET = "kueue-webhook-server-cert"
WEBHOOK_CONFIGURATIONS = {
    "MutatingWebhookConfiguration": "kueue-mutating-webhook-configuration",
    "ValidatingWebhookConfiguration": "kueue-validating-webhook-configuration",
}
# The API group and resource of the built-in job integrations whose name is no group/kind.
_BUILTIN_FRAMEWORKS = {"pod": ("", "pods"), "deployment": ("apps", "deployments"),
                       "statefulset": ("apps", "statefulsets")}


def _quiet(_: str) -> None:
    pass


class KueueManager:
    """Kueue's manager on ``cluster``: `start` installs and starts it, `stop` stops it.

    ``frameworks`` are Kueue's ``integrations.frameworks`` (``batch/job``: plain Jobs);
    ``feature_gates`` are added to (and override) the ones this module sets.
    """

    def __init__(self, cluster: LocalCluster, *, frameworks: Iterable[str] = ("batch/job",),
                 feature_gates: dict[str, bool] | None = None, multikueue: dict[str, Any] | None = None,
                 progress: Progress | None = None) -> None:
        self.cluster = cluster
        self.frameworks = list(frameworks)
        self.feature_gates = {"VisibilityOnDemand": False, **(feature_gates or {})}
        # The Configuration's ``multiKueue`` block (gcInterval, origin, workerLostTimeout, ...).
        self.multikueue = dict(multikueue or {})
        self._say = progress or _quiet
        self.dir = cluster.state_dir / "kueue"
        self.ports: dict[str, int] = {}
        self.startup_s: float | None = None

    # ----------------------------------------------------------------- paths
    @property
    def config_file(self) -> Path:
        return self.dir / "config.yaml"

    @property
    def cert_dir(self) -> Path:
        return self.dir / "serving-certs"

    @property
    def log(self) -> Path:
        return self.cluster.logs_dir / f"{SERVICE}.log"

    @property
    def _pki(self) -> Path:
        return self.dir / "pki"

    def __enter__(self) -> KueueManager:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ----------------------------------------------------------------- lifecycle
    def start(self, timeout: float = 120.0) -> KueueManager:
        """Install the CRDs, start the manager, register its webhooks and wait until they
        answer. A manager already running for this cluster is replaced.

        The webhook configurations are registered once the manager is ready (before, they
        would reject every Job of the cluster), so its log has a few harmless "Webhook not
        found" errors of cert-controller from the start-up."""
        binary, manifests = ensure_kueue(self._say)
        t0 = time.monotonic()
        self.cluster.stop_services(SERVICE)
        self.dir.mkdir(parents=True, exist_ok=True)
        ports: set[int] = set()
        while len(ports) < 3:
            ports.add(free_port())
        self.ports = dict(zip(("webhook", "health", "metrics"), sorted(ports), strict=True))
        self._make_certs()
        self._install_crds(manifests)
        self._write_secret()
        self._write_config()
        argv = [str(binary), f"--config={self.config_file}", f"--kubeconfig={self.cluster.kubeconfig}"]
        env = {**os.environ, "KUBECONFIG": str(self.cluster.kubeconfig)}
        rec = self._start_service(argv, env)
        try:
            self._wait_ready(rec, t0 + timeout)
            self._register_webhooks(manifests)
            self._wait_webhooks(rec, t0 + timeout)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - t0
        self._say(f"kueue {KUEUE_VERSION} ready in {self.startup_s:.1f}s (webhooks on :{self.ports['webhook']})")
        return self

    def stop(self) -> None:
        """Remove the webhook configurations (with the manager gone they would reject every
        Job of the cluster) and stop the manager. The CRDs and Kueue's objects stay."""
        for kind, name in WEBHOOK_CONFIGURATIONS.items():
            self.cluster.kubectl("delete", kind.lower(), name, "--ignore-not-found", check=False)
        self.cluster.stop_services(SERVICE)

    def delete_all(self, timeout: float = 60.0) -> None:
        """Delete every Workload, LocalQueue, ClusterQueue, ResourceFlavor,
        WorkloadPriorityClass, AdmissionCheck, MultiKueueConfig and MultiKueueCluster, and
        wait until they are gone: Kueue holds some with finalizers, and the CRDs' conversion
        webhook is this manager, so a namespace that still held its objects once it stopped
        could not be deleted. Delete the Jobs first (Kueue makes a Workload again for a Job
        that still exists)."""
        kinds = [f"{k}.v1beta2.{API_GROUP}" for k in ("workloads", "localqueues", "clusterqueues",
                                                       "resourceflavors", "workloadpriorityclasses",
                                                       *_MULTIKUEUE_KINDS)]
        for kind in kinds:
            self.cluster.kubectl("delete", kind, "--all", "--all-namespaces", "--wait=false", check=False)
        deadline = time.monotonic() + timeout
        while True:
            left = self.cluster.kubectl("get", ",".join(kinds), "--all-namespaces", "-o", "name",
                                        check=False).stdout.split()
            if not left:
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"Kueue objects not deleted after {timeout:.0f}s: {left[:10]}")
            time.sleep(0.5)

    def running(self) -> bool:
        rec = self.cluster.services().get(SERVICE)
        return rec is not None and processes.is_alive(rec)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"

    # ----------------------------------------------------------------- internals
    def _start_service(self, argv: list[str], env: dict[str, str]) -> processes.ProcessRecord:
        if self.cluster.die_with_parent and threading.current_thread() is threading.main_thread():
            # As the cluster's own components (see LocalCluster._start): a crashed test
            # session must not leave a manager behind. Recorded with the cluster's services,
            # so stop_services and `fleettune cluster down` stop it all the same.
            return processes.start(SERVICE, argv, log=self.log, pid_dir=self.cluster.state_dir / "pids",
                                   cwd=self.cluster.state_dir, env=env, die_with_parent=True)
        rec, _ = self.cluster.start_service(SERVICE, argv, env=env)
        return rec

    def _make_certs(self) -> None:
        """A CA named kueue-ca, signed by the cluster's CA, and a serving certificate from
        it for 127.0.0.1 and the webhook Service's name (see the module's docstring)."""
        d = self._pki
        if (d / "tls.crt").is_file() and (d / "ca.key").is_file():
            self._copy_serving_cert()
            return
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        d.chmod(0o700)
        cluster_pki = self.cluster.state_dir / "pki"
        # cert-controller parses the CA key as PKCS#1 ("RSA PRIVATE KEY") only.
        _openssl("genrsa", "-traditional", "-out", "ca.key", "2048", cwd=d)
        _openssl("req", "-new", "-key", "ca.key", "-subj", "/O=kueue/CN=kueue-ca", "-out", "ca.csr", cwd=d)
        (d / "ca.ext").write_text("basicConstraints=critical,CA:TRUE\n"
                                  "keyUsage=critical,keyCertSign,digitalSignature,keyEncipherment\n"
                                  "subjectAltName=DNS:kueue-ca\n")
        _openssl("x509", "-req", "-in", "ca.csr", "-CA", str(cluster_pki / "ca.crt"),
                 "-CAkey", str(cluster_pki / "ca.key"), "-CAcreateserial", "-CAserial", "cluster-ca.srl",
                 "-days", "3650", "-sha256", "-extfile", "ca.ext", "-out", "ca.crt", cwd=d)
        _openssl("genrsa", "-traditional", "-out", "tls.key", "2048", cwd=d)
        _openssl("req", "-new", "-key", "tls.key", "-subj", f"/CN={WEBHOOK_SERVICE}.{NAMESPACE}.svc",
                 "-out", "tls.csr", cwd=d)
        (d / "tls.ext").write_text(
            f"subjectAltName=DNS:{WEBHOOK_SERVICE}.{NAMESPACE}.svc,IP:127.0.0.1,DNS:localhost\n"
            "extendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature,keyEncipherment\n")
        _openssl("x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-days", "3650", "-sha256", "-extfile", "tls.ext", "-out", "tls.crt", cwd=d)
        for f in ("ca.csr", "ca.ext", "tls.csr", "tls.ext"):
            (d / f).unlink()
        for key in d.glob("*.key"):
            key.chmod(0o600)
        self._copy_serving_cert()

    def _copy_serving_cert(self) -> None:
        self.cert_dir.mkdir(parents=True, exist_ok=True)
        for name in ("tls.crt", "tls.key"):
            shutil.copyfile(self._pki / name, self.cert_dir / name)

    @property
    def ca_bundle(self) -> str:
        return base64.b64encode((self._pki / "ca.crt").read_bytes()).decode()

    def _url(self, path: str) -> str:
        return f"https://127.0.0.1:{self.ports['webhook']}{path}"

    def _apply(self, docs: list[dict[str, Any]]) -> None:
        self.cluster.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=fleettune-kueue",
                             "-f", "-", input=yaml.safe_dump_all(docs, sort_keys=False), timeout=180)

    def _install_crds(self, manifests: Path) -> None:
        """Kueue's CRDs, with the conversion webhooks of its release (crd/kustomization.yaml
        patches) pointed at this manager."""
        kustomization = yaml.safe_load((manifests / "crd" / "kustomization.yaml").read_text())
        converted = set()
        for patch in kustomization.get("patches") or []:
            doc = yaml.safe_load((manifests / "crd" / patch["path"]).read_text())
            if (doc.get("spec") or {}).get("conversion", {}).get("strategy") == "Webhook":
                converted.add(doc["metadata"]["name"])
        crds = [yaml.safe_load(f.read_text()) for f in sorted((manifests / "crd" / "bases").glob("*.yaml"))]
        for crd in crds:
            if crd["metadata"]["name"] in converted:
                crd["spec"]["conversion"] = {"strategy": "Webhook", "webhook": {
                    "clientConfig": {"url": self._url("/convert"), "caBundle": self.ca_bundle},
                    "conversionReviewVersions": ["v1"]}}
        self._apply(crds)
        self.cluster.wait_established(*(c["metadata"]["name"] for c in crds))

    def _write_secret(self) -> None:
        data = {name: base64.b64encode((self._pki / name).read_bytes()).decode()
                for name in ("ca.crt", "ca.key", "tls.crt", "tls.key")}
        self._apply([
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
            {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
             "metadata": {"name": WEBHOOK_SECRET, "namespace": NAMESPACE}, "data": data},
        ])

    def _write_config(self) -> None:
        cfg = {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2",
            "kind": "Configuration",
            "namespace": NAMESPACE,
            "health": {"healthProbeBindAddress": f"127.0.0.1:{self.ports['health']}"},
            "metrics": {"bindAddress": f"127.0.0.1:{self.ports['metrics']}"},
            "webhook": {"host": "127.0.0.1", "port": self.ports["webhook"], "certDir": str(self.cert_dir)},
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": True, "webhookServiceName": WEBHOOK_SERVICE,
                                       "webhookSecretName": WEBHOOK_SECRET},
            "manageJobsWithoutQueueName": False,
            # The default QPS (20) would throttle admission of a tuning run's many Jobs.
            "clientConnection": {"qps": 200, "burst": 400},
            "integrations": {"frameworks": self.frameworks},
            "featureGates": self.feature_gates,
        }
        if self.multikueue:
            cfg["multiKueue"] = self.multikueue
        self.config_file.write_text(yaml.safe_dump(cfg, sort_keys=False))

    def _wait_ready(self, rec: processes.ProcessRecord, deadline: float) -> None:
        url = f"http://127.0.0.1:{self.ports['health']}/readyz"
        last = ""
        while time.monotonic() < deadline:
            if not processes.is_alive(rec):
                raise ClusterError(f"kueue exited during start-up; last log lines:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(url, timeout=2) as resp:
                    if resp.status == 200:
                        return
            except urllib.error.HTTPError as exc:
                last = f"HTTP {exc.code}"
            except (urllib.error.URLError, OSError) as exc:
                last = str(getattr(exc, "reason", exc))
            time.sleep(0.2)
        raise ClusterError(f"kueue not ready ({url}: {last}); last log lines:\n{self.log_tail()}")

    def _webhook_wanted(self, hook: dict[str, Any]) -> bool:
        groups = {API_GROUP}
        resources: set[tuple[str, str]] = set()
        for fw in self.frameworks:
            if fw in _BUILTIN_FRAMEWORKS:
                resources.add(_BUILTIN_FRAMEWORKS[fw])
            elif "/" in fw:
                groups.add(fw.split("/")[0])
        for rule in hook.get("rules") or []:
            for group in rule.get("apiGroups") or []:
                if group in groups or any((group, r) in resources for r in rule.get("resources") or []):
                    return True
        return False

    def _register_webhooks(self, manifests: Path) -> None:
        docs = []
        for doc in yaml.safe_load_all((manifests / "webhook" / "manifests.yaml").read_text()):
            if not doc or doc.get("kind") not in WEBHOOK_CONFIGURATIONS:
                continue
            hooks = [h for h in doc.get("webhooks") or [] if self._webhook_wanted(h)]
            for h in hooks:
                h["clientConfig"] = {"url": self._url(h["clientConfig"]["service"]["path"]),
                                     "caBundle": self.ca_bundle}
                if h["rules"][0].get("apiGroups") != [API_GROUP]:
                    # As Kueue's release: its own namespace's workloads are never managed.
                    h.setdefault("namespaceSelector", {"matchExpressions": [{
                        "key": "kubernetes.io/metadata.name", "operator": "NotIn",
                        "values": ["kube-system", NAMESPACE]}]})
            docs.append({**doc, "metadata": {"name": WEBHOOK_CONFIGURATIONS[doc["kind"]],
                                             "labels": {"app.kubernetes.io/name": "kueue"}},
                         "webhooks": hooks})
        self._apply(docs)

    def _wait_webhooks(self, rec: processes.ProcessRecord, deadline: float) -> None:
        """Until the apiserver reaches the manager's webhooks: a LocalQueue created at
        v1beta2 (stored as v1beta1: the conversion webhook, and the validating one) and a
        Job with a queue label (the mutating Job webhook must suspend it), both dry-run."""
        lq = {"apiVersion": API_VERSION, "kind": "LocalQueue",
              "metadata": {"name": "fleettune-probe", "namespace": "default"},
              "spec": {"clusterQueue": "fleettune-probe"}}
        job = {"apiVersion": "batch/v1", "kind": "Job",
               "metadata": {"name": "fleettune-probe", "namespace": "default",
                            "labels": {QUEUE_LABEL: "fleettune-probe"}},
               "spec": {"template": {"spec": {"restartPolicy": "Never",
                                              "containers": [{"name": "c", "image": "probe"}]}}}}
        last = ""
        while time.monotonic() < deadline:
            if not processes.is_alive(rec):
                raise ClusterError(f"kueue exited during start-up; last log lines:\n{self.log_tail()}")
            answers = []
            for obj in (lq, job):
                proc = self.cluster.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-", check=False,
                                            input=json.dumps(obj))
                if proc.returncode != 0:
                    last = proc.stderr.strip()
                    break
                answers.append(json.loads(proc.stdout))
            else:
                if answers[1]["spec"].get("suspend") is True:
                    return
                last = "the Job webhook did not suspend a queued Job"
            time.sleep(0.5)
        raise ClusterError(f"kueue's webhooks do not answer: {last}; last log lines:\n{self.log_tail()}")
