"""The local control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok)
and the fleet of fake GPU nodes it runs; see ``fleettune cluster --help``."""

from fleettune_dev.cluster.fleet import Fleet, FleetError, NodePool, default_fleet, load_fleet, parse_fleet
from fleettune_dev.cluster.local import ClusterError, LocalCluster

__all__ = [
    "ClusterError",
    "Fleet",
    "FleetError",
    "LocalCluster",
    "NodePool",
    "default_fleet",
    "load_fleet",
    "parse_fleet",
]
