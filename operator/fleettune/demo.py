"""`fleettune demo`: tune the example convolution on a simulated three-pool GPU fleet.

Brings up a real control plane on loopback (etcd, kube-apiserver, controller-manager,
scheduler, KWOK fake GPU nodes), installs the CRD, starts the fleet simulator and the
operator, applies `examples/convolution-fleet.yaml`, shows live progress, and ends with
the best configuration per pool and its speed-up over the kernel's default.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from fleettune import GROUP, PLURAL, VERSION
from fleettune.crd import render

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "convolution-fleet.yaml"


def _table(run: dict[str, Any], elapsed: float) -> Table:
    status = run.get("status") or {}
    table = Table(title=f"TuningRun {run['metadata']['name']}: {status.get('phase', 'Pending')} ({elapsed:.0f}s)")
    columns = ("pool", "device", "phase", "trials", "running", "invalid", "infra", "best ms", "default ms", "speed-up")
    for col in columns:
        table.add_column(col, justify="left" if col in ("pool", "device", "phase") else "right")
    for t in status.get("targets", []):
        synthetic = (t.get("fingerprint") or {}).get("synthetic")
        best = t.get("best") or {}
        table.add_row(
            t["name"],
            (t.get("device") or "") + (" [synthetic]" if synthetic else ""),
            t.get("phase", ""),
            f"{t.get('completed', 0)}/{t.get('budget', 0)}",
            str(t.get("running", 0)),
            str(t.get("invalid", 0)),
            str(t.get("infraFailed", 0)),
            f"{best['objectiveMs']:.4g}" if best else "-",
            f"{t['defaultMs']:.4g}" if t.get("defaultMs") else "-",
            f"{t['speedup']:.2f}x" if t.get("speedup") else "-",
        )
    return table


def _summary(console: Console, run: dict[str, Any]) -> None:
    status = run.get("status") or {}
    console.print(f"\n[bold]Best configuration per pool[/bold] (phase {status.get('phase')}):")
    for t in status.get("targets", []):
        best = t.get("best")
        if not best:
            console.print(f"  {t['name']}: no valid result ({t.get('message', '')})")
            continue
        fp = t.get("fingerprint") or {}
        note = " — SYNTHETIC numbers (no recording of this GPU; simulated model)" if fp.get("synthetic") else (
            " — replayed from recorded measurements" if fp.get("simulated") else ""
        )
        speed = f", {t['speedup']:.2f}x faster than the default ({t['defaultMs']:.4g} ms)" if t.get("speedup") else ""
        console.print(f"  [bold]{t['name']}[/bold] ({t.get('device')}): {best['objectiveMs']:.4g} ms{speed}{note}")
        console.print(f"      {json.dumps(best['config'], separators=(',', ':'))}")


def main(argv: list[str]) -> int:
    from fleettune.cluster import LocalCluster, default_fleet
    from fleettune.cluster.binaries import cache_root
    from fleettune.sim import FleetSimulator

    parser = argparse.ArgumentParser(prog="fleettune demo", description=__doc__.splitlines()[0])
    parser.add_argument("--manifest", type=Path, default=EXAMPLE)
    parser.add_argument("--state-dir", type=Path, default=cache_root() / "clusters" / "demo")
    parser.add_argument(
        "--keep", action="store_true", help="leave the control plane up afterwards, to inspect the run and its results"
    )
    parser.add_argument("--timeout", type=float, default=900.0)
    args = parser.parse_args(argv)
    # Wide enough for the per-pool table even when the output is a file or a CI log.
    console = Console(width=None if sys.stdout.isatty() else 132)
    started = time.monotonic()

    cluster = LocalCluster(args.state_dir, default_fleet())
    console.rule("local control plane")
    cluster.up(progress=lambda msg: console.print(f"  {msg}"))
    console.print(f"  up in {time.monotonic() - started:.1f}s; export KUBECONFIG={cluster.kubeconfig}")
    operator = None
    simulator = FleetSimulator(cluster.kubeconfig, default_fleet())
    try:
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as crd:
            crd.write(render())
        cluster.kubectl("apply", "--server-side", "-f", crd.name)
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{PLURAL}.{GROUP}", "--timeout=60s")
        simulator.start()
        env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
        log = open(args.state_dir / "operator.log", "w")  # noqa: SIM115 (lives as long as the process)
        operator = subprocess.Popen(
            [sys.executable, "-m", "fleettune.cli", "operator", "--all-namespaces"],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )
        console.print(f"  operator pid {operator.pid}, log {args.state_dir / 'operator.log'}")
        cluster.kubectl("apply", "--server-side", "-f", str(args.manifest))
        name = cluster.kubectl("get", "-f", str(args.manifest), "-o", "jsonpath={.metadata.name}").stdout.strip()
        console.rule(f"tuning {name}")
        run = _watch(cluster, name, console, started, args.timeout, operator)
        _summary(console, run)
        console.print(f"\nDemo finished in {time.monotonic() - started:.0f}s.")
        if args.keep:
            console.print(
                f"The control plane is still up (operator and simulator stopped):\n"
                f"  kubectl --kubeconfig {cluster.kubeconfig} get tuningruns\n"
                f"  fleettune report {name} --kubeconfig {cluster.kubeconfig}\n"
                f"  fleettune cluster down --state-dir {args.state_dir}"
            )
        return 0 if (run.get("status") or {}).get("phase") == "Succeeded" else 1
    finally:
        if operator is not None:
            operator.terminate()
            operator.wait(timeout=30)
        simulator.stop()
        if not args.keep:
            cluster.down()


def _watch(cluster: Any, name: str, console: Console, started: float, timeout: float, operator: Any) -> dict[str, Any]:
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
            if operator.poll() is not None:
                raise RuntimeError(f"the operator exited with {operator.returncode}; see its log")
            time.sleep(1.0)
        else:
            raise TimeoutError(f"{name} did not finish within {timeout:.0f}s")
    return run
