"""The `fleettune` command's dispatch: runtime commands, and the development commands that
live in the separate `fleettune_dev` package (absent from the operator image)."""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fleettune import cli

ROOT = Path(__file__).resolve().parents[2]


def test_every_command_names_a_module_with_a_main():
    for name, (module, _) in {**cli.COMMANDS, **cli.DEV_COMMANDS}.items():
        assert callable(importlib.import_module(module).main), name


def test_the_user_commands_are_unchanged():
    assert set(cli.COMMANDS) | set(cli.DEV_COMMANDS) == {
        "cluster", "operator", "simulate", "demo", "report", "predict", "export", "check", "crd", "bench"}
    assert all(module.startswith("fleettune_dev.") for module, _ in cli.DEV_COMMANDS.values())
    assert not any(module.startswith("fleettune_dev") for module, _ in cli.COMMANDS.values())


def test_help_lists_every_command(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in (*cli.COMMANDS, *cli.DEV_COMMANDS):
        assert f"  {name} " in out


def test_bench_help_reaches_the_dev_package(capsys):
    assert cli.main(["bench", "--help"]) == 0
    assert "space,strategy,warmstart,load,memory" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["demo", "cluster", "simulate", "bench"])
def test_a_dev_command_without_the_dev_package_says_how_to_install_it(monkeypatch, capsys, command):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == cli.DEV_PACKAGE else real(name, *a))
    monkeypatch.setattr(importlib, "import_module", lambda name: pytest.fail(f"imported {name}"))
    assert cli.main([command, "--help"]) == 2
    out, err = capsys.readouterr()
    assert not out
    assert err.count("\n") == 1
    assert f"fleettune {command}: " in err and "fleettune_dev" in err and "pip install -e ./dev" in err


def test_the_runtime_package_never_imports_the_dev_package():
    """What the operator image runs imports with `fleettune_dev` unimportable."""
    code = textwrap.dedent("""
        import importlib, importlib.util, os, pkgutil, sys

        # As in the operator image: no fleettune_dev (drop its editable finder, its source root).
        sys.meta_path[:] = [f for f in sys.meta_path if "fleettune_dev" not in str(getattr(f, "__module__", ""))]
        sys.path[:] = [p for p in sys.path if not os.path.isdir(os.path.join(p or ".", "fleettune_dev"))]
        importlib.invalidate_caches()
        assert importlib.util.find_spec("fleettune_dev") is None, "fleettune_dev is still importable"
        import fleettune
        for info in pkgutil.walk_packages(fleettune.__path__, "fleettune."):
            importlib.import_module(info.name)
        from fleettune import cli
        assert cli.main(["crd"]) == 0
        assert cli.main(["demo"]) == 2
    """)
    env_path = [str(ROOT / "operator"), str(ROOT / "job_image")]
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False,
                          env={"PYTHONPATH": ":".join(env_path), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "pip install -e ./dev" in proc.stderr
