"""The benchmarks check the `bench` extra before they start: a missing plotting library is one line and exit 2 at
once, never a traceback after minutes of measuring."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bench.machine import require_extras

pytestmark = pytest.mark.unit


def test_a_missing_module_is_named_in_one_line_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    import typer

    with pytest.raises(typer.Exit) as exit_:
        require_extras("orjson", "a_module_that_is_not_installed")
    assert exit_.value.exit_code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "a_module_that_is_not_installed" in err and ".[bench]" in err
    assert "orjson" not in err  # only what is missing


def test_present_modules_pass() -> None:
    require_extras("orjson", "typer")


@pytest.mark.parametrize("command", [["run", "--events", "1"], ["report"], ["curve", "--sizes", "1"]])
def test_each_command_that_plots_checks_before_any_work(command: list[str]) -> None:
    """Run with the plotting library made unimportable: the command stops at once, before any server is asked."""
    code = (
        "import sys; sys.modules['matplotlib'] = None; "  # an import of it now fails, as in a venv without the extra
        "import importlib.util; real = importlib.util.find_spec; "
        "importlib.util.find_spec = lambda name, *a: None if name == 'matplotlib' else real(name, *a); "
        "from bench.__main__ import app; sys.argv = ['bench', *sys.argv[1:]]; app()"
    )
    r = subprocess.run([sys.executable, "-c", code, *command], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr and "matplotlib" in r.stderr, r.stderr


def test_every_benchmark_module_runs_on_the_development_stack_from_a_new_users_shell() -> None:
    """`python -m bench.replay` as BENCHMARKS.md writes it, from a shell without LEDGER_DEVELOPMENT: the package, not
    each module, allows the development key, so no runnable module of it refuses its settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGER_")}
    code = "import bench.replay; from producers.settings import get_settings; print(get_settings().development)"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "True", r.stderr[-2000:]
