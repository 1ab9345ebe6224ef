"""The docs are held to the code: CONTRIBUTING.md's example plugin loads and passes the correctness suite, its
contract reference names every field, check kind and helper the code has (with exact signatures), and the README's
commands and snippet run as written."""

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


# The contract's reference in CONTRIBUTING.md, held to the code: every list below comes from the code itself.

def _contributing() -> str:
    return (ROOT / "CONTRIBUTING.md").read_text()


def _section(text: str, heading: str) -> str:
    """The text under a Markdown heading (any level) up to the next heading of the same or a higher level."""
    level = heading.split(" ", 1)[0]
    body = text.split(f"\n{heading}\n", 1)[1]
    ends = [body.find(f"\n{'#' * depth} ") for depth in range(1, len(level) + 1)]
    ends = [end for end in ends if end >= 0]
    return body[:min(ends)] if ends else body


def _table(section: str) -> list[list[str]]:
    """The cells of the first Markdown table in ``section``, header and rule left out."""
    lines = section.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return [[cell.strip() for cell in line.strip().strip("|").split(" | ")] for line in lines[start + 2:end]]


def _names(cell: str) -> set[str]:
    """`a`, `b` -> {a, b}."""
    return {name.strip(" `") for name in cell.split(",")}


def _code_words(text: str) -> set[str]:
    """Every identifier inside a `code span` or a code block of ``text``."""
    spans = re.findall(r"```.*?```|`[^`]+`", text, re.S)
    return {word for span in spans for word in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", span)}


def _plain_signature(function) -> str:
    """``(a, b=1, *, c=None, **options)``: the signature without annotations, as CONTRIBUTING writes it."""
    import inspect

    signature = inspect.signature(function)
    return str(signature.replace(parameters=[p.replace(annotation=p.empty) for p in signature.parameters.values()],
                                 return_annotation=signature.empty))


def _public_functions(module) -> dict:
    import inspect

    return {name: f for name, f in vars(module).items()
            if not name.startswith("_") and inspect.isfunction(f) and f.__module__ == module.__name__}


def test_contributing_documents_each_contract_class_field_by_field():
    """The table under each class's heading names exactly its dataclass fields; Tags' gives each default."""
    import dataclasses

    import zoo

    text = _contributing()
    for cls in (zoo.Tags, zoo.Complexity, zoo.Target, zoo.Decoder, zoo.Departure, zoo.RandomFeatures):
        rows = _table(_section(text, f"### `zoo.{cls.__name__}`"))
        documented = {name for row in rows for name in _names(row[0])}
        assert documented == {f.name for f in dataclasses.fields(cls)}, cls.__name__
    defaults = {row[0].strip("`"): row[1].strip("`") for row in _table(_section(text, "### `zoo.Tags`"))}
    assert defaults == {f.name: repr(f.default) for f in dataclasses.fields(zoo.Tags)}


def test_contributing_names_every_kind_a_contract_field_takes():
    """Departure kinds, decoder growths, and every kind of row a registered suite yields with a value (what a
    Target's check can name) and every check a built-in's target names."""
    from zoo.contract import DEPARTURE_KINDS, QUALITY_MODEL_ARGUMENTS
    from zoo.decoding import GROWTHS, STANDARD_DECODES

    text = _contributing()
    kinds = _table("| kind |" + _section(text, "### `zoo.Departure`").split("| kind |", 1)[1])
    assert {row[0].strip("`"): row[1] for row in kinds} == DEPARTURE_KINDS
    decoder = _section(text, "### `zoo.Decoder`")
    assert all(f'`"{growth}"`' in decoder for growth in GROWTHS)
    assert all(f'"{label}"' in text for label in STANDARD_DECODES.values())
    assert all(f"`{argument}`" in _section(text, "### `zoo.Variant`") for argument in QUALITY_MODEL_ARGUMENTS)

    registry = load_registry()
    target_kinds = _section(text, "#### What a target's `check` can name")
    measures = {m.name for suite in registry.suites.values() for m in suite.measures if m.unit}
    assert measures, "no suite declares a measure with a unit"
    assert sorted(m for m in measures if f"`{m}`" not in target_kinds) == []
    used = {t.check for name in registry.list_variants() for t in registry.variant(name).targets}
    assert used and used <= {row[0].strip("`") for row in _table(target_kinds)}


def test_contributing_gives_every_helper_with_its_exact_signature():
    """Every public function of zoo.functional, zoo.reference and zoo.decoding, every zoo function a built-in or
    example plugin imports, and zoo's own API, each written `name(signature)` in its module's section."""
    import ast
    import importlib

    import zoo
    from zoo import decoding, functional, reference

    text = _contributing()
    wanted = {module.__name__: set(_public_functions(module)) for module in (functional, reference, decoding)}
    sources = [*(ROOT / "plugins").glob("*.py"), *(ROOT / "examples").glob("*/*/*.py")]
    for source in sources:
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("zoo."):
                wanted.setdefault(node.module, set()).update(alias.name for alias in node.names)
    assert len(wanted) >= 4
    for module_name, names in wanted.items():
        module = importlib.import_module(module_name)
        section = _section(text, f"### `{module_name}`")
        for name in names:
            helper = getattr(module, name)
            if callable(helper) and not isinstance(helper, type):
                assert f"`{name}{_plain_signature(helper)}`" in section, f"{module_name}.{name}"
            else:
                assert f"`{name}`" in section, f"{module_name}.{name}"
    api = _section(text, "### `zoo`")
    for name in ("build", "create", "list_variants", "load_registry", "default_registry", "requires"):
        assert f"`{name}{_plain_signature(getattr(zoo, name))}`" in api, name
    assert all(f"`zoo.{name}`" in text for name in zoo.__all__)


def test_contributing_writing_a_suite_names_every_field_of_the_suite_contract():
    import dataclasses

    import zoo

    words = _code_words(_contributing().split("## Writing a suite", 1)[1].split("\n## ", 1)[0])
    for cls in (zoo.Suite, zoo.Check, zoo.Result, zoo.Measure, zoo.Axis, zoo.Ranking, zoo.RankFigure, zoo.Section,
                zoo.Table):
        missing = [f.name for f in dataclasses.fields(cls) if f.name not in words]
        assert missing == [], f"zoo.{cls.__name__}: {missing}"


def test_contributing_documents_the_contract_in_place_not_by_pointing_at_the_source():
    text = _contributing()
    for pointer in ("see zoo/", "see the source", "documented there", "all in `zoo/contract.py`"):
        assert pointer not in text
