"""Triton source: what is read from it without running it, and its compile for a GPU.

A Triton kernel is Python: Triton's compiler needs the module imported to find the
``@triton.jit`` function and what it calls. Importing user text would run it, so a module is
first *vetted* on its syntax tree (:func:`vet`): at module level it may only import
``triton``, ``triton.language`` or ``math``, assign literal constants (or
``tl.constexpr(<literal>)``), and define functions decorated with a bare ``@triton.jit``,
whose default values are literals. Importing such a module runs no user statement: a jit
function's body is never executed by Python, Triton's compiler turns it into IR. The
compile itself runs in a child process (:func:`compile_check`: a clean environment, its own
cache folder, a time limit), so a crash or a hang of the compiler stays there.

Triton's compile for ``cuda:<compute capability>`` needs no GPU: its wheel carries ptxas.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Launch options Triton tunes besides the function's meta-parameters.
LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")
# An argument's dtype as the spec names it -> Triton's signature type.
TRITON_TYPES = {
    "float16": "fp16", "float32": "fp32", "float64": "fp64", "int8": "i8", "int16": "i16", "int32": "i32",
    "int64": "i64", "uint8": "u8", "uint16": "u16", "uint32": "u32", "uint64": "u64",
}
ALLOWED_IMPORTS = frozenset({"triton", "triton.language", "math"})
COMPILE_TIMEOUT_S = 120.0
MAX_SOURCE_BYTES = 256 * 1024


class TritonSourceError(ValueError):
    """The source is not a module this tool imports (the message names the line)."""


@dataclass(frozen=True)
class Signature:
    """A jit function's parameters: runtime ``arguments`` in order, and its ``tl.constexpr``
    meta-parameters (name -> whether it has a default)."""

    arguments: tuple[str, ...]
    meta: Mapping[str, bool]


def _is_jit(decorator: ast.expr) -> bool:
    return (isinstance(decorator, ast.Attribute) and decorator.attr == "jit"
            and isinstance(decorator.value, ast.Name) and decorator.value.id == "triton") \
        or (isinstance(decorator, ast.Name) and decorator.id == "jit")


def _is_literal(node: ast.expr) -> bool:
    try:
        ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True


def _is_constexpr(node: ast.expr) -> bool:
    """``tl.constexpr`` or ``triton.language.constexpr`` (an annotation, or called on a literal)."""
    if isinstance(node, ast.Call):
        return _is_constexpr(node.func) and not node.keywords and len(node.args) == 1 and _is_literal(node.args[0])
    return isinstance(node, ast.Attribute) and node.attr == "constexpr"


def vet(source: str) -> ast.Module:
    """The module's syntax tree when importing it runs nothing but definitions; raises
    TritonSourceError naming the first statement that would run something else."""
    if len(source.encode()) > MAX_SOURCE_BYTES:
        raise TritonSourceError(f"the source is over {MAX_SOURCE_BYTES // 1024} KiB")
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise TritonSourceError(f"line {exc.lineno}: {exc.msg}") from None
    body = tree.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    for node in body:
        where = f"line {node.lineno}"
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if isinstance(node, ast.ImportFrom) and node.level:
                names = ["." * node.level + (node.module or "")]
            bad = [n for n in names if n not in ALLOWED_IMPORTS]
            if bad:
                raise TritonSourceError(f"{where}: import of {bad[0]!r}: a kernel module may import only "
                                        f"{', '.join(sorted(ALLOWED_IMPORTS))}")
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            value = node.value
            if not all(isinstance(t, ast.Name) for t in targets) or value is None \
                    or not (_is_literal(value) or _is_constexpr(value)):
                raise TritonSourceError(f"{where}: a module-level assignment must give a name a literal "
                                        "(or tl.constexpr(<literal>))")
        elif isinstance(node, ast.FunctionDef):
            if len(node.decorator_list) != 1 or not _is_jit(node.decorator_list[0]):
                raise TritonSourceError(f"{where}: function {node.name!r} must be decorated with a bare "
                                        "@triton.jit (and nothing else)")
            args = node.args
            defaults = [*args.defaults, *(d for d in args.kw_defaults if d is not None)]
            if any(not _is_literal(d) for d in defaults):
                raise TritonSourceError(f"{where}: function {node.name!r}: default values must be literals")
            annotations = [a.annotation for a in (*args.posonlyargs, *args.args, *args.kwonlyargs) if a.annotation]
            if any(not (_is_constexpr(a) or _is_literal(a) or isinstance(a, ast.Name)) for a in annotations):
                raise TritonSourceError(f"{where}: function {node.name!r}: annotations must be tl.constexpr or "
                                        "a type name")
        else:
            raise TritonSourceError(f"{where}: only imports, literal constants and @triton.jit functions may "
                                    f"be at module level (found {type(node).__name__})")
    return tree


def signature(source: str, function: str) -> Signature:
    """The parameters of jit function ``function`` of the source; raises TritonSourceError."""
    tree = vet(source)
    defs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    if function not in defs:
        known = ", ".join(sorted(defs)) or "none"
        raise TritonSourceError(f"no @triton.jit function {function!r} (functions: {known})")
    args = defs[function].args
    if args.vararg or args.kwarg or args.kwonlyargs or args.posonlyargs:
        raise TritonSourceError(f"function {function!r}: only plain positional parameters can be launched")
    params = args.args
    first_default = len(params) - len(args.defaults)
    arguments: list[str] = []
    meta: dict[str, bool] = {}
    for i, p in enumerate(params):
        if p.annotation is not None and _is_constexpr(p.annotation):
            meta[p.arg] = i >= first_default
        elif meta:
            raise TritonSourceError(f"function {function!r}: parameter {p.arg!r} follows the meta-parameters; "
                                    "put every tl.constexpr parameter last")
        else:
            arguments.append(p.arg)
    return Signature(tuple(arguments), meta)


@dataclass(frozen=True)
class CompileRequest:
    """One configuration to compile (hashable, so that compiles can be cached): the source, the
    function, its runtime arguments' signature types in order (``*fp32`` for an array, ``i32``
    for a scalar), its meta-parameters' values and Triton's launch options, for a compute
    capability ("8.0")."""

    source: str
    function: str
    types: tuple[str, ...]
    constexprs: tuple[tuple[str, Any], ...]
    options: tuple[tuple[str, int], ...]
    compute_capability: str

    @classmethod
    def of(cls, source: str, function: str, arguments: Sequence[tuple[str, str]], config: Mapping[str, Any],
           compute_capability: str) -> CompileRequest:
        """The request for a configuration; ``arguments``: (kind, dtype) of each runtime argument."""
        types = tuple(("*" if kind == "array" else "") + TRITON_TYPES[dtype] for kind, dtype in arguments)
        meta = tuple(sorted((k, v) for k, v in config.items() if k not in LAUNCH_OPTIONS))
        options = tuple(sorted((k, int(v)) for k, v in config.items() if k in LAUNCH_OPTIONS))
        return cls(source, function, types, meta, options, compute_capability)

    def dump(self) -> str:
        return json.dumps({"source": self.source, "function": self.function, "types": list(self.types),
                           "constexprs": dict(self.constexprs), "options": dict(self.options),
                           "compute_capability": self.compute_capability})


@dataclass(frozen=True)
class CompileResult:
    """The compiler's message (None: it compiled), the shared memory per block it needs, and
    the seconds the compile took in the child."""

    error: str | None
    shared_bytes: int = 0
    seconds: float = 0.0


def available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return str(triton.__version__)


def compile_check(request: CompileRequest, cache_dir: str | None = None,
                  timeout_s: float = COMPILE_TIMEOUT_S) -> CompileResult:
    """One configuration's compile (:func:`compile_many`)."""
    return compile_many([request], cache_dir, timeout_s)[0]


