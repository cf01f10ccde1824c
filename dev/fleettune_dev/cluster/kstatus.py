"""kstatus, the status library of sigs.k8s.io/cli-utils, built from the Go module proxy.

Flux (`wait: true`, `healthChecks`), `kpt live` and the cli-utils applier decide whether a
custom resource is InProgress, Current or Failed with `kstatus/status.Compute`. To check
what they will say of a TuningRun, a tiny Go program reads objects (a JSON array on
stdin) and prints, for each, kstatus's status and message (a JSON array on stdout).

It is built like the control plane (see `binaries`): a wrapper module against the
published module, cached outside the repository under ``bin/kstatus-<version>/``, so
only the first use on a machine pays for the build.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from fleettune_dev.cluster.binaries import Progress, _build_module, cache_root, exclusive, to_stderr

KSTATUS_VERSION = "v0.37.2"  # sigs.k8s.io/cli-utils

_MAIN = """\
// Reads a JSON array of Kubernetes objects on stdin; prints, for each, what kstatus
// (sigs.k8s.io/cli-utils/pkg/kstatus/status.Compute) says of it.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

type result struct {
	Status  string `json:"status"`
	Message string `json:"message"`
	Error   string `json:"error,omitempty"`
}

func main() {
	data, err := io.ReadAll(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kstatus: reading stdin:", err)
		os.Exit(2)
	}
	// Kubernetes' JSON reader: whole numbers become int64, as in objects read from the API.
	var objects []interface{}
	if err := utiljson.Unmarshal(data, &objects); err != nil {
		fmt.Fprintln(os.Stderr, "kstatus: reading a JSON array of objects:", err)
		os.Exit(2)
	}
	out := make([]result, 0, len(objects))
	for _, item := range objects {
		obj, ok := item.(map[string]interface{})
		if !ok {
			out = append(out, result{Status: "Error", Error: "not an object"})
			continue
		}
		res, err := status.Compute(&unstructured.Unstructured{Object: obj})
		if err != nil {
			out = append(out, result{Status: "Error", Error: err.Error()})
			continue
		}
		out = append(out, result{Status: res.Status.String(), Message: res.Message})
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fmt.Fprintln(os.Stderr, "kstatus:", err)
		os.Exit(1)
	}
}
"""


@exclusive("kstatus")
def ensure_kstatus(progress: Progress | None = None) -> Path:
    """The cached kstatus program, built on first use (about a minute or two on a cold cache)."""
    out = cache_root() / "bin" / f"kstatus-{KSTATUS_VERSION}"
    if not (out / "kstatus").exists():
        gomod = f"module local.test/kstatus\n\ngo 1.24.0\n\nrequire sigs.k8s.io/cli-utils {KSTATUS_VERSION}\n"
        _build_module(cache_root() / "src" / "kstatusbin", gomod, ["."], out, "-s -w", progress or to_stderr,
                      f"kstatus {KSTATUS_VERSION}", sources={"main.go": _MAIN})
    return out / "kstatus"


def compute(objects: list[dict[str, Any]], binary: Path | None = None) -> list[dict[str, str]]:
    """kstatus's verdict on each object: ``{"status": "InProgress" | "Current" | "Failed" |
    "Terminating" | "NotFound" | "Unknown", "message": ...}`` (``status: Error`` with
    ``error`` when kstatus could not read it)."""
    exe = binary or ensure_kstatus()
    proc = subprocess.run([str(exe)], input=json.dumps(objects), capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise RuntimeError(f"kstatus failed ({proc.returncode}): {proc.stderr.strip()}")
    results: list[dict[str, str]] = json.loads(proc.stdout)
    return results


if __name__ == "__main__":
    print(ensure_kstatus())
