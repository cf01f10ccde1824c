"""Triton's interpreter in the fleet simulator: each configuration's outputs checked for real.

With ``TRITON_INTERPRET=1`` Triton runs a jit function on the CPU with numpy, program by
program. The simulator uses it to verify a Triton configuration as the job does on a GPU:
the trial's arguments are built by the job's own code (``fleettune_job.arguments``: the
same lengths, seeds and initial data), the reference (``kernel.defaultConfig``, or
``verification.referenceFunction``) runs first, then each configuration, and its outputs are
compared with the job's own rule (``fleettune_job.verification``): a configuration that
computes a wrong result is a ``correctness_error`` here too. Interpreting is slow, so the
problem is cut to at most :data:`MAX_DIMENSION` per dimension (a wrong tiling shows at any
size larger than its tiles). Arguments read from data keys are not built here: such a kernel
is not verified. It runs user code, so it runs in a child process (``python -m``), one per
batch; the simulator is a development tool, never part of the operator.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fleettune_job.protocol import Trial

MAX_DIMENSION = 128
TIMEOUT_S = 300.0


def reduced(problem_size: Sequence[int]) -> list[int]:
    return [min(int(n), MAX_DIMENSION) for n in problem_size]


def verifiable(trial: Trial) -> bool:
    return trial.kernel.verification is not None and all(a.init != "data" for a in trial.kernel.arguments or [])


def verify(source: str, trials: Sequence[Trial]) -> list[str | None]:
    """Each trial's verdict (None: its outputs match the reference's), all of one batch in
    one child process; raises RuntimeError when the interpreter cannot run the reference."""
    first = trials[0].kernel
    assert first.verification is not None
    request = {"source": source, "function": first.function, "grid": first.grid,
               "arguments": [a.model_dump() for a in first.arguments or []],
               "problem_size": reduced(trials[0].problem_size),
               "verification": first.verification.model_dump(), "configs": [t.config for t in trials]}
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "PYTHONPATH")} | {"TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-m", "fleettune_dev.sim.tritoninterp"], input=json.dumps(request),
                          capture_output=True, text=True, env=env, timeout=TIMEOUT_S, check=False)
    try:
        answer = json.loads(done.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        raise RuntimeError(f"Triton's interpreter ended with status {done.returncode}: "
                           f"{' | '.join(done.stderr.strip().splitlines()[-3:])}") from None
    if "error" in answer:
        raise RuntimeError(answer["error"])
    return list(answer["verdicts"])


def _run(module: Any, function: str, grid: Sequence[str], arguments: Sequence[Any], arrays: Mapping[str, Any],
         config: Mapping[str, Any], problem_size: Sequence[int]) -> dict[str, Any]:
    """One launch in the interpreter on copies of the initial arrays: the output arrays."""
    import torch

    from fleettune_job.arguments import ArraySpec, scalar_values
    from fleettune_job.expressions import geometry
    from fleettune_job.tritonsource import LAUNCH_OPTIONS

    names = {k: int(v) if isinstance(v, bool) else v for k, v in config.items() if isinstance(v, int | float)}
    tensors = {name: torch.from_numpy(array.copy()) for name, array in arrays.items()}
    scalars = scalar_values(arguments, names, problem_size)
    values = [tensors[a.name] if isinstance(a, ArraySpec) else scalars[a.name].item() for a in arguments]
    fn = getattr(module, function)
    meta = {k: v for k, v in config.items() if k not in LAUNCH_OPTIONS and k in fn.arg_names}
    fn[geometry(grid, names, problem_size, "grid")](*values, **meta)
    return {a.name: tensors[a.name].numpy() for a in arguments if isinstance(a, ArraySpec) and a.output}


def _verify(request: Mapping[str, Any], folder: Path) -> dict[str, Any]:
    import importlib.util

    from fleettune_job.arguments import initial_arrays, resolve_arguments
    from fleettune_job.protocol import Argument, Verification
    from fleettune_job.tritonsource import vet
    from fleettune_job.verification import outputs_mismatch

    vet(request["source"])
    path = folder / "fleettune_kernel.py"
    path.write_text(request["source"])
    spec = importlib.util.spec_from_file_location("fleettune_kernel", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["fleettune_kernel"] = module
    spec.loader.exec_module(module)
    size = request["problem_size"]
    arguments = resolve_arguments([Argument.model_validate(a) for a in request["arguments"]], size)
    arrays = initial_arrays(arguments)
    check = Verification.model_validate(request["verification"])
    try:
        expected = _run(module, check.reference_function or request["function"], request["grid"], arguments, arrays,
                        check.reference_config, size)
    except Exception as exc:
        return {"error": f"the reference configuration fails in Triton's interpreter: {type(exc).__name__}: {exc}"}
    outputs = [a.name for a in arguments if getattr(a, "output", False)]
    verdicts: list[str | None] = []
    for config in request["configs"]:
        try:
            got = _run(module, request["function"], request["grid"], arguments, arrays, config, size)
        except Exception as exc:  # the configuration's own failure in the interpreter
            verdicts.append(f"in Triton's interpreter: {type(exc).__name__}: {exc}"[:500])
            continue
        verdicts.append(outputs_mismatch(got, expected, outputs, check.atol, check.rtol))
    return {"verdicts": verdicts}


def main() -> None:
    request = json.loads(sys.stdin.read())
    with tempfile.TemporaryDirectory(prefix="fleettune-interp-") as folder:
        try:
            answer = _verify(request, Path(folder))
        except Exception as exc:
            answer = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(answer))


if __name__ == "__main__":
    main()
