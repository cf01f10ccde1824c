"""A real Kubernetes control plane on loopback, with KWOK fake GPU nodes.

etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok run as plain
processes (no container runtime), each in its own process group, with logs and pid files
in the state directory. Only kwok's nodes are fake: Jobs, the scheduler, the garbage
collector and the API semantics are the real thing, so integration tests exercise exactly
what a production cluster would do. *Services* (the demo's fleet simulator and operator)
are recorded the same way, so ``fleettune cluster down`` stops them with the control plane.
The components' command lines and files are `fleettune_dev.cluster.components`; the
fleet's fake nodes, `fleettune_dev.cluster.nodes`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
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

from fleettune_dev.cluster import processes
from fleettune_dev.cluster.binaries import Binaries, cache_root, ensure_binaries
from fleettune_dev.cluster.components import (
    COMPONENT_PORTS,
    COMPONENTS,
    ClusterError,
    component_argv,
    health_url,
    kwok_stages,
    write_kubeconfig,
)
from fleettune_dev.cluster.fleet import Fleet, default_fleet, parse_fleet
from fleettune_dev.cluster.network import advertise_address, free_port, wait_port_free
from fleettune_dev.cluster.nodes import ensure_fleet, install_kwok_crds, nodes_by_pool
from fleettune_dev.cluster.pki import Pki, ensure_pki

Progress = Callable[[str], None]

DEFAULT_STATE_DIR = cache_root() / "clusters" / "default"  # ~/.cache/fleettune/clusters/default


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
            keys = [key for names in COMPONENT_PORTS.values() for key in names]
            ports: set[int] = set()
            while len(ports) < len(keys):  # the kernel may hand out a just-closed port twice
                ports.add(free_port())
            state["ports"] = dict(zip(keys, sorted(ports), strict=True))
            state["advertise_address"] = advertise_address()
            self._write_state(state)
        if not self.fleet_file.is_file() or self._fleet is not None:
            self.fleet_file.write_text(self.fleet.to_yaml())
        ensure_pki(self._pki.dir)
        write_kubeconfig(self.kubeconfig, self.server, self._pki)
        (self.state_dir / "kwok-stages.yaml").write_text(kwok_stages(bins))
        for name in COMPONENTS:
            rec = processes.load(self._pids, name)
            if rec is not None and processes.is_alive(rec):
                continue
            self._start(name, say)
        with self.api_client() as api:
            ensure_fleet(api, self.fleet, say, self.logs_dir / "kwok.log")
        say(f"cluster up in {time.monotonic() - started:.1f}s: {self.server}")

    def down(self) -> None:
        """Stop the services, any other fleettune process started against this cluster, every
        component (reverse order), and delete the state directory."""
        self.stop_services()
        # An operator restarted by hand (`KUBECONFIG=<state>/kubeconfig fleettune operator`)
        # has no pid file: found by the state directory its arguments or environment name,
        # and stopped while the API server is still there to let it shut down cleanly.
        self.stop_strays()
        self.stop_components(*reversed(COMPONENTS))
        # A component whose pid file was lost would survive: look for strays by state path.
        self.stop_strays()
        shutil.rmtree(self.state_dir, ignore_errors=True)

    def stop_strays(self) -> list[int]:
        """Stop the processes started against this cluster that no pid file names (also
        when the state directory is gone already); returns their pids."""
        pids = self._stray_pids()
        processes.terminate_all(pids)
        return pids

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
                "ports": {k: state.get("ports", {}).get(k) for k in COMPONENT_PORTS[name]},
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
                with self.api_client() as api:
                    result["nodes"] = nodes_by_pool(api)
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
        although its quota is free (docs/operations/multikueue.md)."""
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
    def _start(self, name: str, say: Progress) -> None:
        ports = self.ports
        for key in COMPONENT_PORTS[name]:
            if not wait_port_free(ports[key]):
                raise ClusterError(f"cannot start {name}: port {ports[key]} ({key}) is taken by another process")
        t0 = time.monotonic()
        if name == "kwok":
            with self.api_client() as api:
                install_kwok_crds(api, self._bins(_quiet))  # it watches them from its start
        say(f"starting {name}")
        # The kernel's parent-death signal fires when the *thread* that forked exits: only
        # bind components to the main thread, never to a short-lived worker thread.
        bind = self.die_with_parent and threading.current_thread() is threading.main_thread()
        argv = component_argv(name, self._bins(_quiet), self._read_state(), self._pki, self.kubeconfig, self.state_dir)
        rec = processes.start(name, argv, log=self.logs_dir / f"{name}.log", pid_dir=self._pids,
                              cwd=self.state_dir, die_with_parent=bind)
        try:
            self._wait_healthy(name, rec)
        except ClusterError:
            processes.stop(rec, pid_dir=self._pids)
            raise
        say(f"{name} ready in {time.monotonic() - t0:.1f}s")

    def _wait_healthy(self, name: str, rec: processes.ProcessRecord, timeout: float = 90.0) -> None:
        url, ctx = health_url(name, self.ports, self._pki)
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

    def _stray_pids(self) -> list[int]:
        """Our processes that name this state dir: components (a cached binary) whose pid
        file was lost, and fleettune commands (an operator, a simulator) started by hand."""
        bin_dir = str(cache_root() / "bin") + "/"
        return processes.started_against(
            self.state_dir,
            lambda argv: bool(argv) and (argv[0].startswith(bin_dir) or processes.is_fleettune_program(argv)))

