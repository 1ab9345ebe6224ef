"""The layout the zoo promises: nothing outside a suite's own module names the suite or its checks."""

import ast
import re
from pathlib import Path

from zoo.registry import load_registry

ROOT = Path(__file__).resolve().parent.parent
SUITE_BLIND = ["zoo/leaderboard.py", "zoo/board.py", "zoo/ranking.py", "zoo/webpage.py", "zoo/cli.py", "zoo/plots.py",
               "zoo/harness.py", "zoo/runner.py", "zoo/registry.py", "zoo/compare.py", "zoo/profiles.py"]
"""The board writer, the page, the gate, the CLI and the harness: they read what suites declare. (zoo/testing.py is
the correctness suite's API for plugin authors, ``zoo check`` and ``parametrize_with_checks``: it names that suite
by design.)"""
FAMILIES = re.compile(r"^x-|-(plan|exponent|time|first-call|agreement|flops|memory)$")
"""Names built from a callable's: what a module that read rows by name would spell out."""


def _names() -> set[str]:
    registry = load_registry(builtins=False, entry_points=False)
    core = {name: suite for name, suite in registry.suites.items() if suite.origin.kind == "core"}
    return (set(core) | {c.name for c in registry.checks if c.origin.kind == "core"}
            | {m.name for suite in core.values() for m in suite.measures})


def _spelled(source: str, names: set[str], suites: set[str]) -> list[tuple[int, str]]:
    """Where ``source`` spells one of ``names`` as code would: a whole string (an f-string's parts too), a hyphenated
    name anywhere inside one (a query such as 'check == "time-ratio"'), or a suite's name as an option or a
    comparison would spell it (``--suite speed``, ``suite == 'speed'``, ``speed.repeats=``); English words in
    prose ("whatever its speed") and docstrings are not code."""
    tree = ast.parse(source)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body
                  and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    suite = "|".join(map(re.escape, sorted(suites)))
    as_code = re.compile(rf"--suite[ =]({suite})\b|==\s*['\"]({suite})['\"]|\b({suite})\.[a-z_]+=")
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) or id(node) in docstrings:
            continue
        word = node.value.strip()
        tokens = re.findall(r"[a-z0-9][a-z0-9-]*[a-z0-9]", node.value)
        if (word in names or (" " not in word and FAMILIES.search(word))
                or any("-" in token and token in names for token in tokens) or as_code.search(node.value)):
            found.append((node.lineno, node.value))
    return found


def test_no_suite_blind_module_spells_a_built_in_suites_or_checks_name():
    names = _names() - {"allocator"}  # also a run's environment entry (compare.py reads that one)
    suites = {name for name, suite in load_registry(builtins=False, entry_points=False).suites.items()
              if suite.origin.kind == "core"}
    assert {"correctness", "speed", "time", "flops-exponent"} <= names and "speed" in suites  # what would be spelled
    found = [f"{module}:{line}: {text!r}" for module in SUITE_BLIND
             for line, text in _spelled((ROOT / module).read_text(), names, suites)]
    assert found == []
    spelled = _spelled('''
"""A docstring may say correctness or time-ratio."""
a = f"--suite correctness {x}"
b = rows.query(\'check == "time-ratio"\')
c = "x-torch-sdpa"
d = "whatever its speed, the time it takes"
e = f"--set speed.repeats={n}"
''', names, suites)
    assert sorted(line for line, _ in spelled) == [3, 4, 5, 7]  # the mutants this test exists to catch, not the prose


def test_each_suite_owns_its_settings_nested_in_the_profile_and_an_unknown_one_is_refused_by_name():
    import pytest

    from zoo import ZooError
    from zoo.harness import SuiteOverrides
    from zoo.profiles import PROFILES, Profile, get_profile, resolve

    suites = load_registry(builtins=False, entry_points=False).suites
    asked = SuiteOverrides({"lengths": (64, 96), "d_model": None}, {"speed": {"repeats": 3}})
    profile = resolve(PROFILES["quick"], suites, asked.per_suite(suites))
    assert profile.of("speed").lengths == (64, 96) and profile.of("complexity").lengths == (64, 96)
    assert profile.of("speed").repeats == 3 and profile.of("speed").reference_length == 96  # settled: a timed n
    assert profile.of("correctness").cases == 3 and get_profile("full", suites).of("correctness").cases == 8
    assert Profile.from_dict(profile.as_dict(), suites) == profile  # what a worker reads back, no registry needed
    for given, message in (({"speed": {"lenghts": (64,)}}, "the speed suite has no setting 'lenghts'"),
                           ({"nope": {"x": 1}}, "no suite 'nope'"),
                           ({"speed": {"reference_length": "abc"}}, "--set speed.reference_length: expected a number, got 'abc'"),
                           ({"speed": {"baselines_in_every_mode": 1}}, "--set speed.baselines_in_every_mode: expected true or false")):
        with pytest.raises(ZooError, match=message):
            resolve(PROFILES["quick"], suites, given)
    one = resolve(PROFILES["quick"], suites, {"speed": {"modes": "full"}})  # --set speed.modes=full, not JSON
    assert one.of("speed").modes == ("full",)
    legacy = Profile.from_dict({"name": "quick", "speed_lengths": [256], "repeats": 7, "cases": 2}, suites)
    assert legacy.of("speed").lengths == (256,) and legacy.of("speed").repeats == 7 and legacy.of("correctness").cases == 2


def test_every_public_name_of_the_zoo_says_what_it_is_for():
    """Hook implementations are documented by their hook (zoo/hookspecs.py); forward/backward by their module."""
    missing = []
    for path in sorted((ROOT / "zoo").rglob("*.py")):
        tree = ast.parse(path.read_text())

        def visit(nodes, prefix=""):
            for node in nodes:
                if not isinstance(node, (ast.FunctionDef, ast.ClassDef)) or node.name.startswith("_"):
                    continue
                if node.name.startswith("zoo_") or node.name in ("forward", "backward"):
                    continue
                if not ast.get_docstring(node):
                    missing.append(f"{path.relative_to(ROOT)}:{node.lineno} {prefix}{node.name}")
                if isinstance(node, ast.ClassDef):
                    visit(node.body, f"{node.name}.")

        visit(tree.body)
    assert missing == []
