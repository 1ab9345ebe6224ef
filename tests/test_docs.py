"""The plugin example in CONTRIBUTING.md is real code: it loads and passes the correctness suite."""

import re
from pathlib import Path

from zoo.checks import PASSED, SKIPPED
from zoo.profiles import get_profile
from zoo.registry import load_registry

ROOT = Path(__file__).resolve().parent.parent


def test_contributing_example_plugin_loads_and_passes_correctness(tmp_path):
    text = (ROOT / "CONTRIBUTING.md").read_text()
    example = re.search(r"```python\n(# my_attention.py\n.*?)```", text, re.S).group(1)
    (tmp_path / "my_attention.py").write_text(example)
    registry = load_registry([tmp_path])
    assert registry.failures == []
    variant = registry.variant("my-attention")
    for check in registry.checks_for("correctness"):
        if check.applies(variant.tags) is None:
            statuses = {r.status for r in check.run(variant, get_profile("smoke"))}
            assert statuses <= {PASSED, SKIPPED}, check.name


def test_readme_test_command_is_what_ci_runs():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    command = re.findall(r"```bash\n(.*?)\n```", readme, re.S)[1]
    assert command.strip() in ci


def test_contributing_documents_every_hook_with_its_signature_and_docstring():
    import inspect

    from zoo import hookspecs

    text = (ROOT / "CONTRIBUTING.md").read_text()
    hooks = [f for name, f in vars(hookspecs).items() if name.startswith("zoo_") and callable(f)]
    assert hooks
    for hook in hooks:
        assert f"### `{hook.__name__}{inspect.signature(hook)}`" in text
        assert inspect.cleandoc(hook.__doc__) in text


def test_the_readme_python_snippet_runs_verbatim(tmp_path):
    """The tour's "In Python" block, as a reader pastes it, then what its comments promise."""
    from conftest import run_python

    readme = (ROOT / "README.md").read_text()
    snippet = re.search(r"## In Python\n\n```python\n(.*?)```", readme, re.S).group(1)
    promises = ('\nfrom pathlib import Path\n'
                'assert zoo.list_variants("multi-*") == ["multi-head", "multi-query"]\n'
                'assert out.shape == (2, 300, 512)\n'
                'assert set(results.variant) == {"windowed", "linear"} and Path(results.attrs["leaderboard"]).is_file()\n')
    done = run_python("-c", snippet + promises, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "board" / "README.md").is_file()


def test_contributing_has_a_row_for_every_field_of_the_variant_contract():
    import dataclasses

    import zoo

    text = (ROOT / "CONTRIBUTING.md").read_text()
    table = text.split("Every field of `zoo.Variant`", 1)[1].split("\n\n", 2)[1]
    documented = {name.strip(" `") for row in table.splitlines()[2:] for name in row.split("|")[1].split(",")}
    assert {f.name for f in dataclasses.fields(zoo.Variant)} == documented
