"""`fleettune operator`: run the operator against the current kubeconfig (or in-cluster)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import random

import kopf


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

    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import fleettune.controller.handlers  # noqa: F401  (registers the handlers)
    from fleettune import metrics

    if args.metrics_port:
        metrics.start_http_server(args.metrics_port, args.metrics_address)
    priority = args.priority
    if priority is None:
        priority = random.SystemRandom().randint(1, 2**31 - 1) if args.peering else 0

    asyncio.run(
        kopf.operator(
            clusterwide=not args.namespace,
            namespaces=args.namespace or [],
            standalone=args.peering is None,
            peering_name=args.peering,
            priority=priority,
            liveness_endpoint=args.liveness,
        )
    )
    return 0
