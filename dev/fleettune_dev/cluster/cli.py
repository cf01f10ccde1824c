"""`fleettune cluster up|down|status`: the local control plane and its simulated GPU fleet."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from fleettune_dev.cluster.fleet import FleetError, load_fleet
from fleettune_dev.cluster.local import DEFAULT_STATE_DIR, ClusterError, LocalCluster


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fleettune cluster",
        description="A real Kubernetes control plane on 127.0.0.1 (etcd, kube-apiserver, "
        "kube-controller-manager, kube-scheduler) with KWOK fake GPU nodes. The binaries are "
        "built from the Go module proxy on first use (about 15 minutes, 20-30 under load) and cached under "
        "~/.cache/fleettune/bin.",
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR,
                        help="where certificates, etcd data, logs and the kubeconfig live "
                        "(default: %(default)s)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    up = sub.add_parser("up", parents=[common],
                        help="start the cluster (or whatever part of it is not running)")
    up.add_argument("--fleet", type=Path, default=None,
                    help="fleet file (YAML) describing the GPU node pools (default: the demo fleet, "
                    "dev/fleettune_dev/data/fleet-demo.yaml in a checkout, a commented example)")
    sub.add_parser("down", parents=[common], help="stop every component and the services started with it (the "
                   "demo's simulator and operator, and any fleettune command whose arguments or KUBECONFIG "
                   "name the state directory) and delete the state directory")
    st = sub.add_parser("status", parents=[common], help="what runs, on which ports, and the nodes of each pool")
    st.add_argument("--json", action="store_true", help="machine-readable output")
    return p


def _progress(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _up(args: argparse.Namespace) -> int:
    fleet = load_fleet(args.fleet) if args.fleet else None
    cluster = LocalCluster(args.state_dir, fleet)
    cluster.up(progress=_progress)
    print(f"kubeconfig: {cluster.kubeconfig}")
    print(f"export KUBECONFIG={cluster.kubeconfig}")
    return 0


def _down(args: argparse.Namespace) -> int:
    cluster = LocalCluster(args.state_dir)
    if not cluster.state_dir.exists():
        # What an earlier `down` could not find (an operator restarted by hand) still names it.
        stopped = cluster.stop_strays()
        print(f"no cluster in {cluster.state_dir}" + (f"; stopped {len(stopped)} process(es) started against it "
                                                       f"(pids {', '.join(map(str, stopped))})" if stopped else ""))
        return 0
    cluster.down()
    print(f"stopped; removed {cluster.state_dir}")
    return 0


def _status(args: argparse.Namespace) -> int:
    cluster = LocalCluster(args.state_dir)
    if not cluster.state_dir.exists():
        print(f"no cluster in {cluster.state_dir}")
        return 1
    st = cluster.status()
    if args.json:
        print(json.dumps(st, indent=2))
    else:
        print(f"state dir:  {st['state_dir']}")
        print(f"server:     {st['server']}")
        print(f"kubeconfig: {st['kubeconfig']}")
        for name, c in st["components"].items():
            ports = ", ".join(f"{k}={v}" for k, v in c["ports"].items())
            state = f"running (pid {c['pid']})" if c["running"] else "stopped"
            print(f"  {name:<24} {state:<22} {ports}")
        for name, svc in st["services"].items():
            state = f"running (pid {svc['pid']})" if svc["running"] else "stopped"
            print(f"  {name:<24} {state:<22} log {svc['log']}")
        if "nodes_error" in st:
            print(f"nodes: unavailable ({st['nodes_error']})")
        for pool, nodes in st["nodes"].items():
            ready = sum(n["ready"] for n in nodes)
            gpus = sum(int(n["gpus"] or 0) for n in nodes)
            arch = ",".join(sorted({n["arch"] or "?" for n in nodes}))
            print(f"  pool {pool:<18} {len(nodes)} node(s), {ready} Ready, {gpus} GPU(s), {arch}")
    return 0 if all(c["running"] for c in st["components"].values()) else 1


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        return {"up": _up, "down": _down, "status": _status}[args.command](args)
    except (ClusterError, FleetError) as exc:
        print(f"fleettune cluster {args.command}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
