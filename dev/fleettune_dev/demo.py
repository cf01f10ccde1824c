"""`fleettune demo`: tune the example convolution on a simulated three-pool GPU fleet.

Brings up a real control plane on loopback (etcd, kube-apiserver, controller-manager,
scheduler, KWOK fake GPU nodes), installs the CRD, starts the fleet simulator and the
operator as background processes of the cluster, applies `examples/convolution-fleet.yaml`,
shows live progress, and ends with the best configuration per pool and its speed-up over
the kernel's default. ``--keep`` leaves all of it running; ``fleettune cluster down``
stops it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from fleettune import GROUP, KIND, PLURAL, VERSION
from fleettune.crd import render

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "convolution-fleet.yaml"
# Background processes of the cluster, started in this order.
SERVICES = ("simulator", "operator")


def _say(console: Console) -> Callable[[str], None]:
    # Plain text, never wrapped: paths and JSON must survive a copy-paste and a CI log.
    return lambda text: console.print(escape(text), soft_wrap=True, highlight=False)


def _table(run: dict[str, Any], elapsed: float) -> Table:
    status = run.get("status") or {}
    # Cells and titles are rich markup: every text from the cluster is escaped ("[synthetic]").
    table = Table(title=escape(f"TuningRun {run['metadata']['name']}: {status.get('phase', 'Pending')} "
                               f"({elapsed:.0f}s)"))
    columns = ("pool", "device", "phase", "trials", "running", "invalid", "infra", "best ms", "default ms", "speed-up",
               "learns from")
    for col in columns:
        table.add_column(col, justify="left" if col in ("pool", "device", "phase") else "right")
    for t in status.get("targets", []):
        fp = t.get("fingerprint") or {}
        synthetic = fp.get("synthetic")
        best = t.get("best") or {}
        table.add_row(
            escape(t["name"]),
            escape((t.get("device") or "") + (" [synthetic]" if synthetic else "")),
            escape(t.get("phase", "")),
            f"{t.get('completed', 0)}/{t.get('budget', 0)}",
            str(t.get("running", 0)),
            str(t.get("invalid", 0)),
            str(t.get("infraFailed", 0)),
            escape(f"{best['objectiveMs']:.4g}" + (" [unverified]" if fp.get("unverified") else "")) if best else "-",
            f"{t['defaultMs']:.4g}" if t.get("defaultMs") else "-",
            f"{t['speedup']:.2f}x" if t.get("speedup") else "-",
            escape(_learns_from(t, short=True)),
        )
    return table


def _learns_from(target: dict[str, Any], short: bool = False) -> str:
    """The other pools and earlier runs a pool's search starts from, and the weight its
    model gives them now ("-": none)."""
    sources = target.get("learnedFrom") or []
    if not sources:
        return "-"
    names = ", ".join(s["name"] if short else f"{s['kind'].lower()} {s['name']} ({s['results']})" for s in sources)
    weight = target.get("priorWeight")
    return names + (f" @{weight:.2f}" if short and weight is not None else
                    f"; weight {weight:.2f}" if weight is not None else "")


def _summary(console: Console, run: dict[str, Any]) -> None:
    status = run.get("status") or {}
    say = _say(console)
    console.print(f"\n[bold]Best configuration per pool[/bold] (phase {escape(str(status.get('phase')))}):")
    for t in status.get("targets", []):
        best = t.get("best")
        if not best:
            say(f"  {t['name']}: no valid result ({t.get('message', '')})")
            continue
        fp = t.get("fingerprint") or {}
        note = " — SYNTHETIC numbers (no recording of this GPU; simulated model)" if fp.get("synthetic") else (
            " — replayed from recorded measurements" if fp.get("simulated") else ""
        )
        speed = f", {t['speedup']:.2f}x faster than the default ({t['defaultMs']:.4g} ms)" if t.get("speedup") else ""
        # The simulated fleet computes no outputs: nothing says this configuration is correct.
        unchecked = " [unverified: outputs not checked]" if fp.get("unverified") else ""
        rest = f" ({t.get('device')}): {best['objectiveMs']:.4g} ms{unchecked}{speed}{note}"
        console.print(f"  [bold]{escape(t['name'])}[/bold]{escape(rest)}", soft_wrap=True, highlight=False)
        say(f"      {json.dumps(best['config'], separators=(',', ':'))}")
        if (learned := _learns_from(t)) != "-":
            say(f"      learned from {learned}")


def main(argv: list[str]) -> int:
    from fleettune_dev.cluster import LocalCluster, default_fleet
    from fleettune_dev.cluster.binaries import ensure_binaries
    from fleettune_dev.cluster.local import DEFAULT_STATE_DIR

    parser = argparse.ArgumentParser(prog="fleettune demo", description=__doc__.splitlines()[0])
    parser.add_argument("--manifest", type=Path, default=EXAMPLE)
    parser.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR,
                        help="the local cluster to use, as for `fleettune cluster` and `fleettune simulate` "
                        "(default: %(default)s)")
    parser.add_argument(
        "--keep", action="store_true",
        help="leave the control plane, the fleet simulator and the operator running afterwards, to inspect the "
        "run and its results (`fleettune cluster down` stops them)",
    )
    parser.add_argument("--timeout", type=float, default=900.0)
    args = parser.parse_args(argv)
    # Wide enough for the per-pool table even when the output is a file or a CI log.
    console = Console(width=None if sys.stdout.isatty() else 132)
    say = _say(console)

    # Built once per machine (minutes): not part of the demo's time.
    try:
        ensure_binaries(progress=lambda msg: say(f"  {msg}"))
    except RuntimeError as exc:  # the message ends with the build log's path
        say(f"fleettune demo: {exc}")
        return 1
    started = time.monotonic()
    cluster = LocalCluster(args.state_dir, default_fleet())
    console.rule("local control plane")
    try:
        cluster.up(progress=lambda msg: say(f"  {msg}"))
        say(f"  up in {time.monotonic() - started:.1f}s; export KUBECONFIG={cluster.kubeconfig}")
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as crd:
            crd.write(render())
            crd.flush()
            cluster.kubectl("apply", "--server-side", "-f", crd.name)
        cluster.wait_established(f"{PLURAL}.{GROUP}")
        _start_services(cluster, say)
        # A run left by an earlier `--keep` would only show its old result: tune afresh.
        cluster.kubectl("delete", "--ignore-not-found", "--wait=true", "--timeout=120s", "-f", str(args.manifest))
        cluster.kubectl("apply", "--server-side", "-f", str(args.manifest))
        name = run_name(Path(args.manifest).read_text())
        console.rule(f"tuning {name}")
        run = _watch(cluster, name, console, started, args.timeout)
        _summary(console, run)
        say(f"\nDemo finished in {time.monotonic() - started:.0f}s.")
        if args.keep:  # the fleet's memory: a later run of the kernel starts warm
            say("A second run of this kernel (another name, target or size) starts from these results: "
                "see its status.targets[].learnedFrom.")
        return 0 if (run.get("status") or {}).get("phase") == "Succeeded" else 1
    finally:
        if args.keep:
            _kept(cluster, args.state_dir, say)
        else:
            cluster.down()


def _start_services(cluster: Any, say: Callable[[str], None]) -> None:
    """The simulator and the operator as processes of the cluster (they outlive the demo
    with --keep, and `fleettune cluster down` stops them)."""
    from fleettune_dev.cluster.network import free_port

    kubeconfig = str(cluster.kubeconfig)
    env = {**os.environ, "KUBECONFIG": kubeconfig}
    metrics = free_port()
    commands = {
        "simulator": [sys.executable, "-m", "fleettune.cli", "simulate", "--kubeconfig", kubeconfig,
                      "--state-dir", str(cluster.state_dir), "--verbose"],
        "operator": [sys.executable, "-m", "fleettune.cli", "operator", "--all-namespaces",
                     "--metrics-address", "127.0.0.1", "--metrics-port", str(metrics)],
    }
    for name in SERVICES:
        rec, new = cluster.start_service(name, commands[name], env=env)
        extra = f", metrics http://127.0.0.1:{metrics}/metrics" if name == "operator" and new else ""
        say(f"  {name}: pid {rec.pid}{'' if new else ' (already running)'}, log {cluster.logs_dir / f'{name}.log'}"
            f"{extra}")


def _kept(cluster: Any, state_dir: Path, say: Callable[[str], None]) -> None:
    from fleettune_dev.cluster import processes
    from fleettune_dev.cluster.local import DEFAULT_STATE_DIR

    if not cluster.kubeconfig.is_file():
        return
    where = "" if Path(state_dir).expanduser().resolve() == DEFAULT_STATE_DIR.resolve() else f" --state-dir {state_dir}"
    say("\nStill running (--keep):")
    for name, rec in cluster.services().items():
        state = f"pid {rec.pid}" if processes.is_alive(rec) else "NOT RUNNING"
        say(f"  {name}: {state}, log {cluster.logs_dir / f'{name}.log'}")
    say(f"  control plane: `fleettune cluster status{where}`, logs in {cluster.logs_dir}")
    say(f"  export KUBECONFIG={cluster.kubeconfig}")
    say(f"  {cluster.kubectl_path()} get tuningruns")
    say(f"  fleettune cluster down{where}    # stops all of it")


def run_name(manifest: str) -> str:
    """The name of the (first) TuningRun in a manifest, which may hold other objects too (a
    user kernel's ConfigMap): kubectl's ``jsonpath={.metadata.name}`` over such a file is a
    List, and its name is empty."""
    for doc in yaml.safe_load_all(manifest):
        if isinstance(doc, dict) and doc.get("kind") == KIND:
            return str((doc.get("metadata") or {}).get("name") or "")
    raise ValueError(f"the manifest holds no {KIND}")


def _watch(cluster: Any, name: str, console: Console, started: float, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    run: dict[str, Any] = {"metadata": {"name": name}}
    with Live(_table(run, 0), console=console, refresh_per_second=2) as live:
        while time.monotonic() < deadline:
            out = cluster.kubectl("get", f"{PLURAL}.{VERSION}.{GROUP}", name, "-o", "json", check=False)
            if out.returncode == 0:
                run = json.loads(out.stdout)
            live.update(_table(run, time.monotonic() - started))
            if (run.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                break
            _check_services(cluster)
            time.sleep(1.0)
        else:
            raise TimeoutError(f"{name} did not finish within {timeout:.0f}s")
    return run


def _check_services(cluster: Any) -> None:
    from fleettune_dev.cluster import processes

    for name, rec in cluster.services().items():
        if name in SERVICES and not processes.is_alive(rec):
            log = cluster.logs_dir / f"{name}.log"
            try:
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
            except OSError:
                tail = "(no log)"
            raise RuntimeError(f"the {name} exited; last lines of {log}:\n{tail}")
