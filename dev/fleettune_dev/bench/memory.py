"""`fleettune bench memory`: the operator's resident memory, scenario by scenario.

Each scenario runs in a fresh interpreter (so that no scenario's pages count for the
next one) and reports:

* **peak**: the process's maximum resident set size (``getrusage`` ``ru_maxrss``);
* **steady**: the resident set after the work and a garbage collection (``VmRSS``);
* the same after the imports alone, so that the table can show what the studies add on
  top of the libraries (**+studies**);
* **arrays**: the bytes of the numpy arrays and torch tensors the studies keep reachable
  (each buffer counted once), and the largest of them.

Scenarios, each importing what the operator imports (``fleettune.controller.handlers``):

* ``imports``: the operator's handlers only (``bayes`` loads torch on first use);
* ``torch``: the handlers plus the optimiser stack (torch, gpytorch, botorch);
* ``convolution`` / ``convolution-3``: the demo's convolution space
  (``examples/convolution-fleet.yaml``) on one pool / on its three pools (A100, RTX A4000,
  Jetson Orin device limits), ``--rounds`` observations each with the ``bayes`` strategy;
* ``huge`` / ``huge-3``: a synthetic space of 9 parameters and up to 1 866 240 valid
  configurations, just under ``MAX_ENUMERATED``: the largest candidate set a Study holds
  (beyond it a Study keeps a 200 000-configuration sample); a constraint on the device's
  multiprocessor count gives each of the three pools a different valid set;
* ``huge-24``: the largest run, 24 (pool, size) targets: ``huge`` on 3 pools x 8 problem
  sizes, every study alive at the end (a finished target keeps its study);
* ``sampled``: 10^8 valid configurations: a Study of the 200 000-configuration sample;
* ``finished-runs``: ``--runs`` runs one after another, each its own kernel (a space like
  ``huge``'s, no candidate set shared), one pool tuned ``--rounds`` observations, finished
  and kept as the operator keeps a finished run until it is deleted (its pools, through
  the planner's ``drop_finished_studies``; ``--keep-studies``: as before that, with their
  studies): the resident set after each run says whether the operator grows with runs.

Studies are driven as the controller drives them (``suggest(n, pending)`` with up to
``--parallelism`` trials in flight, ``observe(config, outcome, objective, times)`` for the
oldest), answered by a deterministic synthetic objective with a failing region. Torch's
resident size depends on its build: the default index's Linux wheel is the CUDA build,
whose import maps CUDA libraries the operator image's CPU-only wheel does not have; the
``torch`` row says how much of the import is in such libraries. Figures, not a test.
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# name: (space, pools, problem sizes per pool)
SCENARIOS: dict[str, tuple[str | None, int, int]] = {
    "imports": (None, 0, 0),
    "torch": (None, 0, 0),
    "convolution": ("convolution", 1, 1),
    "convolution-3": ("convolution", 3, 1),
    "huge": ("huge", 1, 1),
    "huge-3": ("huge", 3, 1),
    "huge-24": ("huge", 3, 8),
    "sampled": ("sampled", 1, 1),
    "finished-runs": ("huge", 1, 1),
}
DEFAULT_SCENARIOS = tuple(s for s in SCENARIOS if s != "finished-runs")
PRODUCTS = ("NVIDIA A100-PCIE-40GB", "NVIDIA RTX A4000", "Jetson AGX Orin")  # the demo fleet's pools
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "convolution-fleet.yaml"
MIB = 1 << 20
# Libraries that only the CUDA build of torch maps (the CPU wheel has none of them).
CUDA_ONLY = ("libtorch_cuda", "libc10_cuda", "/nvidia/", "libcudnn", "libcublas", "libnccl", "libcusparse",
             "libcufft", "libcurand", "libcusolver", "libnvrtc", "libnvjitlink", "libcudart", "libcupti",
             "libnvtoolsext", "libcufile", "libnvshmem", "/triton/")


# -- measurements of this process --------------------------------------------------------


def _status(field: str) -> int:
    """A ``kB`` field of /proc/self/status, in bytes (0 where there is no /proc)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def rss() -> int:
    """Current resident set size in bytes."""
    return _status("VmRSS")


def anon_rss() -> int:
    """Resident anonymous memory in bytes: what the kernel cannot drop under pressure (the
    rest, pages of mapped files such as torch's libraries, it can re-read)."""
    return _status("RssAnon")


