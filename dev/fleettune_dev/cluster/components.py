"""The control plane's components as plain processes: their start order, the ports each
needs, their command lines and readiness endpoints, and the files they read (the admin
kubeconfig, kwok's stages). Pure but for writing the kubeconfig; `LocalCluster` starts,
watches and stops the processes.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from fleettune_dev.cluster.binaries import Binaries
from fleettune_dev.cluster.fleet import KWOK_ANNOTATION, packaged_data_dir
from fleettune_dev.cluster.pki import SERVICE_CIDR, Pki


class ClusterError(RuntimeError):
    """The local control plane (or a command against it) failed; the message says which part."""


COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
# Ports each component needs, by the name they are stored under in state.json.
COMPONENT_PORTS = {
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


def component_argv(name: str, bins: Binaries, state: Mapping[str, Any], pki: Pki, kubeconfig: Path,
                   state_dir: Path) -> list[str]:
    """The command line of component ``name``, from the cluster's ``state`` (state.json:
    its ports and advertise address), certificates and files."""
    p = state["ports"]
    kc = str(kubeconfig)
    if name == "etcd":
        client, peer = f"http://127.0.0.1:{p['etcd-client']}", f"http://127.0.0.1:{p['etcd-peer']}"
        return [str(bins.etcd), "--name=fleettune", f"--data-dir={state_dir / 'etcd'}",
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
                f"--advertise-address={state['advertise_address']}",
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
                f"--config={state_dir / 'kwok-stages.yaml'}"]
    raise KeyError(name)


def health_url(name: str, ports: Mapping[str, int], pki: Pki) -> tuple[str, ssl.SSLContext | None]:
    """Where component ``name`` answers 200 once it is ready, and the TLS context to ask with."""
    p = ports
    insecure = ssl.create_default_context()
    # KCM and the scheduler serve with a self-signed certificate made at start-up.
    insecure.check_hostname = False
    insecure.verify_mode = ssl.CERT_NONE
    if name == "etcd":
        return f"http://127.0.0.1:{p['etcd-client']}/health", None
    if name == "kube-apiserver":
        return f"https://127.0.0.1:{p['kube-apiserver']}/readyz", ssl.create_default_context(
            cafile=str(pki.ca_crt))
    if name == "kwok":
        return f"http://127.0.0.1:{p['kwok']}/healthz", None
    return f"https://127.0.0.1:{p[name]}/healthz", insecure


def write_kubeconfig(path: Path, server: str, pki: Pki) -> None:
    """The admin kubeconfig of the cluster at ``server``, replaced whole (a reader never sees half of it)."""
    import base64

    def b64(p: Path) -> str:
        return base64.b64encode(p.read_bytes()).decode()

    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fleettune-local", "cluster": {
            "server": server, "certificate-authority-data": b64(pki.ca_crt)}}],
        "users": [{"name": "fleettune-admin", "user": {
            "client-certificate-data": b64(pki.admin_crt), "client-key-data": b64(pki.admin_key)}}],
        "contexts": [{"name": "fleettune-local", "context": {
            "cluster": "fleettune-local", "user": "fleettune-admin"}}],
        "current-context": "fleettune-local",
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(doc, sort_keys=False))
    tmp.chmod(0o600)
    tmp.replace(path)


def kwok_stages(bins: Binaries) -> str:
    """kwok's stage configuration: KWOK_STAGES from its build, and fleettune's own."""
    docs = []
    for rel in KWOK_STAGES:
        src = bins.kwok_stages / rel
        if not src.is_file():
            raise ClusterError(f"kwok stage {src} is missing: rebuild kwok (rm -r {bins.kwok.parent})")
        docs.append(src.read_text().strip())
    for own in sorted((packaged_data_dir() / "kwok").glob("*.yaml")):
        docs.append(own.read_text().strip())
    return "\n---\n".join(docs) + "\n"
