"""Plugin distributions as users install them: the `zoo new` template and the example in examples/.

Each is pip-installed into a temporary target folder, then found through its entry point, checked
with its own conformance tests, and run through `zoo run-all --filter`.
"""

import os
from pathlib import Path

import json

import pytest

from conftest import good_plugin, run_python, run_zoo

ROOT = Path(__file__).resolve().parent.parent


def install(source: Path, target: Path) -> dict:
    run_python("-m", "pip", "install", "-q", "--no-deps", "--target", target, source, check=True)
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(target), os.environ.get("PYTHONPATH")]))}


def run(*args, env, cwd=None):
    return run_python(*args, env=env, inherit=False, cwd=cwd)


@pytest.fixture(scope="module")
def scaffolded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("new")
    made = run_zoo("new", "my-scaffold", "my-second", "--dir", tmp / "zoo-my-scaffold", timeout=60)  # two variants
    assert made.returncode == 0, made.stderr
    return tmp / "zoo-my-scaffold", install(tmp / "zoo-my-scaffold", tmp / "site")


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("example")
    return ROOT / "examples" / "zoo-alibi", install(ROOT / "examples" / "zoo-alibi", tmp / "site")


@pytest.mark.parametrize("which, name, distribution", [("scaffolded", "my-scaffold", "zoo-my-scaffold 0.1.0"),
                                                       ("scaffolded", "my-second", "zoo-my-scaffold 0.1.0"),
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
    if which == "scaffolded":  # one conformance test per check for each variant the distribution holds
        assert "my-second" in run("-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider",
                                  str(folder / "tests"), env=env, cwd=tmp_path).stdout


def test_zoo_check_passes_the_installed_example(example):
    _, env = example
    checked = run("-m", "zoo", "check", "alibi", "--profile", "smoke", env=env)
    assert checked.returncode == 0 and "all applicable checks passed" in checked.stdout, checked.stdout


def test_run_all_ranks_the_installed_scaffold(scaffolded, tmp_path):
    _, env = scaffolded
    ran = run("-m", "zoo", "run-all", "--filter", "my-scaffold", "--suite", "correctness", "--profile", "smoke",
              "--out", str(tmp_path / "lb"), env=env)  # correctness is what ranks it
    assert ran.returncode == 0, ran.stderr
    board = (tmp_path / "lb" / "README.md").read_text().split("## Leaderboard")[1].split("## Capabilities")[0]
    assert "| my-scaffold" in board


EXPLODING = good_plugin("exploding", output="1e3 * out", reference_output="1e3 * out")


def test_an_installed_suite_adds_its_section_and_its_failing_check_blocks_ranking(tmp_path, write_plugin):
    """examples/zoo-sensitivity, a distribution of its own: no edit in zoo/ brings it onto the board."""
    env = install(ROOT / "examples" / "zoo-sensitivity", tmp_path / "site")
    plugins = write_plugin("exploding", EXPLODING)
    ran = run("-m", "zoo", "run", "dot-product", "exploding", "--suite", "correctness", "--suite", "sensitivity",
              "--profile", "smoke", "--plugins-dir", str(plugins), "--out", str(tmp_path / "lb"), env=env)
    assert ran.returncode == 0, ran.stderr
    readme = (tmp_path / "lb" / "README.md").read_text()
    ranked, rest = readme.split("## Leaderboard")[1].split("## Capabilities")
    assert "perturbation gain" in ranked and "| dot-product" in ranked and "| exploding" not in ranked.split("### Not")[0]
    assert "**exploding**" in ranked and "sensitivity/perturbation-gain" in ranked  # why it is not ranked
    section = rest.split("## Sensitivity", 1)[1].split("\n## ", 1)[0]
    assert "| exploding " in section and "| failed " in section and "| dot-product " in section
    page = (tmp_path / "lb" / "index.html").read_text()
    data = json.loads(page.split('id="board-data">', 1)[1].split("</script>", 1)[0])
    [sensitivity] = [s for s in data["sections"] if s["title"] == "Sensitivity"]
    assert {row["variant"]: row["verdict"] for row in sensitivity["tables"][0]["rows"]} == \
        {"dot-product": "passed", "exploding": "failed"}
    assert [u["variant"] for u in data["unranked"]] == ["exploding"]


def test_contributing_shows_the_example_suite_as_it_is():
    text = (ROOT / "CONTRIBUTING.md").read_text().split("## Writing a suite", 1)[1]
    shown = text.split("```python\n", 1)[1].split("```", 1)[0]
    assert shown == (ROOT / "examples" / "zoo-sensitivity" / "zoo_sensitivity" / "__init__.py").read_text()
