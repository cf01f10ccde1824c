"""docs/reference/ is generated from the code (fleettune_dev.refdocs): the committed pages
must be what the code renders today, so the reference cannot drift from the CRD models,
the metrics, the commands' flags or the strategy options."""

from __future__ import annotations

import argparse
from pathlib import Path

from fleettune_dev import refdocs, refdocs_cli, refdocs_markdown

COMMITTED = Path(__file__).resolve().parents[2] / "docs" / "reference"


def test_the_committed_reference_pages_are_what_the_code_renders(tmp_path: Path) -> None:
    refdocs.write(tmp_path)
    generated = sorted(p.name for p in tmp_path.iterdir())
    assert generated == sorted(refdocs.PAGES)
    differ = [name for name in generated
              if not (COMMITTED / name).is_file()
              or (COMMITTED / name).read_text(encoding="utf-8") != (tmp_path / name).read_text(encoding="utf-8")]
    assert not differ, (
        f"docs/reference/ is out of date with the code ({', '.join(differ)}): run `{refdocs.COMMAND}` "
        "and commit the pages it writes"
    )
    assert not refdocs.main(["--check", "--out", str(tmp_path)])


def test_a_stale_page_is_named_and_the_check_fails(tmp_path: Path, capsys) -> None:
    refdocs.write(tmp_path)
    (tmp_path / "metrics.md").write_text("# Metrics\n\nnothing\n", encoding="utf-8")
    (tmp_path / "cli.md").unlink()
    assert refdocs.stale(tmp_path) == ["cli.md", "metrics.md"]
    assert refdocs.main(["--check", "--out", str(tmp_path)]) == 1
    assert f"cli.md, metrics.md; run `{refdocs.COMMAND}`" in capsys.readouterr().err


def test_the_pages_carry_no_machine_paths() -> None:
    """Defaults computed from the home directory or the checkout are written as the docs
    say them, so that the pages are the same on every machine."""
    text = "".join(refdocs.render_all().values())
    for path in (Path.home(), refdocs_markdown.ROOT):
        assert str(path) + "/" not in text and f"`{path}`" not in text


def test_reading_a_commands_parser_runs_nothing() -> None:
    ran = []

    def main(argv: list[str]) -> int:
        p = argparse.ArgumentParser(prog="fleettune example")
        p.add_argument("--flag", default=3, help="what it sets")
        p.parse_args(argv)
        ran.append(argv)
        return 0

    parser = refdocs_cli.command_parser(main)
    assert parser.prog == "fleettune example" and not ran
    assert argparse.ArgumentParser.parse_known_args is not None
    assert argparse.ArgumentParser(prog="x").parse_args([]) == argparse.Namespace()  # restored
