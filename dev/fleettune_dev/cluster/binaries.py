"""Build and cache the control-plane binaries from the Go module proxy.

Kubernetes publishes no installable `cmd/...` module (its go.mod maps every staging
module to ./staging with replace lines, which a dependant cannot inherit), so each
component is built from a tiny wrapper module that repeats those replaces against the
published staging modules. Binaries are cached outside the repository, keyed by
version, so only the first run on a machine pays for the build.

A build says one line when it starts (with the path of its full log), one when it ends,
and a heartbeat every few minutes: Go's per-module download and per-package lines go to
the log only, whose path a failure repeats with the last lines.
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

KUBE_VERSION = "v1.34.10"
ETCD_VERSION = "v3.5.33"
KWOK_VERSION = "v0.8.0"
HELM_VERSION = "v3.19.5"
# The Kueue manager (kubernetes-sigs/kueue), for the tests that run Jobs under Kueue.
KUEUE_VERSION = "v0.15.0"

# The staging modules of k8s.io/kubernetes 1.34 (from its go.mod `=> ./staging` lines).
_STAGING = (
    "api", "apiextensions-apiserver", "apimachinery", "apiserver", "cli-runtime", "client-go",
    "cloud-provider", "cluster-bootstrap", "code-generator", "component-base", "component-helpers",
    "controller-manager", "cri-api", "cri-client", "csi-translation-lib",
    "dynamic-resource-allocation", "endpointslice", "externaljwt", "kms", "kube-aggregator",
    "kube-controller-manager", "kube-proxy", "kube-scheduler", "kubectl", "kubelet", "metrics",
    "mount-utils", "pod-security-admission", "sample-apiserver", "sample-cli-plugin",
    "sample-controller",
)

KUBE_COMPONENTS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")

Progress = Callable[[str], None]
HEARTBEAT_S = 300.0


def cache_root() -> Path:
    base = os.environ.get("FLEETTUNE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "fleettune"
    )
    return Path(base)


T = TypeVar("T")


def to_stderr(msg: str) -> None:
    """The builders' progress where the caller passes none."""
    print(msg, file=sys.stderr, flush=True)


def exclusive(name: str) -> Callable[[Callable[[Progress | None], T]], Callable[[Progress | None], T]]:
    """Run a cache builder under an exclusive lock of the cache (``locks/<name>.lock``).

    Two processes that need the same tool (the two workers of `make test`, a demo beside
    a test run) would otherwise build it at once into the same work directory and
    ``.partial`` output, each deleting the other's; with the lock the second waits, then
    finds the tool built."""

    def wrap(build: Callable[[Progress | None], T]) -> Callable[[Progress | None], T]:
        @functools.wraps(build)
        def locked(progress: Progress | None = None) -> T:
            path = cache_root() / "locks" / f"{name}.lock"
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("w") as fh:
                try:
                    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    say = progress or to_stderr
                    say(f"waiting for another process to finish building {name}")
                    fcntl.flock(fh, fcntl.LOCK_EX)
                return build(progress)

        return locked

    return wrap


@dataclass(frozen=True)
class Binaries:
    kube_dir: Path
    etcd: Path
    kwok: Path
    kwok_stages: Path

    def kube(self, name: str) -> Path:
        return self.kube_dir / name


def _go_env() -> dict[str, str]:
    env = dict(os.environ)
    # Only the module proxy is reachable: never fall back to `direct` VCS fetches, and the
    # checksum database is not reachable either.
    proxy = subprocess.run(
        ["go", "env", "GOPROXY"], capture_output=True, text=True, check=True
    ).stdout.strip()
    proxies = [p for p in proxy.split(",") if p and p not in ("direct", "off")]
    if proxies:
        env["GOPROXY"] = ",".join(proxies)
    env.update(
        CGO_ENABLED="0",
        GOSUMDB="off",
        GOTOOLCHAIN="local",
        GOFLAGS="-trimpath -buildvcs=false -mod=mod",
    )
    return env


