"""`fleettune operator`: run the operator against the current kubeconfig (or in-cluster)."""

from __future__ import annotations

import argparse
import asyncio
import logging

import kopf


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="fleettune operator", description=__doc__)
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", action="append", help="watch only this namespace (repeatable)")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch every namespace (default)")
    parser.add_argument("--liveness", default=None, help="e.g. http://0.0.0.0:8081/healthz")
    parser.add_argument("--peering", default=None, help="kopf peering name for HA (default: standalone)")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)

    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import fleettune.controller.handlers  # noqa: F401  (registers the handlers)

    asyncio.run(
        kopf.operator(
            clusterwide=not args.namespace,
            namespaces=args.namespace or [],
            standalone=args.peering is None,
            peering_name=args.peering,
            liveness_endpoint=args.liveness,
        )
    )
    return 0
