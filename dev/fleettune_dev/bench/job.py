"""`fleettune bench job`: what the job image really costs per configuration on this
machine's GPU, beside Kernel Tuner on the same configurations, kernel source and GPU.

The timeline replay (`bench timeline`) charges each configuration the GPU time Kernel
Tuner recorded for it. This command checks that assumption on hardware: it draws
configurations from a recording whose parameters are a built-in kernel's
(``convolution_milo`` is the built-in ``convolution``), then

* **batch**: measures them as one batch Pod measures them (``run_batch``: one CUDA worker,
  NVRTC compiles ahead on the CPU cores), timing the whole batch from the supervisor's
  start to its last answer: the Pod holds the GPU for all of it;
* **single**: measures the first few as Pods of one configuration do (``run_batch`` of a
  batch of one each: a fresh worker, interpreter and CUDA context per configuration);
* **start-up**: a fresh interpreter importing cupy and creating a CUDA context;
* **kernel_tuner**: Kernel Tuner 1.x (``brute_force`` over exactly those configurations,
  cupy backend) on the same ``.cu`` file, its recorded compile, verification, benchmark
  and framework times per configuration and its wall-clock.

It prints GPU-seconds per evaluation for each, and the bound on hardware (fleettune's
GPU-seconds per evaluation against 1.25 × Kernel Tuner's verification + benchmark time
plus the measured start-up spread over the batch), and how well the two tools agree
(outcome per configuration; Spearman's rank correlation of the times). Needs an NVIDIA
GPU with cupy; elsewhere it says why and exits 2. Results: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

# The recorded spaces whose parameters are exactly a built-in kernel's (recording kernel
# family -> built-in name); other recordings have no source here to run.
BUILTIN_OF_FAMILY = {"convolution_milo": "convolution"}
BOUND_FACTOR = 1.25  # target: GPU-seconds per evaluation <= 1.25 x (verification + benchmark) + start-up share
STARTUP_PROBE = (
    "import time; t = time.perf_counter(); import cupy; cupy.cuda.runtime.getDeviceCount(); "
    "cupy.zeros(1).sum().item(); print(time.perf_counter() - t)"
)


def gpu_missing_reason() -> str | None:
    """None when cupy finds a usable CUDA device, else why not (the job image's own check)."""
    from fleettune_job.classify import NoGpu
    from fleettune_job.gpu import load_cupy

    try:
        load_cupy()
    except NoGpu as exc:
        return str(exc)
    return None


def device_name() -> str:
    from fleettune_job.fingerprint import device_fingerprint
    from fleettune_job.gpu import load_cupy

    return device_fingerprint(load_cupy()).product


@dataclass
class Measured:
    """One configuration as one tool saw it: ``ok`` or why not, its median (ms), and its
    costs in seconds (compile: off the GPU in a batch; gpu: the tool's GPU work on it)."""

    config: dict[str, Any]
    ok: bool
    time_ms: float | None = None
    compile_s: float = 0.0
    gpu_s: float = 0.0
    detail: str = ""
    extra: dict[str, float] = field(default_factory=dict)


def family_of(path: Path) -> str:
    return path.name.split(".")[0].rsplit("-", 1)[0]


def draw_configs(records: Sequence[Any], n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` distinct recorded configurations, uniformly (failures included, as a tuner meets them)."""
    rng = np.random.default_rng(seed)
    pick = rng.choice(len(records), size=min(n, len(records)), replace=False)
    return [dict(records[int(i)].config) for i in pick]


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rank correlation (average ranks for ties); nan under 3 pairs."""
    if len(a) < 3:
        return float("nan")
    from scipy.stats import spearmanr

    return float(spearmanr(a, b)[0])


def _job_env() -> dict[str, str]:
    import fleettune_job

    root = str(Path(fleettune_job.__file__).resolve().parents[1])
    return {"PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)}


def measure_startup(repeats: int) -> list[float]:
    """Seconds for a fresh interpreter to import cupy and make a CUDA context (a Pod's
    start-up on top of the container's own)."""
    out = []
    for _ in range(repeats):
        done = subprocess.run([sys.executable, "-c", STARTUP_PROBE], capture_output=True, text=True, check=True)
        out.append(float(done.stdout.strip().splitlines()[-1]))
    return out


def run_fleettune_batch(builtin: str, configs: list[dict[str, Any]], problem_size: list[int], warmups: int,
                        repeats: int, log_dir: Path) -> tuple[list[Measured], float]:
    from fleettune_job.ahead import AheadOptions
    from fleettune_job.batch import run_batch
    from fleettune_job.protocol import Batch, Entry, KernelRef

    batch = Batch(run="bench-job", target="local", kernel=KernelRef(builtin=builtin), problem_size=problem_size,
                  warmups=warmups, repeats=repeats, entries=[Entry(index=i, config=c) for i, c in enumerate(configs)])
    start = time.perf_counter()
    result = run_batch(batch, log_dir / "batch-termination-log", extra_env=_job_env(),
                       ahead=AheadOptions.from_environment(os.environ))
    wall = time.perf_counter() - start
    if result.error:
        print(f"batch: {result.error}", file=sys.stderr)
    answers = {a.i: a for a in result.answers}
    out = []
    for i, config in enumerate(configs):
        a = answers.get(i)
        if a is None:
            out.append(Measured(config, ok=False, detail="no answer"))
            continue
        out.append(Measured(config, ok=a.o.value == "ok", time_ms=a.t, compile_s=a.c or 0.0, gpu_s=a.r or 0.0,
                            detail="" if a.o.value == "ok" else f"{a.o.value}: {a.e[:120]}"))
    return out, wall


def run_fleettune_single(builtin: str, configs: list[dict[str, Any]], problem_size: list[int], warmups: int,
                         repeats: int) -> tuple[list[Measured], list[float]]:
    import tempfile

    from fleettune_job.ahead import AheadOptions
    from fleettune_job.batch import run_batch
    from fleettune_job.protocol import Batch, Entry, KernelRef

    out, walls = [], []
    with tempfile.TemporaryDirectory(prefix="bench-job-") as tmp:
        for i, config in enumerate(configs):
            one = Batch(run="bench-job", target="local", kernel=KernelRef(builtin=builtin), problem_size=problem_size,
                        warmups=warmups, repeats=repeats, entries=[Entry(index=i, config=config)])
            start = time.perf_counter()
            result = run_batch(one, Path(tmp) / f"termination-log-{i}", extra_env=_job_env(),
                               ahead=AheadOptions.from_environment(os.environ))
            walls.append(time.perf_counter() - start)
            if not result.answers:
                out.append(Measured(config, ok=False, detail=f"no answer: {result.error[:120]}"))
                continue
            a = result.answers[0]
            out.append(Measured(config, ok=a.o.value == "ok", time_ms=a.t, compile_s=a.c or 0.0, gpu_s=a.r or 0.0,
                                detail="" if a.o.value == "ok" else a.o.value))
    return out, walls


def run_kernel_tuner(builtin: str, configs: list[dict[str, Any]], problem_size: list[int],
                     iterations: int) -> tuple[list[Measured], float]:
    """Kernel Tuner on exactly ``configs`` of the built-in's own source, verified against the
    built-in's reference output; returns per-configuration results and its wall-clock."""
    import cupy
    import kernel_tuner

    from fleettune_job.kernels import BUILTINS

    kernel = BUILTINS[builtin]
    if builtin != "convolution":
        raise ValueError(f"no Kernel Tuner harness for the built-in {builtin!r}")
    keys = list(configs[0])
    tune_params = {k: sorted({c[k] for c in configs}) for k in keys}
    allowed = {tuple(c[k] for k in keys) for c in configs}
    width, height = problem_size
    rng = np.random.default_rng(0)
    any_config = dict(configs[0])
    inputs = {t.name: kernel.problem.fill(t, rng) for t in kernel.problem.inputs(problem_size, any_config)}
    reference = kernel.problem.reference(cupy, {k: cupy.asarray(v) for k, v in inputs.items()}, problem_size)
    answer = cupy.asnumpy(reference).astype(np.float32)
    output = np.zeros((height, width), dtype=np.float32)
    source = f"#define image_width {width}\n#define image_height {height}\n" + kernel.source

    def one_of_drawn(p: Mapping[str, Any]) -> bool:  # a def: Kernel Tuner rewrites lambdas from their source
        return tuple(p[k] for k in keys) in allowed

    start = time.perf_counter()
    results, _env = kernel_tuner.tune_kernel(
        kernel.function, source, (width, height), [output, inputs["input_image"], inputs["d_filter"]], tune_params,
        grid_div_x=["block_size_x", "tile_size_x"], grid_div_y=["block_size_y", "tile_size_y"],
        cmem_args={"d_filter": inputs["d_filter"]}, answer=[answer, None, None], atol=1e-3,
        restrictions=one_of_drawn, lang="cupy", strategy="brute_force",
        iterations=iterations, verbose=False, quiet=True)
    wall = time.perf_counter() - start
    by_key = {tuple(r[k] for k in keys): r for r in results}
    out = []
    for config in configs:
        r = by_key.get(tuple(config[k] for k in keys))
        if r is None:
            out.append(Measured(config, ok=False, detail="not evaluated"))
            continue
        costs = {name: float(r.get(name) or 0.0) / 1000.0
                 for name in ("compile_time", "verification_time", "benchmark_time", "framework_time")}
        ok = isinstance(r.get("time"), int | float) and np.isfinite(r["time"])
        out.append(Measured(config, ok=bool(ok), time_ms=float(r["time"]) if ok else None,
                            compile_s=costs["compile_time"],
                            gpu_s=costs["verification_time"] + costs["benchmark_time"],
                            detail="" if ok else str(r.get("time")), extra=costs))
    return out, wall


def summarise(batch: Sequence[Measured], batch_wall: float, startup_s: float,
              kt: Sequence[Measured] | None, kt_wall: float | None,
              recorded: Mapping[int, float] | None = None) -> dict[str, Any]:
    """The figures the command prints (pure: unit-tested without a GPU)."""
    n = len(batch)
    s: dict[str, Any] = {
        "configs": n,
        "batch_ok": sum(m.ok for m in batch),
        "batch_wall_s": batch_wall,
        "batch_gpu_s_per_eval": batch_wall / n,
        "batch_timed_gpu_s_per_eval": sum(m.gpu_s for m in batch) / n,
        "batch_compile_s_median": float(np.median([m.compile_s for m in batch])) if batch else float("nan"),
        # What compiles at first use would cost the first configuration (the worker compiles
        # the verification kernels in its set-up, warmup.warm_verification): its run_s
        # against the others'.
        "batch_first_run_s": batch[0].gpu_s if batch else float("nan"),
        "batch_rest_run_s_median": float(np.median([m.gpu_s for m in batch[1:]])) if n > 1 else float("nan"),
        "startup_s": startup_s,
    }
    if recorded:
        pairs = [(m.time_ms, recorded[i]) for i, m in enumerate(batch) if m.ok and i in recorded]
        s["spearman_batch_vs_recording"] = spearman(*zip(*pairs, strict=True)) if pairs else float("nan")
    if kt is not None and kt_wall is not None:
        kt_gpu = sum(m.gpu_s for m in kt) / n
        s |= {
            "kt_ok": sum(m.ok for m in kt),
            "kt_wall_s": kt_wall,
            "kt_s_per_eval": kt_wall / n,
            "kt_gpu_s_per_eval": kt_gpu,
            "kt_compile_s_median": float(np.median([m.compile_s for m in kt])),
            "bound_s_per_eval": BOUND_FACTOR * kt_gpu + startup_s / n,
            "outcome_disagreements": [
                {"config": b.config, "fleettune": b.detail or "ok", "kernel_tuner": k.detail or "ok"}
                for b, k in zip(batch, kt, strict=True) if b.ok != k.ok],
        }
        s["bound_met"] = s["batch_gpu_s_per_eval"] <= s["bound_s_per_eval"]
        s["wall_ratio_batch_to_kt"] = batch_wall / kt_wall
        pairs = [(b.time_ms, k.time_ms) for b, k in zip(batch, kt, strict=True) if b.ok and k.ok]
        s["spearman_batch_vs_kt"] = spearman(*zip(*pairs, strict=True)) if pairs else float("nan")
        ratios = [b / k for b, k in pairs if b and k]
        s["median_time_ratio_batch_to_kt"] = float(np.median(ratios)) if ratios else float("nan")
    return s


def format_summary(s: Mapping[str, Any], single_walls: Sequence[float], device: str) -> str:
    lines = [f"device: {device}",
             f"{s['configs']} configurations, {s['batch_ok']} ok in the batch"
             + (f", {s['kt_ok']} ok in Kernel Tuner" if "kt_ok" in s else ""),
             f"start-up (interpreter + cupy + CUDA context): {s['startup_s']:.2f} s",
             f"batch: {s['batch_wall_s']:.2f} s wall, {s['batch_gpu_s_per_eval']:.3f} GPU-s per evaluation "
             f"({s['batch_timed_gpu_s_per_eval']:.3f} s of it first launch to end of timing), "
             f"compile median {s['batch_compile_s_median']:.2f} s (ahead, on the CPU)",
             f"first configuration's run_s {s['batch_first_run_s']:.3f} s, the others' median "
             f"{s['batch_rest_run_s_median']:.3f} s"]
    if single_walls:
        lines.append(f"single (one worker per configuration): median {np.median(single_walls):.2f} s per "
                     f"evaluation over {len(single_walls)}")
    if "kt_wall_s" in s:
        lines += [
            f"Kernel Tuner: {s['kt_wall_s']:.2f} s wall, {s['kt_s_per_eval']:.3f} s per evaluation, of it "
            f"{s['kt_gpu_s_per_eval']:.3f} s verification + benchmark, compile median {s['kt_compile_s_median']:.2f} s",
            f"wall-clock, batch / Kernel Tuner: {s['wall_ratio_batch_to_kt']:.2f}",
            f"target: GPU-s per evaluation {s['batch_gpu_s_per_eval']:.3f} ≤ {BOUND_FACTOR} × "
            f"{s['kt_gpu_s_per_eval']:.3f} + start-up / {s['configs']} = {s['bound_s_per_eval']:.3f}: "
            + ("met" if s["bound_met"] else "MISSED"),
            f"agreement: Spearman {s['spearman_batch_vs_kt']:.3f} of the times, median time ratio "
            f"{s['median_time_ratio_batch_to_kt']:.3f}, {len(s['outcome_disagreements'])} outcome disagreements",
        ]
        lines += [f"  disagrees: {d}" for d in s["outcome_disagreements"][:5]]
    if "spearman_batch_vs_recording" in s:
        lines.append(f"Spearman with the recording's times (its own GPU): {s['spearman_batch_vs_recording']:.3f}")
    return "\n".join(lines)


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="fleettune bench job", description=__doc__.split("\n\n")[0])
    p.add_argument("--space", type=Path, required=True,
                   help="a Kernel Tuner recording of a built-in kernel's space (e.g. convolution_milo-A100.json.gz)")
    p.add_argument("--configs", type=int, default=48, help="configurations drawn (one batch: at most 48)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--problem-size", type=lambda t: [int(x) for x in t.split(",")], default=None,
                   help="W,H (default: the recording's)")
    p.add_argument("--warmups", type=int, default=3, help="as a TuningRun's default")
    p.add_argument("--repeats", type=int, default=7, help="timed launches; Kernel Tuner's iterations too")
    p.add_argument("--single", type=int, default=4, help="configurations also run one worker each (0: none)")
    p.add_argument("--startup-probes", type=int, default=5)
    p.add_argument("--no-kernel-tuner", action="store_true")
    p.add_argument("--json", type=Path, default=None, help="write every figure and configuration here")
    args = p.parse_args(argv)
    if not 1 <= args.configs <= 48:
        p.error("--configs must be 1..48 (one batch)")
    return args


def main(argv: list[str]) -> int:
    args = _parse(argv)
    from fleettune_dev.interop import read_kernel_tuner_cache

    family = family_of(args.space)
    builtin = BUILTIN_OF_FAMILY.get(family)
    if builtin is None:
        print(f"{args.space}: no built-in kernel has the parameters of {family!r} "
              f"(known: {', '.join(BUILTIN_OF_FAMILY)})", file=sys.stderr)
        return 2
    reason = gpu_missing_reason()
    if reason:
        print(f"fleettune bench job needs an NVIDIA GPU: {reason}", file=sys.stderr)
        return 2
    device = device_name()
    rec = read_kernel_tuner_cache(args.space)
    problem_size = args.problem_size or [int(s) for s in rec.problem_size]
    records = list(rec.records)
    configs = draw_configs(records, args.configs, args.seed)
    recorded_ms = {i: float(r.time_ms) for i, c in enumerate(configs)
                   for r in [next(x for x in records if x.config == c)] if r.time_ms is not None}

    startup = measure_startup(args.startup_probes)
    startup_s = float(np.median(startup))
    log_dir = Path(os.environ.get("TMPDIR", "/tmp"))
    batch, batch_wall = run_fleettune_batch(builtin, configs, problem_size, args.warmups, args.repeats, log_dir)
    single: list[Measured] = []
    single_walls: list[float] = []
    if args.single:
        try:
            single, single_walls = run_fleettune_single(builtin, configs[: args.single], problem_size,
                                                        args.warmups, args.repeats)
        except Exception as exc:  # the batch's figures still print
            print(f"single configurations did not run: {type(exc).__name__}: {exc}", file=sys.stderr)
    kt = kt_wall = None
    if not args.no_kernel_tuner:
        try:
            kt, kt_wall = run_kernel_tuner(builtin, configs, problem_size, args.repeats)
        except Exception:  # the batch's figures still print
            print("Kernel Tuner did not run:", file=sys.stderr)
            traceback.print_exc()
    s = summarise(batch, batch_wall, startup_s, kt, kt_wall, recorded_ms)
    print(f"{args.space.name} on {problem_size}, warm-ups {args.warmups}, repeats {args.repeats}, seed {args.seed}")
    print(format_summary(s, single_walls, device))
    if args.json:
        doc = {"space": args.space.name, "device": device, "problem_size": problem_size, "summary": s,
               "startup_s": startup, "single_walls_s": single_walls,
               "batch": [asdict(m) for m in batch], "single": [asdict(m) for m in single],
               "kernel_tuner": [asdict(m) for m in kt or []]}
        args.json.write_text(json.dumps(doc, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
