"""Plugin distributions as users install them: the `zoo new` template and the example in examples/.

Each is pip-installed into a temporary target folder, then found through its entry point, checked
with its own conformance tests, and run through `zoo run-all --filter`.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def install(source: Path, target: Path) -> dict:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(source)],
                   check=True, capture_output=True, text=True, timeout=600)
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(target), os.environ.get("PYTHONPATH")]))}


def run(*args, env, cwd=None):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=600)


@pytest.fixture(scope="module")
def scaffolded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("new")
    made = subprocess.run([sys.executable, "-m", "zoo", "new", "my-scaffold", "--dir", str(tmp / "zoo-my-scaffold")],
                          capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    return tmp / "zoo-my-scaffold", install(tmp / "zoo-my-scaffold", tmp / "site")


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("example")
    return ROOT / "examples" / "zoo-alibi", install(ROOT / "examples" / "zoo-alibi", tmp / "site")


@pytest.mark.parametrize("which, name, distribution", [("scaffolded", "my-scaffold", "zoo-my-scaffold 0.1.0"),
                                                       ("example", "alibi", "zoo-alibi 0.1.0")])
def test_installed_plugin_is_listed_with_its_distribution(request, which, name, distribution):
    _, env = request.getfixturevalue(which)
    out = run("-m", "zoo", "list", name, env=env)
    assert out.returncode == 0 and out.stdout.split()[0] == name and distribution in out.stdout, out


@pytest.mark.parametrize("which", ["scaffolded", "example"])
def test_its_own_conformance_tests_pass(request, which, tmp_path):
    folder, env = request.getfixturevalue(which)
    out = run("-m", "pytest", "-q", "-p", "no:cacheprovider", str(folder / "tests"), env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-3000:]
    assert " passed" in out.stdout and "failed" not in out.stdout


def test_zoo_check_passes_the_installed_example(example):
    _, env = example
    checked = run("-m", "zoo", "check", "alibi", "--profile", "smoke", env=env)
    assert checked.returncode == 0 and "all applicable checks passed" in checked.stdout, checked.stdout


def test_run_all_ranks_the_installed_scaffold(scaffolded, tmp_path):
    _, env = scaffolded
    ran = run("-m", "zoo", "run-all", "--filter", "my-scaffold", "--suite", "correctness", "--profile", "smoke",
              "--out", str(tmp_path / "lb"), env=env)  # correctness is what ranks it
    assert ran.returncode == 0, ran.stderr
    board = (tmp_path / "lb" / "README.md").read_text().split("## Leaderboard")[1].split("## Correctness")[0]
    assert "| my-scaffold" in board
