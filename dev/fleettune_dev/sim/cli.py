"""`fleettune simulate`: answer trial Pods on fake GPU nodes from recorded measurements."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path

from fleettune_dev.cluster.fleet import FleetError, load_fleet
from fleettune_dev.cluster.local import DEFAULT_STATE_DIR, LocalCluster
from fleettune_dev.sim.builtin import modelled_kernels
from fleettune_dev.sim.startup import PodStartup


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fleettune simulate",
        description="Watch trial Pods (app.kubernetes.io/managed-by=fleettune) bound to KWOK fake "
        "nodes and complete each with the result its pool's GPU recorded (or a synthetic model's, "
        "marked synthetic), through the same termination-message protocol as the real job. User CUDA "
        "source is compiled for real with NVRTC (compile errors are the compiler's) and timed by a "
        "synthetic model. A batch Pod measures its configurations in order, compiling ahead on its node's "
        "CPUs while the GPU times earlier ones, and one deleted mid-batch keeps the answers it reached. "
        "A Pod whose node is deleted is never answered. Pods on real nodes are never touched.",
    )
    p.add_argument("--kubeconfig", type=Path, default=None,
                   help="default: $KUBECONFIG, else the local cluster's (see --state-dir)")
    p.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR,
                   help="local cluster whose kubeconfig and fleet to use (default: %(default)s)")
    p.add_argument("--fleet", type=Path, default=None,
                   help="fleet file (default: the one the local cluster was started with, else the demo fleet)")
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="multiply simulated durations (1.0: ~0.9 s per trial; 0 answers at once)")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic models' noise and start-up draws")
    p.add_argument("--pod-startup", action="store_true",
                   help="model each Pod's start-up (interpreter, imports, CUDA context) before its first "
                   "configuration: log-normal, see --startup-p50/--startup-p99 (default: off, Pods start at once)")
    p.add_argument("--startup-p50", type=float, default=PodStartup.p50_s, metavar="S",
                   help="median start-up with --pod-startup (default: %(default)s s)")
    p.add_argument("--startup-p99", type=float, default=PodStartup.p99_s, metavar="S",
                   help="99th-percentile start-up with --pod-startup (default: %(default)s s)")
    p.add_argument("-v", "--verbose", action="store_true", help="log every answered trial")
    return p


def main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        startup = PodStartup(args.startup_p50, args.startup_p99) if args.pod_startup else None
    except ValueError as exc:
        parser.error(str(exc))
    from fleettune import logs

    logs.setup(logging.INFO if args.verbose else logging.WARNING)
    from fleettune_dev.sim.simulator import FleetSimulator

    cluster = LocalCluster(args.state_dir)
    kubeconfig = args.kubeconfig or (Path(os.environ["KUBECONFIG"]) if os.environ.get("KUBECONFIG")
                                     else cluster.kubeconfig)
    try:
        fleet = load_fleet(args.fleet) if args.fleet else cluster.fleet
    except FleetError as exc:
        print(f"fleettune simulate: {exc}", file=sys.stderr)
        return 1
    if not kubeconfig.is_file():
        print(f"fleettune simulate: no kubeconfig at {kubeconfig} (run `fleettune cluster up`)", file=sys.stderr)
        return 1
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    sim = FleetSimulator(kubeconfig, fleet, time_scale=args.time_scale, seed=args.seed, startup=startup).start()
    synthetic = [f"{p.name}/{k}" for p in fleet.pools for k in sorted({*p.simulation.synthetic, *modelled_kernels(p)})]
    print(f"simulating pools {', '.join(fleet.pool_names())} against {kubeconfig}"
          + (f"; SYNTHETIC models (not measurements) for {', '.join(synthetic)}" if synthetic else ""),
          file=sys.stderr, flush=True)
    done.wait()
    sim.stop()
    print(f"answered {len(sim.answered)} configuration(s): "
          + ", ".join(f"{k}={v}" for k, v in sorted(sim.outcomes.items())), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