def compile_many(requests: Sequence[CompileRequest], cache_dir: str | None = None,
                 timeout_s: float = COMPILE_TIMEOUT_S) -> list[CompileResult]:
    """Compile each configuration, in order, in one child process (see the module's doc);
    ``timeout_s`` bounds each. Raises TritonSourceError for a source that is not vetted,
    RuntimeError when Triton is not installed or the child fails."""
    for source in {r.source for r in requests}:
        vet(source)
    if not available():
        raise RuntimeError("Triton is not installed")
    payload = json.dumps([json.loads(r.dump()) for r in requests])
    with tempfile.TemporaryDirectory(prefix="fleettune-triton-") as home:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": home,
               "TRITON_CACHE_DIR": cache_dir or str(Path(home) / "cache"), "TRITON_DEFAULT_FP_FUSION": "1",
               "PYTHONDONTWRITEBYTECODE": "1"}
        try:
            done = subprocess.run([sys.executable, "-m", "fleettune_job.tritonsource"], input=payload,
                                  capture_output=True, text=True, env=env, cwd=home,
                                  timeout=timeout_s * len(requests), check=False)
        except subprocess.TimeoutExpired:
            return [CompileResult(f"the compile took over {timeout_s:.0f} s")] * len(requests)
    try:
        answers = json.loads(done.stdout.strip().splitlines()[-1])
        assert isinstance(answers, list) and len(answers) == len(requests)
    except (json.JSONDecodeError, IndexError, AssertionError):
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"Triton's compile process ended with status {done.returncode}: "
                           f"{' | '.join(tail) or 'no output'}") from None
    return [CompileResult(a.get("error"), int(a.get("shared") or 0), float(a.get("seconds") or 0)) for a in answers]


def _compile(request: Mapping[str, Any], folder: Path, index: int) -> dict[str, Any]:
    """In the child: import the vetted module from ``folder`` and compile (the answer as JSON)."""
    import importlib.util
    import warnings

    vet(request["source"])
    name = f"fleettune_kernel_{index}"  # Triton finds a jit function's source through its module
    path = folder / f"{name}.py"
    path.write_text(request["source"])
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = getattr(module, request["function"])
    runtime = [p.name for p in fn.params if not p.is_constexpr]
    sig = dict(zip(runtime, request["types"], strict=True))
    constexprs = dict(request["constexprs"])
    for p in fn.params:
        if p.is_constexpr:
            sig[p.name] = "constexpr"
            if p.name not in constexprs and p.has_default:
                constexprs[p.name] = p.default
    major, minor = (int(x) for x in request["compute_capability"].split("."))
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            kernel = triton.compile(ASTSource(fn, sig, constexprs=constexprs),
                                    target=GPUTarget("cuda", major * 10 + minor, 32), options=request["options"])
        except Exception as exc:  # the compiler's message is the answer, whatever raised it
            return {"error": f"{type(exc).__name__}: {exc}".strip(), "seconds": time.perf_counter() - start}
    return {"error": None, "shared": int(getattr(kernel.metadata, "shared", 0) or 0),
            "seconds": time.perf_counter() - start}


def main() -> None:
    answers = []
    for i, request in enumerate(json.loads(sys.stdin.read())):
        with tempfile.TemporaryDirectory(prefix="kernel-") as folder:
            try:
                answers.append(_compile(request, Path(folder), i))
            except TritonSourceError as exc:
                answers.append({"error": str(exc)})
            except Exception as exc:  # importing the module failed (e.g. a missing attribute of triton)
                answers.append({"error": f"{type(exc).__name__}: {exc}"})
    print(json.dumps(answers))


if __name__ == "__main__":
    main()