def build_log(label: str) -> Path:
    """Where the full output of building ``label`` goes."""
    return cache_root() / "logs" / f"build-{label}.log"


def _run(cmd: list[str], cwd: Path, progress: Progress, label: str, log: Path,
         env: dict[str, str] | None = None) -> None:
    started = time.monotonic()
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as out:
        out.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(cmd)} (in {cwd})\n")
        out.flush()
        proc = subprocess.Popen(
            cmd, cwd=cwd, env={**_go_env(), **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True,
        )
        assert proc.stdout is not None
        tail: list[str] = []
        downloaded = built = 0
        last_report = started
        for line in proc.stdout:
            out.write(line)
            tail = [*tail[-14:], line.rstrip()]
            if line.startswith("go: downloading"):
                downloaded += 1
            elif not line.startswith(("#", " ", "\t")) and "/" in line and " " not in line.strip():
                built += 1  # `go build -v` names each package as it compiles it
            if time.monotonic() - last_report >= HEARTBEAT_S:
                last_report = time.monotonic()
                progress(f"{label}: still building ({downloaded} modules downloaded, {built} packages "
                         f"compiled, {(last_report - started) / 60:.0f} min)")
        code = proc.wait()
    if code != 0:
        raise RuntimeError(f"{label}: `{' '.join(cmd[:3])} ...` failed with exit code {code}; last lines:\n"
                           + "\n".join(tail) + f"\nfull log: {log}")


def _kube_gomod() -> str:
    replaces = "\n".join(f"\tk8s.io/{m} => k8s.io/{m} v0.{KUBE_VERSION[3:]}" for m in _STAGING)
    return (
        "module local.test/k8sbin\n\ngo 1.24.0\n\ngodebug default=go1.24\n\n"
        f"require k8s.io/kubernetes {KUBE_VERSION}\n\nreplace (\n{replaces}\n)\n"
    )


def _ldflags_kube() -> str:
    major, minor = KUBE_VERSION[1:].split(".")[:2]
    flags = ["-s", "-w"]
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {pkg}.gitVersion={KUBE_VERSION}",
            f"-X {pkg}.gitMajor={major}",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean",
        ]
    return " ".join(flags)


def _build_module(
    work: Path,
    gomod: str,
    packages: list[str],
    out: Path,
    ldflags: str,
    progress: Progress,
    label: str,
    finish: Callable[[Path], None] | None = None,
    sources: dict[str, str] | None = None,
) -> None:
    """Build ``packages`` of the module ``gomod`` (plus ``sources``: files of its own, for a
    program of ours such as kstatus, whose package is ".") into ``out``."""
    if shutil.which("go") is None:
        raise RuntimeError(f"{label}: Go is required to build the control plane (https://go.dev/dl)")
    started = time.monotonic()
    log = build_log(label.split()[0])
    log.unlink(missing_ok=True)
    progress(f"building {label} from the Go module proxy (first use only; log: {log})")
    work.mkdir(parents=True, exist_ok=True)
    (work / "go.mod").write_text(gomod)
    for name, text in (sources or {}).items():
        (work / name).write_text(text)
    if external := [p for p in packages if not p.startswith(".")]:
        # A blank-import file keeps `go mod tidy` from pruning the requirement.
        (work / "tools.go").write_text(
            "//go:build tools\n\npackage tools\n\nimport (\n"
            + "".join(f'\t_ "{p}"\n' for p in external)
            + ")\n"
        )
    _run(["go", "mod", "tidy"], work, progress, label, log)
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    _run(
        ["go", "build", "-v", "-pgo=off", "-ldflags", ldflags, "-o", str(tmp) + "/", *packages],
        work,
        progress,
        label,
        log,
    )
    if finish is not None:
        finish(tmp)
    # Rename last so an interrupted build never leaves a half-filled cache entry behind.
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    progress(f"built {label} in {(time.monotonic() - started) / 60:.1f} min")


