"""zoo.testing for plugin authors: check_variant reports, parametrize_with_checks in their pytest."""

import textwrap

import pytest

from zoo.registry import load_registry
from zoo.testing import check_variant, parametrize_with_checks

from conftest import good_plugin, run_python, run_zoo


@parametrize_with_checks(["windowed", "linear"])
def test_builtins_conform(variant, check):
    check(variant)


def test_check_variant_reports_skips_with_reasons(registry):
    outcomes = {o.check: o for o in check_variant("windowed", "smoke", registry)}
    assert outcomes["key-permutation"].status == "skipped" and "key_order_invariant" in outcomes["key-permutation"].reason
    assert outcomes["reference-float64"].status == "passed"


def test_expected_failures_become_strict_xfails_with_readable_ids(tmp_path):
    (tmp_path / "leaky.py").write_text(good_plugin("leaky", causal="False"))
    (tmp_path / "test_leaky.py").write_text(textwrap.dedent(f'''
        from zoo.registry import load_registry
        from zoo.testing import parametrize_with_checks

        registry = load_registry([{str(tmp_path)!r}])

        IGNORES_CAUSAL = "ignores is_causal"

        @parametrize_with_checks(["leaky"], profile="smoke", registry=registry, expected_failures={{
            "causal-leak": IGNORES_CAUSAL, "reference-float64": IGNORES_CAUSAL, "reference-float32": IGNORES_CAUSAL,
            "reference-low-precision": IGNORES_CAUSAL, "outlier-keys": IGNORES_CAUSAL, "long-sequences": IGNORES_CAUSAL}})
        def test_conformance(variant, check):
            check(variant)
    '''))
    out = run_python("-m", "pytest", "-q", "-rxX", tmp_path / "test_leaky.py", cwd=tmp_path, timeout=300)
    assert "XFAIL" in out.stdout and "test_conformance[leaky-causal-leak]" in out.stdout, out.stdout
    assert " failed" not in out.stdout and out.returncode == 0, out.stdout


def test_zoo_check_reports_the_smallest_failing_case(tmp_path):
    plugin = tmp_path / "leaky.py"
    plugin.write_text(good_plugin("leaky", causal="False"))
    out = run_zoo("check", plugin, timeout=300)
    assert out.returncode == 1
    line = next(l for l in out.stdout.splitlines() if "causal-leak" in l)
    assert "FAIL" in line and "smallest: [batch=2 q_len=10" in line and "future tokens" in line
    reference = next(l for l in out.stdout.splitlines() if "reference-float64" in l)
    assert "smallest: [batch=2 q_len=11 k_len=11" in reference and "causal" in reference


def test_expected_failures_must_name_real_checks():
    with pytest.raises(ValueError, match="unknown checks"):
        parametrize_with_checks(["linear"], expected_failures={"no-such-check": "why"})


def test_variants_of_finds_what_zoo_check_checks_and_refuses_a_target_that_names_none(tmp_path):
    """`zoo check TARGET` resolves its target through :func:`zoo.testing.variants_of`: a .py file's own variants
    (loaded beside the core suites alone), an installed variant by name, and one line for a target that names
    none, with why its plugin did not load."""
    from zoo.contract import OptionError
    from zoo.testing import variants_of

    plugin = tmp_path / "leaky.py"
    plugin.write_text(good_plugin("leaky"))
    registry, names = variants_of(str(plugin))
    assert names == ["leaky"] and set(registry.variants) == {"leaky"}
    installed = []
    registry, names = variants_of("linear", installed=lambda: installed.append(1) or load_registry())
    assert names == ["linear"] and installed == [1]
    with pytest.raises(OptionError, match="no such file"):
        variants_of(str(tmp_path / "absent.py"))
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('half-written plugin')\n")
    heard = []
    with pytest.raises(OptionError, match="registered no variant"):
        variants_of(str(broken), warn=heard.append)
    assert len(heard) == 1 and "half-written plugin" in heard[0].message()
    heard.clear()  # an installed plugin that failed is heard of too, though the target then falls back to a module
    with pytest.raises(OptionError, match="is not an installed variant"):
        variants_of("broken-thing", installed=lambda: load_registry([str(tmp_path)]), warn=heard.append)
    assert any("half-written plugin" in failure.message() for failure in heard)
