"""promtool, Prometheus's own checker of metrics and rules (the chart's tests): Debian's
package where apt reaches it, else built from the Go module proxy and cached by version
next to the control-plane binaries (`fleettune_dev.cluster.binaries`).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from fleettune_dev.cluster.binaries import Progress, _run, build_log, cache_root, exclusive, to_stderr

# Prometheus 3.x publishes its Go module as v0.3MM.P for release 3.MM.P.
PROMETHEUS_VERSION = "v0.316.0"


def prometheus_release(version: str = PROMETHEUS_VERSION) -> str:
    """The Prometheus release of a Go module version: v0.316.0 -> 3.16.0."""
    minor, patch = version.removeprefix("v0.").split(".")
    return f"{int(minor) // 100}.{int(minor) % 100}.{patch}"


def _debian_promtool(out: Path, say: Progress) -> Path | None:
    """Debian's promtool (package ``prometheus``), unpacked into ``out``; None where apt
    cannot fetch it. Seconds instead of a 7-minute build on 2 cores: `check metrics`,
    `check rules` and `test rules` are all the tests need, and Debian's Prometheus (2.42 on
    bookworm) has them."""
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        return None
    with tempfile.TemporaryDirectory(prefix="fleettune-promtool-") as tmp:
        for refresh in (False, True):
            if refresh:  # a machine whose package lists were never fetched
                subprocess.run(["apt-get", "update", "-qq"], capture_output=True, timeout=300, check=False)
            got = subprocess.run(["apt-get", "download", "-qq", "prometheus"], cwd=tmp, capture_output=True,
                                 text=True, timeout=300, check=False)
            debs = sorted(Path(tmp).glob("prometheus_*.deb"))
            if got.returncode == 0 and debs:
                break
        else:
            say(f"Debian's promtool is not available ({got.stderr.strip()[-200:]}): building it instead")
            return None
        subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(Path(tmp) / "x")], check=True, timeout=300)
        tmp_out = out.with_name(out.name + ".partial")
        shutil.rmtree(tmp_out, ignore_errors=True)
        tmp_out.mkdir(parents=True)
        shutil.copyfile(Path(tmp) / "x" / "usr" / "bin" / "promtool", tmp_out / "promtool")
        (tmp_out / "promtool").chmod(0o755)
        version = subprocess.run([str(tmp_out / "promtool"), "--version"], capture_output=True, text=True,
                                 timeout=60, check=False)
        if version.returncode != 0:
            shutil.rmtree(tmp_out, ignore_errors=True)
            return None
        shutil.rmtree(out, ignore_errors=True)
        tmp_out.rename(out)
        say(f"promtool from Debian's package {debs[0].name} ({version.stdout.splitlines()[0]})")
        return out / "promtool"


@exclusive("promtool")
def ensure_promtool(progress: Progress | None = None) -> Path:
    """Return the cached promtool (Prometheus's own checker): Debian's package where apt
    reaches it (`_debian_promtool`), else built on first use.

    Built with ``go install pkg@version`` (Prometheus's go.mod has no replace lines) and the
    ``remove_all_sd`` tag of Prometheus's Makefile: the service-discovery plugins (cloud SDKs)
    are left out, which `check metrics`, `check rules` and `test rules` never use, so only the
    modules that promtool's other packages import are downloaded.
    """
    say = progress or to_stderr
    root = cache_root()
    debian = root / "bin" / "promtool-debian"
    if (debian / "promtool").exists():
        return debian / "promtool"
    if (found := _debian_promtool(debian, say)) is not None:
        return found
    out = root / "bin" / f"promtool-{PROMETHEUS_VERSION}"
    if (out / "promtool").exists():
        return out / "promtool"
    if shutil.which("go") is None:
        raise RuntimeError("promtool: Go is required to build it (https://go.dev/dl)")
    label = f"promtool {PROMETHEUS_VERSION}"
    started = time.monotonic()
    log = build_log("promtool")
    log.unlink(missing_ok=True)
    say(f"building {label} from the Go module proxy (first use only; log: {log})")
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    common = "github.com/prometheus/common/version"
    ldflags = f"-s -w -X {common}.Version={prometheus_release()} -X {common}.Branch=HEAD"
    work = root / "src"
    work.mkdir(parents=True, exist_ok=True)
    # `go install pkg@version` builds outside any module, where -mod=mod (from _go_env) is refused.
    _run(["go", "install", "-v", "-pgo=off", "-tags", "remove_all_sd", "-ldflags", ldflags,
          f"github.com/prometheus/prometheus/cmd/promtool@{PROMETHEUS_VERSION}"],
         work, say, label, log, env={"GOBIN": str(tmp), "GOFLAGS": "-trimpath -buildvcs=false"})
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    say(f"built {label} in {(time.monotonic() - started) / 60:.1f} min")
    return out / "promtool"