def _ensure_kube(root: Path, progress: Progress) -> Path:
    out = root / "bin" / f"kubernetes-{KUBE_VERSION}"
    if all((out / c).exists() for c in KUBE_COMPONENTS):
        return out
    pkgs = [f"k8s.io/kubernetes/cmd/{c}" for c in KUBE_COMPONENTS]
    _build_module(root / "src" / "k8sbin", _kube_gomod(), pkgs, out, _ldflags_kube(), progress,
                  f"kubernetes {KUBE_VERSION}")
    return out


def _ensure_etcd(root: Path, progress: Progress) -> Path:
    out = root / "bin" / f"etcd-{ETCD_VERSION}"
    # `go build -o dir/` names the binary after the package's last path element, `server`.
    if (out / "server").exists() and not (out / "etcd").exists():
        (out / "server").rename(out / "etcd")
    if (out / "etcd").exists():
        return out / "etcd"

    def rename(tmp: Path) -> None:
        (tmp / "server").rename(tmp / "etcd")

    # A separate module: k8s.io/apiserver requires etcd server 3.6, which MVS would impose.
    gomod = f"module local.test/etcdbin\n\ngo 1.25.0\n\nrequire go.etcd.io/etcd/server/v3 {ETCD_VERSION}\n"
    _build_module(
        root / "src" / "etcdbin", gomod, ["go.etcd.io/etcd/server/v3"], out, "-s -w", progress,
        f"etcd {ETCD_VERSION}", rename,
    )
    return out / "etcd"


KWOK_CRDS = ("kwok.x-k8s.io_logs.yaml",)


def _ensure_kwok(root: Path, progress: Progress) -> tuple[Path, Path]:
    out = root / "bin" / f"kwok-{KWOK_VERSION}"
    work = root / "src" / "kwokbin"

    def copy_stages(dest: Path) -> None:
        # plain `kwok` ships no stages (only kwokctl injects them): keep the release's stage
        # YAML next to the binary, so the cache entry works without the module cache.
        shutil.copytree(_kwok_module_dir(work) / "kustomize" / "stage", dest / "stages",
                        ignore=shutil.ignore_patterns("*.go", "testdata"), copy_function=shutil.copyfile)
        # The module cache is read-only; a copy that kept its modes could not be deleted later.
        for d in [dest / "stages", *(p for p in (dest / "stages").rglob("*") if p.is_dir())]:
            d.chmod(0o755)
        copy_crds(dest)

    def copy_crds(dest: Path) -> None:
        # The CRDs of the kwok objects the cluster uses (`Logs`: a fake Pod's log file).
        (dest / "crds").mkdir(mode=0o755, exist_ok=True)
        for name in KWOK_CRDS:
            shutil.copyfile(_kwok_module_dir(work) / "kustomize" / "crd" / "bases" / name, dest / "crds" / name)

    if not (out / "kwok").exists():
        gomod = f"module local.test/kwokbin\n\ngo 1.26.0\n\nrequire sigs.k8s.io/kwok {KWOK_VERSION}\n"
        _build_module(work, gomod, ["sigs.k8s.io/kwok/cmd/kwok"], out, "-s -w", progress, f"kwok {KWOK_VERSION}",
                      copy_stages)
    elif not (out / "stages").is_dir():
        copy_stages(out)
    elif not all((out / "crds" / name).is_file() for name in KWOK_CRDS):
        copy_crds(out)
    return out / "kwok", out / "stages"