def peak_rss() -> int:
    """Maximum resident set size so far, in bytes (Linux reports ``ru_maxrss`` in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def cuda_library_rss() -> int:
    """Resident bytes of mappings of CUDA-only libraries (see ``CUDA_ONLY``)."""
    total, current = 0, ""
    try:
        lines = Path("/proc/self/smaps").read_text().splitlines()
    except OSError:
        return 0
    for line in lines:
        head = line.split(maxsplit=5)
        if len(head) >= 5 and "-" in head[0] and not head[0].endswith(":"):
            current = head[5] if len(head) == 6 else ""
        elif line.startswith("Rss:") and any(k in current for k in CUDA_ONLY):
            total += int(line.split()[1]) * 1024
    return total


def _buffers(obj: Any, depth: int = 0, seen: set[int] | None = None) -> Iterator[tuple[int, int]]:
    """(buffer address, bytes) of the numpy arrays and torch tensors reachable from ``obj``
    through attributes, containers and dataclass fields (not through the search space:
    that is the pool's, not the study's)."""
    import numpy as np

    seen = set() if seen is None else seen
    if id(obj) in seen or depth > 6:
        return
    seen.add(id(obj))
    if isinstance(obj, np.ndarray):
        base = obj
        while isinstance(base.base, np.ndarray):
            base = base.base
        yield base.__array_interface__["data"][0], base.nbytes
        return
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        storage = obj.untyped_storage()
        yield storage.data_ptr(), storage.nbytes()
        return
    if isinstance(obj, dict):
        for v in obj.values():
            yield from _buffers(v, depth + 1, seen)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _buffers(v, depth + 1, seen)
    elif hasattr(obj, "__dict__") and not isinstance(obj, type) and type(obj).__module__.startswith("fleettune"):
        for k, v in vars(obj).items():
            if k != "space":
                yield from _buffers(v, depth + 1, seen)


def array_bytes(obj: Any) -> tuple[int, int]:
    """Total and largest bytes of the distinct array buffers reachable from ``obj``."""
    sizes = dict(_buffers(obj))
    return sum(sizes.values()), max(sizes.values(), default=0)


# -- spaces and the synthetic objective --------------------------------------------------


def _space_spec(name: str) -> tuple[list[dict[str, Any]], list[str]]:
    if name == "convolution":
        import yaml

        spec = yaml.safe_load(EXAMPLE.read_text())["spec"]
        return spec["parameters"], spec["constraints"]
    p2 = [1, 2, 4, 8, 16, 32]
    if name == "huge":
        # 6^7 x 4 x 2 = 2 239 488, of which the constraint keeps 5/6: 1 866 240 valid.
        params = [{"name": f"p{i}", "type": "ordinal", "values": p2} for i in range(7)]
        params += [{"name": "layout", "type": "categorical", "values": ["a", "b", "c", "d"]},
                   {"name": "use_shmem", "type": "boolean"}]
        # A100: 1 866 240; RTX A4000 (48 SMs): 1 814 400; Jetson AGX Orin (16 SMs): 1 710 720.
        return params, ["p0 * p1 <= 128", "p2 * p3 <= 16 * device.multiprocessor_count"]
    if name == "sampled":
        # 10^8 x 5/6 valid: far beyond MAX_ENUMERATED, a study keeps a sample.
        params = [{"name": f"p{i}", "type": "integer", "range": {"min": 1, "max": 10}} for i in range(8)]
        params += [{"name": "layout", "type": "categorical", "values": ["a", "b", "c", "d"]},
                   {"name": "use_shmem", "type": "boolean"}]
        return params, ["p0 * p1 <= 60"]
    raise ValueError(f"unknown space {name!r}")


def synthetic_answer(space: Any, config: dict[str, Any]) -> tuple[Any, float | None, list[float]]:
    """A deterministic landscape over the configuration's value positions: a smooth bowl
    with an optimum off-centre, a failing corner (about a tenth of the space)."""
    from fleettune_job.protocol import Outcome

    row = space.to_rows([config])[0]
    u = [int(i) / max(1, k - 1) for i, k in zip(row, space.sizes, strict=True)]
    if len(u) >= 2 and u[0] + u[1] > 1.6:
        return Outcome.COMPILE_ERROR, None, []
    t = 1.0 + sum((x - (0.3 + 0.07 * j) % 1.0) ** 2 for j, x in enumerate(u))
    return Outcome.OK, t, [t * 0.99, t, t * 1.01]


# -- one scenario (in a child process) ---------------------------------------------------


def _drive(study: Any, rounds: int, parallelism: int, suggest_s: list[float] | None = None) -> None:
    """``rounds`` observations, ``parallelism`` trials in flight, as the controller drives a study."""
    running: list[dict[str, Any]] = []
    for _ in range(rounds):
        if len(running) < parallelism:
            t1 = time.perf_counter()
            running += study.suggest(parallelism - len(running), list(running))
            if suggest_s is not None:
                suggest_s.append(time.perf_counter() - t1)
        if running:
            config = running.pop(0)
            outcome, objective, times = synthetic_answer(study.space, config)
            study.observe(config, outcome, objective, times)


def finished_runs(runs: int, rounds: int, parallelism: int, strategy: str, keep_studies: bool) -> list[dict[str, Any]]:
    """Resident set after each of ``runs`` finished runs, kept as the operator keeps them."""
    from fleettune.api import TuningRunSpec
    from fleettune.controller.lifecycle import PoolPhase
    from fleettune.controller.planner import drop_finished_studies
    from fleettune.controller.pool import Pool, build_search, make_study

    params, _ = _space_spec("huge")
    kept: list[Pool] = []
    out = []
    for n in range(runs):
        # Each run its own kernel: another value of p0, so its space shares nothing.
        spec = TuningRunSpec.model_validate({
            "kernel": {"builtin": "convolution", "problemSize": [4096, 4096]},
            "parameters": [{**params[0], "values": [1, 2, 4, 8, 16, 32 + n]}, *params[1:]],
            "constraints": ["p0 * p1 <= 128", "p2 * p3 <= 16 * device.multiprocessor_count"],
            "strategy": {"name": strategy, "seed": 1 + n},
            "targets": [{"name": "a100"}],
        })
        pool = Pool(spec=spec.targets[0], seed=1 + n, key="a100", problem_size=(4096, 4096))
        build_search(spec, pool, PRODUCTS[0], "spec.targets[0]")
        make_study(spec, pool, [])
        pool.move(PoolPhase.RUNNING)
        assert pool.study is not None
        _drive(pool.study, rounds, parallelism)
        pool.move(PoolPhase.SUCCEEDED, "budget spent")
        if not keep_studies:
            drop_finished_studies([pool])
        kept.append(pool)
        gc.collect()
        out.append({"runs": n + 1, "steady": rss(), "anon": anon_rss(), "arrays": array_bytes(kept)[0]})
    return out


def run_scenario(name: str, rounds: int, parallelism: int, strategy: str, threads: int, runs: int = 0,
                 keep_studies: bool = False) -> dict[str, Any]:
    space_name, pools, sizes = SCENARIOS[name]
    start = rss()
    import fleettune.controller.handlers  # what `fleettune operator` imports

    gc.collect()
    out: dict[str, Any] = {"scenario": name, "pools": pools, "targets": pools * sizes, "start": start,
                           "handlers": rss()}
    if name == "imports":
        out.update(peak=peak_rss(), steady=rss(), anon=anon_rss())
        return out
    import botorch  # noqa: F401
    import gpytorch  # noqa: F401
    import torch

    import fleettune.optimize.bayes  # noqa: F401

    if threads > 0:
        torch.set_num_threads(threads)
    gc.collect()
    out.update(torch_build=torch.__version__, base=rss(), cuda_libs=cuda_library_rss())
    if space_name is None:
        out.update(peak=peak_rss(), steady=rss(), anon=anon_rss())
        return out
    if name == "finished-runs":
        t0 = time.perf_counter()
        series = finished_runs(runs, rounds, parallelism, strategy, keep_studies)
        out.update(peak=peak_rss(), steady=rss(), anon=anon_rss(), series=series, keep_studies=keep_studies,
                   run_s=time.perf_counter() - t0)
        return out
    from fleettune.optimize import Study
    from fleettune.space import SearchSpace, lookup_device

    params, constraints = _space_spec(space_name)
    t0 = time.perf_counter()
    studies = []
    for i in range(pools):
        device = lookup_device(PRODUCTS[i % len(PRODUCTS)])
        for k in range(sizes):  # each (pool, size) builds its own space, as the controller does
            space = SearchSpace.from_spec(params, constraints, device)
            studies.append(Study(space, strategy=strategy, seed=1 + i + 104_729 * k))
    out["setup_s"] = time.perf_counter() - t0
    out["after_setup"] = rss()
    pending: list[list[dict[str, Any]]] = [[] for _ in studies]
    suggest_s: list[float] = []
    for _ in range(rounds):
        for study, running in zip(studies, pending, strict=True):
            if len(running) < parallelism:
                t1 = time.perf_counter()
                running += study.suggest(parallelism - len(running), list(running))
                suggest_s.append(time.perf_counter() - t1)
            if running:
                config = running.pop(0)
                outcome, objective, times = synthetic_answer(study.space, config)
                study.observe(config, outcome, objective, times)
    gc.collect()
    total, largest = array_bytes(studies)
    out.update(
        peak=peak_rss(), steady=rss(), anon=anon_rss(), arrays=total, largest=largest,
        candidates=max(len(st.candidates) for st in studies), features=studies[0].candidates.n_features,
        candidate_sets=len({id(st.candidates) for st in studies}),
        run_s=time.perf_counter() - t0, suggest_median_s=sorted(suggest_s)[len(suggest_s) // 2] if suggest_s else 0.0,
    )
    return out


# -- the table ---------------------------------------------------------------------------


def _mib(v: float | None) -> str:
    return "" if v is None else f"{v / MIB:.0f}"


def _targets(r: dict[str, Any]) -> str:
    if not r["pools"]:
        return ""
    sets = r.get("candidate_sets")
    return f"{r['targets']} ({sets} candidate set{'s' if sets != 1 else ''})" if sets else str(r["targets"])


def format_table(results: list[dict[str, Any]]) -> str:
    head = ["scenario", "targets", "candidates/target", "peak MiB", "steady MiB", "of it anon", "imports MiB",
            "+studies MiB", "arrays MiB (largest)", "time s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        imports = r.get("base", r["handlers"])
        studies = r["steady"] - imports if r["pools"] else None
        arrays = f"{_mib(r['arrays'])} ({_mib(r['largest'])})" if "arrays" in r else ""
        lines.append("| " + " | ".join([
            r["scenario"], _targets(r), f"≤ {r['candidates']:,}" if "candidates" in r else "",
            _mib(r["peak"]), _mib(r["steady"]), _mib(r.get("anon")), _mib(imports), _mib(studies), arrays,
            f"{r['run_s']:.0f}" if "run_s" in r else "",
        ]) + " |")
    notes = []
    first = next((r for r in results if "torch_build" in r), None)
    if first is not None:
        torch_mib = (first["base"] - first["handlers"]) / MIB
        notes.append(f"torch {first['torch_build']}: importing torch, gpytorch and botorch adds {torch_mib:.0f} MiB "
                     f"to the handlers' {first['handlers'] / MIB:.0f} MiB; "
                     f"{first['cuda_libs'] / MIB:.0f} MiB of it is resident in CUDA-only libraries")
    for r in results:
        if "series" in r:
            points = [p for p in r["series"] if p["runs"] in (1, 10, 20, 40) or p is r["series"][-1]]
            kept = ("their studies kept (before drop_finished_studies)" if r["keep_studies"]
                    else "as the operator keeps them")
            notes.append(f"finished runs, {kept}: steady (anon, arrays) MiB after "
                         + ", ".join(f"{p['runs']}: {_mib(p['steady'])} ({_mib(p['anon'])}, {_mib(p['arrays'])})"
                                     for p in points))
    return "\n".join(lines + (["", *notes] if notes else []))


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="fleettune bench memory", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scenarios", nargs="*", default=list(DEFAULT_SCENARIOS), help=f"of {', '.join(SCENARIOS)}")
    p.add_argument("--rounds", type=int, default=60, help="observations per pool")
    p.add_argument("--parallelism", type=int, default=4, help="trials in flight per pool")
    p.add_argument("--strategy", default="bayes")
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default, as operator)")
    p.add_argument("--runs", type=int, default=40, help="finished-runs: how many runs")
    p.add_argument("--keep-studies", action="store_true",
                   help="finished-runs: keep each finished pool's study (the operator before it dropped them)")
    p.add_argument("--json", dest="json_out", help="write the results here")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    unknown = [s for s in args.scenarios if s not in SCENARIOS]
    if unknown:
        print(f"unknown scenario {unknown[0]!r}; scenarios: {', '.join(SCENARIOS)}", file=sys.stderr)
        return 2
    if args.child:
        (name,) = args.scenarios
        print(json.dumps(run_scenario(name, args.rounds, args.parallelism, args.strategy, args.threads, args.runs,
                                      args.keep_studies)))
        return 0
    results = []
    for name in args.scenarios:
        cmd = [sys.executable, "-m", "fleettune_dev.bench.memory", name, "--child", "--rounds", str(args.rounds),
               "--parallelism", str(args.parallelism), "--strategy", args.strategy, "--threads", str(args.threads),
               "--runs", str(args.runs), *(["--keep-studies"] if args.keep_studies else [])]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            print(f"{name}: failed ({proc.returncode})\n{proc.stderr[-2000:]}", file=sys.stderr)
            return 1
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(f"{name}: peak {_mib(results[-1]['peak'])} MiB, steady {_mib(results[-1]['steady'])} MiB",
              file=sys.stderr, flush=True)
    print(format_table(results))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
