"""The commands' reference page (`docs/reference/cli.md`), from the commands' own argparse parsers.

`command_parser` gets the parser a command's ``main(argv)`` builds without running the
command: the first parse of any parser hands the parser over instead. `render_cli` writes
every `fleettune` command, the development ones and each `fleettune bench` subcommand
included, with its flags, defaults and help; defaults computed from this machine's paths
are written as the documentation says them (`~/.cache/fleettune`, `.`, `..`, `~`).
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fleettune_dev.refdocs_markdown import HEADER, ROOT, code, paragraphs, table


class _Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__(parser.prog)
        self.parser = parser


@contextmanager
def _capturing() -> Iterator[None]:
    """Make the first parse of any argparse parser hand the parser over instead of parsing:
    each command builds its parser inside its `main`, and is never run here."""
    original = argparse.ArgumentParser.parse_known_args

    def capture(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        raise _Captured(self)

    argparse.ArgumentParser.parse_known_args = capture  # type: ignore[method-assign]
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_known_args = original  # type: ignore[method-assign]


def command_parser(main: Callable[[list[str]], Any]) -> argparse.ArgumentParser:
    """The argparse parser a command's ``main(argv)`` builds, without running the command."""
    with _capturing():
        try:
            main([])
        except _Captured as captured:
            return captured.parser
    raise RuntimeError(f"{main.__module__}.main returned without parsing its arguments")


def _flag_row(action: argparse.Action, parser: argparse.ArgumentParser) -> list[str]:
    names = ", ".join(f"`{s}`" for s in action.option_strings) or f"`{action.metavar or action.dest}`"
    if action.option_strings and action.nargs != 0:
        meta = action.metavar or (("{" + ",".join(map(str, action.choices)) + "}") if action.choices
                                  else action.dest.upper())
        names += f" `{meta}`"
    helptext = argparse.HelpFormatter(parser.prog)._expand_help(action) if action.help else ""
    default = action.default
    if isinstance(default, list | tuple):
        default = " ".join(map(str, default))
    hidden = default is None or default is False or default == argparse.SUPPRESS or default == ""
    shown = "" if hidden or action.nargs == 0 else code(
        default if isinstance(default, int | float | str) else str(default))
    extra = []
    if action.required and action.option_strings:
        extra.append("required")
    if action.choices and not action.option_strings and not isinstance(action, argparse._SubParsersAction):
        extra.append("one of " + ", ".join(code(str(c)) for c in action.choices))
    return [names, shown, "; ".join([*extra, helptext] if helptext else extra)]


def _machine_free(text: str) -> str:
    """Defaults computed from this machine's paths, written as the documentation says them."""
    from fleettune_dev.cluster.binaries import cache_root

    for path, shown in ((cache_root(), "~/.cache/fleettune"), (ROOT, "."), (ROOT.parent, ".."),
                        (Path.home(), "~")):
        text = text.replace(f"{path}/", f"{shown}/").replace(f"`{path}`", f"`{shown}`")
    return text


def _parser_section(parser: argparse.ArgumentParser, level: int) -> list[str]:
    lines = [f"{'#' * level} `{parser.prog}`", ""]
    if parser.description:
        lines += [paragraphs(parser.description), ""]
    rows = [_flag_row(a, parser) for a in parser._actions
            if a.help is not argparse.SUPPRESS and not isinstance(a, argparse._HelpAction | argparse._SubParsersAction)]
    if rows:
        lines += [*table(["argument", "default", "what it does"], rows), ""]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {c.dest: c.help for c in action._choices_actions}
            for name, sub in action.choices.items():
                if helps.get(name):
                    sub.description = sub.description or helps[name]
                lines += _parser_section(sub, level + 1)
    if parser.epilog:
        lines += [paragraphs(parser.epilog), ""]
    return lines


def render_cli() -> str:
    from fleettune import cli

    lines = [
        "# Commands", "",
        "Every `fleettune` command and its flags, from the commands' own argparse parsers "
        "(`fleettune COMMAND --help` prints the same). The development commands live in the `fleettune_dev` "
        "package (`dev/`, installed by `make install`), which the operator image does not contain.", "",
        *table(["command", "what it does"], [[f"`fleettune {n}`", d] for n, (_, d) in cli.COMMANDS.items()]), "",
        "Development commands:", "",
        *table(["command", "what it does"], [[f"`fleettune {n}`", d] for n, (_, d) in cli.DEV_COMMANDS.items()]),
        "",
    ]
    from fleettune_dev import bench

    for name, (module, _) in {**cli.COMMANDS, **cli.DEV_COMMANDS}.items():
        if module == bench.__name__:
            lines += [f"## `fleettune {name}`", "", paragraphs(bench.__doc__).split("\n\n")[0], ""]
            for sub in bench.SUBCOMMANDS.values():
                lines += _parser_section(command_parser(importlib.import_module(sub).main), 3)
            continue
        lines += _parser_section(command_parser(importlib.import_module(module).main), 2)
    return HEADER + _machine_free("\n".join(lines).rstrip()) + "\n"