def _kwok_module_dir(work: Path) -> Path:
    proc = subprocess.run(
        ["go", "list", "-m", "-f", "{{.Dir}}", f"sigs.k8s.io/kwok@{KWOK_VERSION}"],
        cwd=work,
        env=_go_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(proc.stdout.strip())


@exclusive("helm")
def ensure_helm(progress: Progress | None = None) -> Path:
    """Return the cached helm binary, building it on first use (a few minutes on a cold cache)."""
    say = progress or to_stderr
    root = cache_root()
    out = root / "bin" / f"helm-{HELM_VERSION}"
    if (out / "helm").exists():
        return out / "helm"
    pkg = "helm.sh/helm/v3"
    major, minor = KUBE_VERSION[1:].split(".")[:2]
    # Without these (from helm's Makefile) `helm version` says v3.19 and `helm template`
    # renders for Kubernetes 1.20, so `.Capabilities` checks in charts would lie.
    ldflags = (
        f"-s -w -X {pkg}/internal/version.version={HELM_VERSION}"
        f" -X {pkg}/pkg/chartutil.k8sVersionMajor={major} -X {pkg}/pkg/chartutil.k8sVersionMinor={minor}"
    )
    gomod = f"module local.test/helmbin\n\ngo 1.24.0\n\nrequire {pkg} {HELM_VERSION}\n"
    _build_module(root / "src" / "helmbin", gomod, [f"{pkg}/cmd/helm"], out, ldflags, say, f"helm {HELM_VERSION}")
    return out / "helm"


@exclusive("kueue")
def ensure_kueue(progress: Progress | None = None) -> tuple[Path, Path]:
    """Return the cached Kueue manager and the directory of its manifests (``crd/`` and
    ``webhook/``: Kueue's config/components/ kustomize bases of the CRDs and the webhook
    configurations), building it on first use (see `fleettune_dev.cluster.kueue`).

    Kueue's go.mod has no replace lines, so a wrapper module that requires it is enough.
    The manifests are copied from the module next to the binary, like kwok's stages, so
    the cache entry works without the module cache.
    """
    say = progress or to_stderr
    root = cache_root()
    out = root / "bin" / f"kueue-{KUEUE_VERSION}"
    work = root / "src" / "kueuebin"
    module = "sigs.k8s.io/kueue"

    def copy_manifests(dest: Path) -> None:
        src = _module_dir(work, module, KUEUE_VERSION) / "config" / "components"
        shutil.rmtree(dest / "manifests", ignore_errors=True)
        for sub in ("crd", "webhook"):
            shutil.copytree(src / sub, dest / "manifests" / sub, copy_function=shutil.copyfile,
                            ignore=lambda _, names: [n for n in names if "." in n and not n.endswith(".yaml")])
        # The module cache is read-only; a copy that kept its modes could not be deleted later.
        for d in [dest / "manifests", *(p for p in (dest / "manifests").rglob("*") if p.is_dir())]:
            d.chmod(0o755)

    if not (out / "kueue").exists():
        gomod = f"module local.test/kueuebin\n\ngo 1.25.0\n\nrequire {module} {KUEUE_VERSION}\n"
        ldflags = f"-s -w -X {module}/pkg/version.GitVersion={KUEUE_VERSION}"
        _build_module(work, gomod, [f"{module}/cmd/kueue"], out, ldflags, say, f"kueue {KUEUE_VERSION}",
                      copy_manifests)
    elif not (out / "manifests" / "crd" / "kustomization.yaml").is_file():
        copy_manifests(out)
    return out / "kueue", out / "manifests"


def _module_dir(work: Path, module: str, version: str) -> Path:
    """Where the module cache holds ``module@version`` (downloading it if needed)."""
    proc = subprocess.run(
        ["go", "mod", "download", "-json", f"{module}@{version}"],
        cwd=work,
        env=_go_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(json.loads(proc.stdout)["Dir"])


@exclusive("control-plane")
def ensure_binaries(progress: Progress | None = None) -> Binaries:
    """Return the cached binaries, building whatever is missing (minutes on a cold cache)."""
    say = progress or to_stderr
    root = cache_root()
    etcd = _ensure_etcd(root, say)
    kwok, kwok_stages = _ensure_kwok(root, say)
    kube = _ensure_kube(root, say)
    return Binaries(kube_dir=kube, etcd=etcd, kwok=kwok, kwok_stages=kwok_stages)


if __name__ == "__main__":
    b = ensure_binaries()
    print(b)
