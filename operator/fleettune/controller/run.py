"""`fleettune operator`: run the operator against the current kubeconfig (or in-cluster)."""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import ctypes.util
import logging
import random
from concurrent.futures import ThreadPoolExecutor

import kopf

# Worker threads for the runs' blocking API calls and model fits (asyncio's default is
# min(32, CPUs + 4): 6 on a 2-CPU pod, which 20 runs stepping at once would queue behind).
WORKER_THREADS = 32


def _limit_malloc_arenas(arenas: int = 2) -> None:
    """glibc gives each thread its own malloc arena: with dozens of worker threads that is
    hundreds of MiB of fragmented, never-returned memory. Two arenas are plenty here."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(-8, arenas)  # M_ARENA_MAX
    except (OSError, AttributeError):  # not glibc: nothing to limit
        pass


async def _serve(**kwargs: object) -> None:
    asyncio.get_running_loop().set_default_executor(
        ThreadPoolExecutor(max_workers=WORKER_THREADS, thread_name_prefix="fleettune-worker")
    )
    await kopf.operator(**kwargs)  # type: ignore[arg-type]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="fleettune operator", description=__doc__)
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", action="append", help="watch only this namespace (repeatable)")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch every namespace (default)")
    parser.add_argument("--liveness", default=None, help="e.g. http://0.0.0.0:8081/healthz")
    parser.add_argument("--peering", default=None, help="kopf peering name for HA (default: standalone)")
    parser.add_argument(
        "--priority", type=int, default=None,
        help="kopf peering priority (default with --peering: random, since equal priorities all pause)",
    )
    parser.add_argument("--metrics-port", type=int, default=8080, help="Prometheus /metrics port (0: off)")
    parser.add_argument("--metrics-address", default="0.0.0.0", help="address the /metrics server binds")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)

    from kubernetes.config import ConfigException

    from fleettune import logs
    from fleettune.controller.kube import load_api_client

    try:  # before kopf, whose answer would be a traceback about login handlers
        load_api_client().close()
    except ConfigException as exc:
        parser.exit(2, f"fleettune operator: no cluster to run against: not in a Pod, and the kubeconfig "
                       f"($KUBECONFIG or ~/.kube/config) cannot be used: {exc}\n")
    logs.setup(logging.DEBUG if args.verbose else logging.INFO)
    from fleettune.controller.handlers import OperatorState  # importing it registers the handlers
    from fleettune.metrics import operator_metrics, start_http_server

    try:
        state = OperatorState(metrics=operator_metrics())
    except ValueError as exc:  # a bad setting in the operator's environment (the chart's values)
        parser.error(str(exc))
    if args.metrics_port:
        start_http_server(state.metrics, args.metrics_port, args.metrics_address)
    priority = args.priority
    if priority is None:
        priority = random.SystemRandom().randint(1, 2**31 - 1) if args.peering else 0

    _limit_malloc_arenas()
    asyncio.run(
        _serve(
            clusterwide=not args.namespace,
            namespaces=args.namespace or [],
            standalone=args.peering is None,
            peering_name=args.peering,
            priority=priority,
            liveness_endpoint=args.liveness,
            memo=kopf.Memo(fleettune=state),
        )
    )
    return 0
