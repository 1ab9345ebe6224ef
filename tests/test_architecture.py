"""The layout the zoo promises: nothing outside a suite's own module names the suite or its checks."""

import ast
import re
from pathlib import Path

from zoo.registry import load_registry

ROOT = Path(__file__).resolve().parent.parent
SUITE_BLIND = ["zoo/leaderboard.py", "zoo/board.py", "zoo/ranking.py", "zoo/webpage.py", "zoo/cli.py", "zoo/plots.py",
               "zoo/harness.py", "zoo/runner.py", "zoo/registry.py"]
"""The board writer, the page, the gate, the CLI and the harness: they read what suites declare."""
FAMILIES = re.compile(r"^x-|-(plan|exponent|time|first-call|agreement|flops|memory)$")
"""Names built from a callable's: what a module that read rows by name would spell out."""


def _names() -> set[str]:
    registry = load_registry(builtins=False, entry_points=False)
    core = {name: suite for name, suite in registry.suites.items() if suite.origin.kind == "core"}
    return (set(core) | {c.name for c in registry.checks if c.origin.kind == "core"}
            | {m.name for suite in core.values() for m in suite.measures})


def test_no_suite_blind_module_spells_a_built_in_suites_or_checks_name():
    names = _names()
    assert {"correctness", "speed", "time", "flops-exponent"} <= names  # what would be spelled
    found = []
    for module in SUITE_BLIND:
        for node in ast.walk(ast.parse((ROOT / module).read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                word = node.value.strip()
                if word in names or (" " not in word and FAMILIES.search(word)):
                    found.append(f"{module}:{node.lineno}: {node.value!r}")
    assert found == []
