"""A real Kubernetes control plane on loopback, with KWOK fake GPU nodes.

etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok run as plain
processes (no container runtime), each in its own process group, with logs and pid files
in the state directory. Only kwok's nodes are fake: Jobs, the scheduler, the garbage
collector and the API semantics are the real thing, so integration tests exercise exactly
what a production cluster would do. *Services* (the demo's fleet simulator and operator)
are recorded the same way, so ``fleettune cluster down`` stops them with the control plane.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from fleettune.labels import POOL_LABEL
from fleettune_dev.cluster import processes
from fleettune_dev.cluster.binaries import Binaries, cache_root, ensure_binaries
from fleettune_dev.cluster.fleet import (
    GPU_RESOURCE,
    KWOK_ANNOTATION,
    Fleet,
    default_fleet,
    packaged_data_dir,
    parse_fleet,
)
from fleettune_dev.cluster.network import advertise_address, free_port, wait_port_free
from fleettune_dev.cluster.pki import SERVICE_CIDR, Pki, ensure_pki

Progress = Callable[[str], None]

COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
# Ports each component needs, by the name they are stored under in state.json.
_PORTS = {
    "etcd": ("etcd-client", "etcd-peer"),
    "kube-apiserver": ("kube-apiserver",),
    "kube-controller-manager": ("kube-controller-manager",),
    "kube-scheduler": ("kube-scheduler",),
    "kwok": ("kwok",),
}
POD_CIDR = "10.244.0.0/16"
# The fast kwok stages we load, plus fleettune's own (data/kwok/). Deliberately not
# `pod-complete`: it would finish every Job pod with exit 0 and no result; the fleet
# simulator completes trial pods instead.
KWOK_STAGES = (
    "node/fast/node-initialize.yaml",
    "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "pod/fast/pod-ready.yaml",
    "pod/fast/pod-delete.yaml",
)
RUNTIME_CLASS = "nvidia"
DEFAULT_STATE_DIR = cache_root() / "clusters" / "default"  # ~/.cache/fleettune/clusters/default


class ClusterError(RuntimeError):
    pass


def _quiet(_: str) -> None:
    pass


class LocalCluster:
    """A local control plane in ``state_dir``; see ``fleettune cluster --help``.

    ``die_with_parent`` makes the kernel stop the components when the Python thread that
    started them exits (for test sessions: a crash leaves no process behind). The CLI
    leaves it off so the cluster outlives ``fleettune cluster up``.
    """

    def __init__(self, state_dir: Path | str = DEFAULT_STATE_DIR, fleet: Fleet | None = None, *,
                 die_with_parent: bool = False) -> None:
        self.state_dir = Path(state_dir).expanduser().resolve()
        self._fleet = fleet
        self.die_with_parent = die_with_parent
        self._binaries: Binaries | None = None

    # ----------------------------------------------------------------- paths and state
    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfig"

    @property
    def logs_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def _pids(self) -> Path:
        return self.state_dir / "pids"

    @property
    def _pki(self) -> Pki:
        return Pki(self.state_dir / "pki")

    @property
    def _state_file(self) -> Path:
        return self.state_dir / "state.json"

    @property
    def fleet_file(self) -> Path:
        return self.state_dir / "fleet.yaml"

    @property
    def fleet(self) -> Fleet:
        """The fleet given, else the one this cluster was started with, else the demo fleet."""
        if self._fleet is None:
            if self.fleet_file.is_file():
                self._fleet = parse_fleet(yaml.safe_load(self.fleet_file.read_text()),
                                          source=str(self.fleet_file), base_dir=self.state_dir)
            else:
                self._fleet = default_fleet()
        return self._fleet

    def _read_state(self) -> dict[str, Any]:
        try:
            return json.loads(self._state_file.read_text())
        except (FileNotFoundError, ValueError):
            return {}

    def _write_state(self, state: dict[str, Any]) -> None:
        self._state_file.write_text(json.dumps(state, indent=2, sort_keys=True))

    @property
    def ports(self) -> dict[str, int]:
        return dict(self._read_state().get("ports", {}))

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['kube-apiserver']}"

    def _bins(self, progress: Progress) -> Binaries:
        if self._binaries is None:
            self._binaries = ensure_binaries(progress)
        return self._binaries

    # ----------------------------------------------------------------- lifecycle
    def __enter__(self) -> LocalCluster:
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    @contextlib.contextmanager
    def session(self, progress: Progress | None = None) -> Iterator[LocalCluster]:
        """Up for the block and down after it, also when it fails to start (a test session's
        cluster, a second cluster of a module)."""
        try:
            self.up(progress)
            yield self
        finally:
            self.down()

    def up(self, progress: Progress | None = None) -> None:
        """Start whatever is not running (all of it on first use) and the fleet's nodes.

        Idempotent: on a running cluster it starts only what is not running (a crashed
        component comes back on its old ports, with its data) and creates missing nodes.
        """
        say = progress or _quiet
        started = time.monotonic()
        bins = self._bins(say)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.state_dir.chmod(0o700)
        state = self._read_state()
        if "ports" not in state:
            keys = [key for names in _PORTS.values() for key in names]
            ports: set[int] = set()
            while len(ports) < len(keys):  # the kernel may hand out a just-closed port twice
                ports.add(free_port())
            state["ports"] = dict(zip(keys, sorted(ports), strict=True))
            state["advertise_address"] = advertise_address()
            self._write_state(state)
        if not self.fleet_file.is_file() or self._fleet is not None:
            self.fleet_file.write_text(self.fleet.to_yaml())
        ensure_pki(self._pki.dir)
        self._write_kubeconfig()
        self._write_kwok_stages(bins)
        for name in COMPONENTS:
            rec = processes.load(self._pids, name)
            if rec is not None and processes.is_alive(rec):
                continue
            self._start(name, say)
        self._ensure_fleet(say)
        say(f"cluster up in {time.monotonic() - started:.1f}s: {self.server}")

    def down(self) -> None:
        """Stop the services, every component (reverse order), and delete the state directory."""
        self.stop_services()
        self.stop_components(*reversed(COMPONENTS))
        # A component whose pid file was lost would survive: look for strays by state path.
        for pid in self._stray_pids():
            processes.terminate_pid(pid)
        shutil.rmtree(self.state_dir, ignore_errors=True)

    def stop_components(self, *names: str, crash: bool = False) -> None:
        for name in names:
            rec = processes.load(self._pids, name)
            if rec is None:
                continue
            if crash:
                processes.kill(rec)
                (self._pids / f"{name}.json").unlink(missing_ok=True)
            else:
                processes.stop(rec, pid_dir=self._pids)

    def start_components(self, *names: str, progress: Progress | None = None) -> None:
        for name in COMPONENTS:  # dependency order, whatever order they were given in
            if name in names:
                rec = processes.load(self._pids, name)
                if rec is None or not processes.is_alive(rec):
                    self._start(name, progress or _quiet)

    def restart(self, *names: str, crash: bool = False) -> None:
        """Stop (or SIGKILL, with ``crash``) the given components, then start them again."""
        self.stop_components(*reversed([n for n in COMPONENTS if n in names]), crash=crash)
        self.start_components(*names)

    def restart_apiserver(self, *, with_etcd: bool = False, crash: bool = False) -> None:
        self.restart(*(("etcd", "kube-apiserver") if with_etcd else ("kube-apiserver",)), crash=crash)

    # ----------------------------------------------------------------- services
    def start_service(self, name: str, argv: list[str], *,
                      env: dict[str, str] | None = None) -> tuple[processes.ProcessRecord, bool]:
        """Start a process that belongs with this cluster (a simulator, an operator) unless
        one by that name runs; it outlives the caller. Returns its record and whether it
        was started now. Its output goes to ``logs/<name>.log``."""
        if name in COMPONENTS:
            raise ValueError(f"{name} is a control-plane component, not a service")
        rec = processes.load(self._pids, name)
        if rec is not None and processes.is_alive(rec):
            return rec, False
        # The kubernetes client writes a kubeconfig's certificates to temporary files that only
        # its atexit hook removes, and a service stopped by a signal never runs it: keep them
        # in the state directory, which `down` removes.
        tmp = self.state_dir / "tmp" / name
        tmp.mkdir(parents=True, exist_ok=True)
        env = {**(os.environ if env is None else env), "TMPDIR": str(tmp)}
        rec = processes.start(name, argv, log=self.logs_dir / f"{name}.log", pid_dir=self._pids,
                              cwd=self.state_dir, env=env)
        return rec, True

    def services(self) -> dict[str, processes.ProcessRecord]:
        """The services recorded in the state directory, running or not."""
        found = {}
        for path in sorted(self._pids.glob("*.json")) if self._pids.is_dir() else []:
            name = path.name.removesuffix(".json")
            rec = processes.load(self._pids, name)
            if name not in COMPONENTS and rec is not None:
                found[name] = rec
        return found

    def stop_services(self, *names: str) -> None:
        """Stop the given services (all of them when none is named)."""
        for name, rec in self.services().items():
            if not names or name in names:
                processes.stop(rec, pid_dir=self._pids)

    def component_pids(self) -> dict[str, int]:
        """The running control-plane components' process ids, by name."""
        out = {}
        for name in COMPONENTS:
            rec = processes.load(self._pids, name)
            if rec is not None and processes.is_alive(rec):
                out[name] = rec.pid
        return out

    def running(self) -> dict[str, bool]:
        pids = self.component_pids()
        return {name: name in pids for name in COMPONENTS}

    def status(self) -> dict[str, Any]:
        state = self._read_state()
        comps: dict[str, Any] = {}
        for name in COMPONENTS:
            rec = processes.load(self._pids, name)
            alive = rec is not None and processes.is_alive(rec)
            comps[name] = {
                "running": alive,
                "pid": rec.pid if rec and alive else None,
                "ports": {k: state.get("ports", {}).get(k) for k in _PORTS[name]},
                "log": str(self.logs_dir / f"{name}.log"),
            }
        services = {}
        for name, rec in self.services().items():
            alive = processes.is_alive(rec)
            services[name] = {"running": alive, "pid": rec.pid if alive else None,
                              "log": str(self.logs_dir / f"{name}.log")}
        result: dict[str, Any] = {
            "state_dir": str(self.state_dir),
            "kubeconfig": str(self.kubeconfig) if self.kubeconfig.is_file() else None,
            "server": self.server if state.get("ports") else None,
            "components": comps,
            "services": services,
            "nodes": {},
        }
        if comps["kube-apiserver"]["running"]:
            try:
                result["nodes"] = self._nodes_by_pool()
            except Exception as exc:  # status must still answer when the API is unhealthy
                result["nodes_error"] = str(exc)
        return result

    # ----------------------------------------------------------------- kubectl / client
    def kubectl(self, *args: str, check: bool = True, input: str | None = None,
                timeout: float | None = 120) -> subprocess.CompletedProcess[str]:
        """Run the built kubectl against this cluster."""
        exe = self._bins(_quiet).kube("kubectl")
        proc = subprocess.run([str(exe), f"--kubeconfig={self.kubeconfig}", *args], input=input,
                              capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc

    def wait_established(self, *crds: str, timeout: float = 60.0) -> None:
        """Wait until each CRD (by name) serves its kind. kubectl 1.34's `wait
        --for=condition=Established` fails at once, rather than waits, while a new CRD has
        no status.conditions yet: that is retried."""
        deadline = time.monotonic() + timeout
        created: list[float] = []
        for crd in crds:
            while True:
                left = max(1, int(deadline - time.monotonic()))
                proc = self.kubectl("wait", "--for=condition=Established", f"crd/{crd}", f"--timeout={left}s",
                                    "-o", "jsonpath={.metadata.creationTimestamp}", check=False, timeout=left + 30)
                if proc.returncode == 0:
                    created.append(datetime.fromisoformat(proc.stdout.strip().replace("Z", "+00:00")).timestamp())
                    break
                if "accessor error" not in proc.stderr or time.monotonic() > deadline:
                    raise ClusterError(f"CRD {crd} not established: {proc.stderr.strip()}")
                time.sleep(0.5)
        if created:
            self._collect_garbage_since(max(created))

    def _collect_garbage_since(self, created: float) -> None:
        """Restart kube-controller-manager if it started before ``created`` (a CRD's creation).

        Its garbage collector learns of a new kind only at its discovery resync, every 30 s
        (not configurable). Until then, what a deleted object owned outlives it: a Kueue
        Workload its deleted Job, a Job its deleted TuningRun. In a real cluster the CRDs
        come long before the workloads. Here a test starts within seconds of installing them,
        and an orphaned Workload left in its queue is what Kueue v0.15 can re-admit just as
        it is collected, which leaves the ClusterQueue's other pending Workloads unadmitted
        although its quota is free (docs/kueue.md)."""
        rec = processes.load(self._pids, "kube-controller-manager")
        if rec is None or not processes.is_alive(rec):
            return
        started = (self._pids / "kube-controller-manager.json").stat().st_mtime
        # creationTimestamp has whole seconds: one created in the second the manager started counts as after.
        if created >= started - 1:
            self.restart("kube-controller-manager")

    def kubectl_path(self) -> Path:
        return self._bins(_quiet).kube("kubectl")

    def api_client(self) -> Any:
        """A new kubernetes.client.ApiClient for this cluster (not shared across threads)."""
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig))

    # ----------------------------------------------------------------- internals
    def _write_kubeconfig(self) -> None:
        import base64

        pki = self._pki

        def b64(p: Path) -> str:
            return base64.b64encode(p.read_bytes()).decode()

        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fleettune-local", "cluster": {
                "server": self.server, "certificate-authority-data": b64(pki.ca_crt)}}],
            "users": [{"name": "fleettune-admin", "user": {
                "client-certificate-data": b64(pki.admin_crt), "client-key-data": b64(pki.admin_key)}}],
            "contexts": [{"name": "fleettune-local", "context": {
                "cluster": "fleettune-local", "user": "fleettune-admin"}}],
            "current-context": "fleettune-local",
        }
        tmp = self.kubeconfig.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(doc, sort_keys=False))
        tmp.chmod(0o600)
        tmp.replace(self.kubeconfig)

    def _write_kwok_stages(self, bins: Binaries) -> None:
        docs = []
        for rel in KWOK_STAGES:
            src = bins.kwok_stages / rel
            if not src.is_file():
                raise ClusterError(f"kwok stage {src} is missing: rebuild kwok (rm -r {bins.kwok.parent})")
            docs.append(src.read_text().strip())
        for own in sorted((packaged_data_dir() / "kwok").glob("*.yaml")):
            docs.append(own.read_text().strip())
        (self.state_dir / "kwok-stages.yaml").write_text("\n---\n".join(docs) + "\n")

    def _argv(self, name: str) -> list[str]:
        bins = self._bins(_quiet)
        st = self._read_state()
        p = st["ports"]
        pki = self._pki
        kc = str(self.kubeconfig)
        if name == "etcd":
            client, peer = f"http://127.0.0.1:{p['etcd-client']}", f"http://127.0.0.1:{p['etcd-peer']}"
            return [str(bins.etcd), "--name=fleettune", f"--data-dir={self.state_dir / 'etcd'}",
                    # A throw-away cluster: durability is not worth the fsync latency.
                    "--unsafe-no-fsync", "--log-level=warn",
                    f"--listen-client-urls={client}", f"--advertise-client-urls={client}",
                    f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
                    f"--initial-cluster=fleettune={peer}", "--listen-metrics-urls=",
                    "--quota-backend-bytes=4294967296"]
        if name == "kube-apiserver":
            return [str(bins.kube("kube-apiserver")),
                    f"--etcd-servers=http://127.0.0.1:{p['etcd-client']}",
                    "--bind-address=127.0.0.1", f"--secure-port={p['kube-apiserver']}",
                    # Only used for the `kubernetes` Service's endpoints; must not be loopback,
                    # and without a default route the apiserver cannot guess one.
                    f"--advertise-address={st['advertise_address']}",
                    f"--tls-cert-file={pki.apiserver_crt}", f"--tls-private-key-file={pki.apiserver_key}",
                    f"--client-ca-file={pki.ca_crt}",
                    "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                    f"--service-account-key-file={pki.sa_pub}",
                    f"--service-account-signing-key-file={pki.sa_key}",
                    f"--service-cluster-ip-range={SERVICE_CIDR}",
                    "--authorization-mode=RBAC",
                    # Fake pods need no token; this also avoids racing the creation of each
                    # namespace's default ServiceAccount.
                    "--disable-admission-plugins=ServiceAccount",
                    # On in OpenShift: an ownerReference that blocks its owner's deletion
                    # needs `update` on the owner's finalizers (trial Jobs set one).
                    "--enable-admission-plugins=OwnerReferencesPermissionEnforcement",
                    "--allow-privileged=true", "--profiling=false",
                    # kwok gives each fake node its name as its Hostname address, which does not
                    # resolve: reach the "kubelet" (kwok, for Pod logs) by its InternalIP.
                    "--kubelet-preferred-address-types=InternalIP"]
        # No --authentication/authorization-kubeconfig: their serving endpoints are only used
        # for /healthz (always allowed), and delegated auth would poll for a front-proxy CA
        # this cluster does not have, logging an error every few seconds.
        common = [f"--kubeconfig={kc}", "--leader-elect=false", "--bind-address=127.0.0.1",
                  "--profiling=false"]
        # A tuning fleet churns through short Jobs (hundreds of GPUs, a trial every few
        # seconds): the defaults (KCM: 5 Job workers at 20 QPS; scheduler: 50 QPS) throttle
        # the Job controller to a few Jobs a second and leave GPUs idle behind it.
        fast = ["--kube-api-qps=300", "--kube-api-burst=600"]
        if name == "kube-controller-manager":
            return [str(bins.kube("kube-controller-manager")), *common, *fast,
                    "--concurrent-job-syncs=50", "--concurrent-gc-syncs=50",
                    f"--secure-port={p['kube-controller-manager']}",
                    f"--service-account-private-key-file={pki.sa_key}", f"--root-ca-file={pki.ca_crt}",
                    f"--cluster-signing-cert-file={pki.ca_crt}", f"--cluster-signing-key-file={pki.ca_key}",
                    f"--service-cluster-ip-range={SERVICE_CIDR}"]
        if name == "kube-scheduler":
            return [str(bins.kube("kube-scheduler")), *common, *fast, f"--secure-port={p['kube-scheduler']}"]
        if name == "kwok":
            return [str(bins.kwok), f"--kubeconfig={kc}",
                    f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake",
                    "--node-lease-duration-seconds=40", f"--cidr={POD_CIDR}",
                    f"--server-address=127.0.0.1:{p['kwok']}",
                    # The fake nodes' kubelet endpoint, which the apiserver proxies Pod logs to:
                    # kwok's own server (TLS with a throw-away certificate, which the
                    # apiserver does not check without --kubelet-certificate-authority).
                    "--node-ip=127.0.0.1", f"--node-port={p['kwok']}",
                    f"--config={self.state_dir / 'kwok-stages.yaml'}"]
        raise KeyError(name)

    def _start(self, name: str, say: Progress) -> None:
        ports = self.ports
        for key in _PORTS[name]:
            if not wait_port_free(ports[key]):
                raise ClusterError(f"cannot start {name}: port {ports[key]} ({key}) is taken by another process")
        t0 = time.monotonic()
        if name == "kwok":
            self._install_kwok_crds()  # it watches them from its start
        say(f"starting {name}")
        # The kernel's parent-death signal fires when the *thread* that forked exits: only
        # bind components to the main thread, never to a short-lived worker thread.
        bind = self.die_with_parent and threading.current_thread() is threading.main_thread()
        rec = processes.start(name, self._argv(name), log=self.logs_dir / f"{name}.log", pid_dir=self._pids,
                              cwd=self.state_dir, die_with_parent=bind)
        try:
            self._wait_healthy(name, rec)
        except ClusterError:
            processes.stop(rec, pid_dir=self._pids)
            raise
        say(f"{name} ready in {time.monotonic() - t0:.1f}s")

    def _health_url(self, name: str) -> tuple[str, ssl.SSLContext | None]:
        p = self.ports
        insecure = ssl.create_default_context()
        # KCM and the scheduler serve with a self-signed certificate made at start-up.
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE
        if name == "etcd":
            return f"http://127.0.0.1:{p['etcd-client']}/health", None
        if name == "kube-apiserver":
            return f"https://127.0.0.1:{p['kube-apiserver']}/readyz", ssl.create_default_context(
                cafile=str(self._pki.ca_crt))
        if name == "kwok":
            return f"http://127.0.0.1:{p['kwok']}/healthz", None
        return f"https://127.0.0.1:{p[name]}/healthz", insecure

    def _wait_healthy(self, name: str, rec: processes.ProcessRecord, timeout: float = 90.0) -> None:
        url, ctx = self._health_url(name)
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            if not processes.is_alive(rec):
                raise ClusterError(f"{name} exited during start-up; last log lines:\n{self._log_tail(name)}")
            try:
                with urllib.request.urlopen(url, context=ctx, timeout=2) as resp:
                    if resp.status == 200:
                        return
                    last = f"HTTP {resp.status}"
            except urllib.error.HTTPError as exc:
                last = f"HTTP {exc.code}"
            except (urllib.error.URLError, OSError) as exc:
                last = str(getattr(exc, "reason", exc))
            time.sleep(0.2)
        raise ClusterError(f"{name} not healthy after {timeout:.0f}s ({url}: {last}); "
                           f"last log lines:\n{self._log_tail(name)}")

    def _log_tail(self, name: str, lines: int = 25) -> str:
        try:
            return "\n".join((self.logs_dir / f"{name}.log").read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"

    def _install_kwok_crds(self) -> None:
        """kwok's `Logs` CRD: the fleet simulator points each batch Pod's log at a file
        (`fleettune_dev.sim.podlogs`), which kwok serves to `kubectl logs` and the operator."""
        from kubernetes import client

        with self.api_client() as api:
            crds = client.ApiextensionsV1Api(api)
            for path in sorted((self._bins(_quiet).kwok.parent / "crds").glob("*.yaml")):
                try:
                    crds.create_custom_resource_definition(yaml.safe_load(path.read_text()))
                except client.ApiException as exc:
                    if exc.status != 409:
                        raise

    def _ensure_fleet(self, say: Progress, timeout: float = 60.0) -> None:
        from kubernetes import client

        with self.api_client() as api:
            core = client.CoreV1Api(api)
            existing = {n.metadata.name for n in core.list_node().items}
            wanted = self.fleet.node_manifests()
            created = 0
            for manifest in wanted:
                if manifest["metadata"]["name"] not in existing:
                    core.create_node(manifest)
                    created += 1
            node_api = client.NodeV1Api(api)
            try:
                node_api.create_runtime_class({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
                                               "metadata": {"name": RUNTIME_CLASS}, "handler": RUNTIME_CLASS})
            except client.ApiException as exc:
                if exc.status != 409:
                    raise
            names = {m["metadata"]["name"] for m in wanted}
            if created:
                say(f"created {created} fake GPU node(s) in pools {', '.join(self.fleet.pool_names())}")
            deadline = time.monotonic() + timeout
            while True:
                nodes = core.list_node(label_selector=POOL_LABEL).items
                ready = {n.metadata.name for n in nodes if _is_ready(n)}
                if names <= ready:
                    break
                if time.monotonic() > deadline:
                    raise ClusterError(f"nodes not Ready after {timeout:.0f}s: {sorted(names - ready)}; "
                                       f"see {self.logs_dir / 'kwok.log'}")
                time.sleep(0.3)
            say(f"{len(names)} node(s) Ready")

    def _nodes_by_pool(self) -> dict[str, list[dict[str, Any]]]:
        from kubernetes import client

        with self.api_client() as api:
            nodes = client.CoreV1Api(api).list_node(label_selector=POOL_LABEL, _request_timeout=5).items
        pools: dict[str, list[dict[str, Any]]] = {}
        for n in sorted(nodes, key=lambda n: n.metadata.name):
            pools.setdefault(n.metadata.labels[POOL_LABEL], []).append({
                "name": n.metadata.name,
                "ready": _is_ready(n),
                "gpus": (n.status.allocatable or {}).get(GPU_RESOURCE),
                "arch": n.metadata.labels.get("kubernetes.io/arch"),
            })
        return pools

    def _stray_pids(self) -> list[int]:
        """Our components whose pid file was lost: a cached binary, naming this state dir."""
        bin_dir = str(cache_root() / "bin") + "/"
        state = str(self.state_dir)
        return processes.find(lambda argv: bool(argv) and argv[0].startswith(bin_dir)
                              and any(state in a for a in argv))


def _is_ready(node: Any) -> bool:
    ready = any(c.type == "Ready" and c.status == "True" for c in (node.status.conditions or []))
    # The node lifecycle controller taints new nodes not-ready until it has seen them Ready;
    # the scheduler honours the taint, so a node is usable only once it is gone.
    lifecycle = [t for t in (node.spec.taints or []) if t.key.startswith("node.kubernetes.io/")]
    return ready and not lifecycle
