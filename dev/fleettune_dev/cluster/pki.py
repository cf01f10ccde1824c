"""A throw-away certificate authority for one local control plane.

Everything is made with the ``openssl`` command line tool so that the operator needs no
extra Python dependency for a developer-only feature. Keys and certificates live in the
cluster's state directory and die with it.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

# The first address of the service range: in-cluster clients reach the apiserver as the
# `kubernetes` Service there, so the serving certificate must name it.
SERVICE_CIDR = "10.96.0.0/16"
KUBERNETES_SERVICE_IP = "10.96.0.1"


@dataclass(frozen=True)
class Pki:
    dir: Path

    @property
    def ca_crt(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.dir / "ca.key"

    @property
    def apiserver_crt(self) -> Path:
        return self.dir / "apiserver.crt"

    @property
    def apiserver_key(self) -> Path:
        return self.dir / "apiserver.key"

    @property
    def admin_crt(self) -> Path:
        return self.dir / "admin.crt"

    @property
    def admin_key(self) -> Path:
        return self.dir / "admin.key"

    @property
    def sa_key(self) -> Path:
        return self.dir / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.dir / "sa.pub"

    def complete(self) -> bool:
        files = (self.ca_crt, self.ca_key, self.apiserver_crt, self.apiserver_key,
                 self.admin_crt, self.admin_key, self.sa_key, self.sa_pub)
        return all(f.is_file() and f.stat().st_size > 0 for f in files)


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed: {proc.stderr.strip()}")


def _sign(pki: Pki, name: str, subject: str, extensions: str, days: int) -> None:
    d = pki.dir
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", subject,
             "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=d)
    (d / f"{name}.ext").write_text(extensions)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", str(days), "-sha256", "-extfile", f"{name}.ext",
             "-out", f"{name}.crt", cwd=d)
    (d / f"{name}.csr").unlink()
    (d / f"{name}.ext").unlink()


def ensure_pki(directory: Path, days: int = 3650) -> Pki:
    """Create the CA, serving, admin and service-account keys unless they already exist."""
    pki = Pki(directory)
    if pki.complete():
        return pki
    if shutil.which("openssl") is None:
        raise RuntimeError("the `openssl` command is required to create the local cluster's certificates")
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", str(days), "-sha256",
             "-subj", "/CN=fleettune-local-ca", "-keyout", "ca.key", "-out", "ca.crt", cwd=directory)
    sans = ",".join([
        "IP:127.0.0.1", "DNS:localhost", f"IP:{KUBERNETES_SERVICE_IP}", "DNS:kubernetes",
        "DNS:kubernetes.default", "DNS:kubernetes.default.svc", "DNS:kubernetes.default.svc.cluster.local",
    ])
    _sign(pki, "apiserver", "/CN=kube-apiserver",
          f"subjectAltName={sans}\nextendedKeyUsage=serverAuth\nkeyUsage=digitalSignature,keyEncipherment\n",
          days)
    # system:masters bypasses RBAC: the admin identity is shared by the controllers, kwok,
    # the tests and the operator run from a developer's shell.
    _sign(pki, "admin", "/O=system:masters/CN=fleettune-admin",
          "extendedKeyUsage=clientAuth\nkeyUsage=digitalSignature,keyEncipherment\n", days)
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=directory)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=directory)
    for key in directory.glob("*.key"):
        key.chmod(0o600)
    return pki
