"""The reference pages of the documentation, generated from the code: `docs/reference/`.

    python -m fleettune_dev.refdocs            # rewrite docs/reference/ from the code
    python -m fleettune_dev.refdocs --check    # exit 1, naming the pages, when they differ

Each page is rendered from what the code itself declares, so it cannot drift from it:
the TuningRun's fields from the schema `fleettune crd` generates from the pydantic models,
the Prometheus metrics from the operator's registry, every command's flags from its
argparse parser, the strategy options from their declarations. A unit test
(tests/unit/test_reference_docs.py) fails when a committed page differs from its
rendering. The output depends on the code alone: no dates, paths or terminal widths.

It lives in the development package: documentation tooling stays out of the operator image.
The commands' page is `fleettune_dev.refdocs_cli`'s; what every page shares (its header,
the Markdown helpers), `fleettune_dev.refdocs_markdown`'s.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import textwrap
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from fleettune_dev.refdocs_cli import render_cli
from fleettune_dev.refdocs_markdown import COMMAND, HEADER, REFERENCE_DIR, cell, code, paragraphs, table

# ---------------------------------------------------------------------- the TuningRun's fields


def _kube_type(node: Mapping[str, Any]) -> str | None:
    """The Kubernetes type a schema node embeds (its schema is the API server's, not ours)."""
    from fleettune.api import kubernetes

    keys = set(node.get("properties") or ())
    for name, schema in (("Affinity", kubernetes.AFFINITY), ("Toleration", kubernetes.TOLERATION)):
        if keys and keys == set(schema.get("properties") or ()):
            return name
    return None


def _type(node: Mapping[str, Any]) -> str:
    kube = _kube_type(node)
    if kube:
        return f"object (Kubernetes {kube})"
    if node.get("x-kubernetes-preserve-unknown-fields") and "type" not in node:
        return "any"
    kind = str(node.get("type", "any"))
    if kind == "array":
        return f"array of {_type(node.get('items') or {})}"
    if kind == "object" and "additionalProperties" in node:
        return f"map of {node['additionalProperties'].get('type', 'any')}"
    if node.get("format"):
        return f"{kind} ({node['format']})"
    return kind


def _constraints(node: Mapping[str, Any]) -> str:
    out = []
    if "enum" in node:
        out.append("one of " + ", ".join(code(v) for v in node["enum"]))
    for key, word in (("minimum", ">="), ("maximum", "<=")):
        if key in node:
            exclusive = node.get("exclusiveMinimum" if key == "minimum" else "exclusiveMaximum") is True
            out.append(f"{word.rstrip('=') if exclusive else word} {node[key]}")
    for key, word in (("minLength", "length >="), ("maxLength", "length <="), ("minItems", "items >="),
                      ("maxItems", "items <="), ("minProperties", "keys >="), ("maxProperties", "keys <=")):
        if key in node:
            out.append(f"{word} {node[key]}")
    if "pattern" in node:
        out.append("matches " + code(node["pattern"]))
    if node.get("x-kubernetes-list-type") in ("set", "map"):
        keys = node.get("x-kubernetes-list-map-keys")
        out.append("unique " + (", ".join(keys) if keys else "items"))
    items = node.get("items")
    if isinstance(items, Mapping) and not items.get("properties"):
        inner = _constraints(items)
        if inner:
            out.append(f"each: {inner}")
    return "; ".join(out)


def _walk_objects(path: str, node: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(path, object schema) for every object with fields, depth first in field order;
    embedded Kubernetes types are not descended into."""
    yield path, node
    for name, prop in (node.get("properties") or {}).items():
        if _kube_type(prop):
            continue
        if prop.get("properties"):
            yield from _walk_objects(f"{path}.{name}", prop)
        items = prop.get("items")
        if isinstance(items, Mapping) and items.get("properties") and not _kube_type(items):
            yield from _walk_objects(f"{path}.{name}[]", items)


def _object_section(path: str, node: Mapping[str, Any]) -> list[str]:
    lines = [f"### `{path}`", ""]
    if node.get("description"):
        lines += [cell(node["description"]), ""]
    required = set(node.get("required") or ())
    rows = []
    for name, prop in (node.get("properties") or {}).items():
        default = code(prop["default"]) if "default" in prop else ""
        rows.append([
            f"`{name}`" + (" (required)" if name in required else ""),
            _type(prop), default, _constraints(prop), prop.get("description", ""),
        ])
    lines += table(["field", "type", "default", "constraints", "description"], rows)
    rules = node.get("x-kubernetes-validations") or []
    if rules:
        lines += ["", "Rules the API server checks on this object:", ""]
        lines += [f"* {cell(r.get('message') or r['rule'])} ({code(r['rule'])})" for r in rules]
    return [*lines, ""]


def render_crd() -> str:
    from fleettune import GROUP, KIND, VERSION
    from fleettune.api import TuningRunSpec, TuningRunStatus
    from fleettune.crd import model_schema

    lines = [
        f"# {KIND} fields", "",
        f"Every field of a `{KIND}` (`{GROUP}/{VERSION}`), from the schema that `fleettune crd` generates from "
        "the pydantic models in `operator/fleettune/api/` (the committed `crds/tuningrun.yaml`). The API server "
        "checks the types, defaults, constraints and rules below when a run is applied; what needs the "
        "search-space library (constraint expressions, value types, device limits) the operator checks and "
        "reports in the run's `Ready` condition, naming the field. Fields of Kubernetes types (`affinity`, "
        "`tolerations`) take exactly what a Pod's do.", "",
        "## spec", "",
    ]
    for path, node in _walk_objects("spec", model_schema(TuningRunSpec)):
        lines += _object_section(path, node)
    lines += ["## status", "", "Written by the operator only.", ""]
    for path, node in _walk_objects("status", model_schema(TuningRunStatus)):
        lines += _object_section(path, node)
    return HEADER + "\n".join(lines).rstrip() + "\n"


# ---------------------------------------------------------------------- metrics


def render_metrics() -> str:
    from prometheus_client.metrics import MetricWrapperBase

    from fleettune import metrics as m
    from fleettune_job.protocol import Outcome

    registry = m.Metrics.unregistered()
    suffix = {"counter": "_total", "info": "_info"}
    rows = []
    for family in vars(registry).values():
        if not isinstance(family, MetricWrapperBase):
            continue
        kind = str(family._type)
        name = family._name + suffix.get(kind, "")
        if kind == "histogram":
            bounds = [b for b in getattr(family, "_upper_bounds", ()) if b != float("inf")]
            kind = "histogram (buckets " + ", ".join(f"{b:g}" for b in bounds) + ")"
        labels = ", ".join(f"`{label}`" for label in family._labelnames)
        rows.append([f"`{name}`", kind, labels, family._documentation or ""])
    module_doc = paragraphs(m.__doc__).split("\n\n")
    lines = [
        "# Metrics", "",
        f"The operator serves Prometheus metrics on `:{m.DEFAULT_PORT}/metrics` (`fleettune operator "
        "--metrics-port`, `--metrics-address`). Every family it exports, from its registry "
        "(`operator/fleettune/metrics.py`):", "",
        *table(["metric", "type", "labels", "help"], rows), "",
        "Besides these, the process's own collectors: `process_*` (CPU, resident memory, open files), "
        "`python_gc_*` and `python_info`.", "",
        "## Label values", "",
        *table(["label", "values"], [
            ["`outcome`", ", ".join(f"`{o.value}`" for o in Outcome)],
            ["`phase` of `fleettune_run_phase`", ", ".join(f"`{p}`" for p in m.RUN_PHASES)],
            ["`phase` of `fleettune_pool_phase`", ", ".join(f"`{p}`" for p in m.POOL_PHASES)],
            ["`target`", "a pool of the run's `spec.targets` (one per problem size: `pool.4096x4096`)"],
        ]), "",
        "## Conventions", "",
        "\n\n".join(p for p in module_doc[2:] if p), "",
    ]
    return HEADER + "\n".join(lines).rstrip() + "\n"


# ---------------------------------------------------------------------- strategy options


def _default(option: Any) -> str:
    return "automatic" if option.default is None else code(json.dumps(option.default))


def render_strategy_options() -> str:
    from fleettune.optimize import stopping
    from fleettune.optimize.strategy import DEFAULT_STRATEGY, STRATEGIES, describe_options, removed_options

    lines = [
        "# Strategy options", "",
        "A TuningRun chooses its search strategy in `spec.strategy.name` (default "
        f"`{DEFAULT_STRATEGY}`) and sets its options in `spec.strategy.options`. Each strategy declares its "
        "options (`operator/fleettune/optimize/options.py`): an unknown option or a value it does not accept "
        "fails the run with `Ready=False, reason=InvalidSpec` and the message "
        "`spec.strategy.options.<key>: <what is wrong>` (an unknown key names the closest known one), and "
        "no Job is started. Numeric options accept 0 only where 0 switches a behaviour off. Options marked "
        "*warm only* are read only by a study with warm-start data (earlier rounds, `spec.warmStart`).", "",
        "The options are the few a user would set, each with its measured effect. A former option is refused "
        "the same way, `spec.strategy.options.<key>: no longer an option: <what replaced it>`, never ignored; "
        "the strategy's internal knobs are constants of the code, which only the benchmarks change "
        "(`--option`/`--variant` of `fleettune bench strategy` and `warmstart`).", "",
        "Why the defaults are what they are: [Decisions](../decisions.md).", "",
    ]
    lines += ["## Strategies", ""]
    for name in STRATEGIES:
        cls = STRATEGIES[name]
        lines += [f"### `{name}`", ""]
        module = inspect.getmodule(cls)
        doc = paragraphs(module.__doc__ if module else "").split("\n\n")[0]
        if doc:
            lines += [" ".join(doc.split()), ""]
        options = describe_options(name)
        if not options:
            lines += ["No options.", ""]
            continue
        rows = [[f"`{o.name}`", _default(o), o.expected, "yes" if o.warm_only else "", o.doc]
                for o in options]
        lines += [*table(["option", "default", "accepts", "warm only", "what it does"], rows), ""]
        if removed := removed_options(name):
            lines += ["No longer options (refused naming them):", "",
                      *table(["former option", "now"], [[f"`{k}`", v] for k, v in removed.items()]), ""]
    lines += [
        "## When a pool's round ends", "",
        *paragraphs(stopping.pool_verdict.__doc__).split("\n\n")[1:3], "",
        "The fields are those of `spec.budget` (`max_infra_failures` is `maxInfraFailures`, and so on; the "
        "study's patience is `patience`). " + " ".join(paragraphs(stopping.__doc__).split("\n\n")[-1].split()), "",
    ]
    return HEADER + "\n".join(lines).rstrip() + "\n"


# ---------------------------------------------------------------------- the pages


def render_index() -> str:
    lines = [
        "# Reference", "",
        "Generated from the code, so it says what the code does; a unit test fails when a page here "
        f"differs from the code (`{COMMAND}` rewrites them).", "",
        "* [TuningRun fields](crd.md): every field of the spec and status, with its type, default, "
        "constraints and description.",
        "* [Commands](cli.md): every `fleettune` command and its flags, the development commands included.",
        "* [Metrics](metrics.md): every Prometheus metric the operator exports, its type, labels and help.",
        "* [Strategy options](strategy-options.md): every search strategy's options, their defaults and "
        "accepted values, and the rules that end a pool's round.",
    ]
    return HEADER + "\n".join(lines) + "\n"


PAGES: dict[str, Callable[[], str]] = {
    "index.md": render_index,
    "crd.md": render_crd,
    "cli.md": render_cli,
    "metrics.md": render_metrics,
    "strategy-options.md": render_strategy_options,
}


def render_all() -> dict[str, str]:
    """Every reference page: file name -> text."""
    return {name: render() for name, render in PAGES.items()}


def write(directory: Path = REFERENCE_DIR) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in render_all().items():
        path = directory / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def stale(directory: Path = REFERENCE_DIR) -> list[str]:
    """The pages of ``directory`` that differ from the code's rendering (or are missing)."""
    out = []
    for name, text in render_all().items():
        path = directory / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            out.append(name)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=textwrap.dedent(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing: exit 1 when a page differs")
    parser.add_argument("--out", type=Path, default=REFERENCE_DIR, help="directory (default: docs/reference)")
    args = parser.parse_args(argv)
    if args.check:
        differ = stale(args.out)
        if differ:
            print(f"{args.out}: out of date: {', '.join(differ)}; run `{COMMAND}`", file=sys.stderr)
            return 1
        return 0
    for path in write(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
