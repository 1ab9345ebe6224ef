"""Registry behaviour with real plugins: files, an entry point of a small distribution, and bad plugins."""

import sys

import pytest

import zoo
from zoo.profiles import get_profile
from zoo.registry import PluginLoadError, load_registry

from conftest import BUILTINS, good_plugin



def test_builtins_and_core_suites_load_without_failures(registry):
    assert set(registry.list_variants()) == set(BUILTINS)
    assert registry.failures == []
    assert {"correctness", "complexity", "speed"} <= set(registry.suite_names())
    origins = {registry.variant(n).origin.kind for n in BUILTINS}
    assert origins == {"builtin"}


def test_builtins_are_not_importable_as_a_top_level_plugins_package(registry):
    module = sys.modules[type(zoo.create("windowed", d_model=8, registry=registry)).__module__]
    assert module.__name__ == "zoo_builtins.windowed"


def test_plugins_dir_file_is_registered_with_its_origin(write_plugin):
    directory = write_plugin("mine", good_plugin("my-variant"))
    registry = load_registry([directory])
    variant = registry.variant("my-variant")
    assert variant.origin.kind == "file"
    assert variant.origin.location.endswith("mine.py")
    assert registry.failures == []


def test_env_plugins_dir_is_read(write_plugin, monkeypatch):
    monkeypatch.setenv("ZOO_PLUGINS_DIR", str(write_plugin("mine", good_plugin("from-env"))))
    assert "from-env" in load_registry().list_variants()


def test_broken_import_is_recorded_and_others_still_load(write_plugin):
    write_plugin("broken", "raise RuntimeError('boom at import')\n")
    directory = write_plugin("fine", good_plugin("fine-variant"))
    registry = load_registry([directory])
    assert "fine-variant" in registry.list_variants()
    assert set(BUILTINS) <= set(registry.list_variants())
    [failure] = registry.failures
    assert failure.plugin == "broken"
    assert "boom at import" in failure.error and "broken.py" in failure.origin


def test_strict_mode_turns_a_failure_into_an_error(write_plugin):
    directory = write_plugin("broken", "raise RuntimeError('boom')\n")
    with pytest.raises(PluginLoadError, match="boom"):
        load_registry([directory], strict=True)


def test_duplicate_name_names_both_origins_and_keeps_the_first(write_plugin):
    directory = write_plugin("dup", good_plugin("linear"))
    registry = load_registry([directory])
    [failure] = registry.failures
    assert "already registered by linear (builtin" in failure.error
    assert "dup.py" in failure.origin
    assert registry.variant("linear").origin.kind == "builtin"


def test_invalid_registration_is_refused_with_the_reason(write_plugin):
    directory = write_plugin("badname", good_plugin("Bad Name!"))
    registry = load_registry([directory])
    assert "Bad Name!" not in registry.variants
    [failure] = registry.failures
    assert "does not match" in failure.error and failure.plugin == "badname"


@pytest.mark.parametrize("target, problem", [
    ("no-such-variant", "which is not registered"),
    ("linear", "which is itself an approximation"),
    ("multi-head", "which has parameters"),
])
def test_approximating_something_that_cannot_be_compared_is_a_registration_failure(write_plugin, target, problem):
    source = good_plugin("approx", variant=f'approximates="{target}"')
    registry = load_registry([write_plugin("approx", source)])
    assert "approx" not in registry.variants and "approx" not in registry.plugins["approx"].variants
    [failure] = registry.failures
    assert f"variant 'approx' approximates '{target}', {problem}" in failure.error and failure.plugin == "approx"


def test_approximating_a_registered_exact_core_is_measured_against_it(write_plugin):
    source = good_plugin("approx", variant='approximates="dot-product"')
    registry = load_registry([write_plugin("approx", source)])
    variant = registry.variant("approx")
    assert variant.approximated is registry.variant("dot-product")
    [check] = [c for c in registry.checks_for("correctness") if c.name == "approximation"]
    rows = list(check.run(variant, get_profile("smoke")))
    assert rows and all(r.status == "passed" and r.value < 1e-6 for r in rows), rows  # it computes the same


def test_hook_typo_is_reported(write_plugin):
    directory = write_plugin("typo", """
        import zoo

        @zoo.hookimpl
        def zoo_register_variant(register):
            pass
    """)
    registry = load_registry([directory])
    [failure] = registry.failures
    assert "zoo_register_variant matches no hook" in failure.error


def test_unmarked_hook_function_still_registers(write_plugin):
    directory = write_plugin("unmarked", good_plugin("unmarked-variant", hookimpl=False))
    assert "unmarked-variant" in load_registry([directory]).list_variants()


def test_hook_that_raises_is_recorded(write_plugin):
    directory = write_plugin("raiser", """
        def zoo_register_variants(register):
            raise ValueError("cannot register today")
    """)
    [failure] = load_registry([directory]).failures
    assert "cannot register today" in failure.error


def test_block_and_only_controls(write_plugin, monkeypatch):
    directory = write_plugin("mine", good_plugin("my-variant"))
    monkeypatch.setenv("ZOO_BLOCK_PLUGINS", "linear,mine")
    names = load_registry([directory]).list_variants()
    assert "linear" not in names and "my-variant" not in names and "windowed" in names
    monkeypatch.delenv("ZOO_BLOCK_PLUGINS")
    monkeypatch.setenv("ZOO_PLUGINS", "mine")
    registry = load_registry([directory])
    assert registry.list_variants() == ["my-variant"]
    assert "correctness" in registry.suite_names()  # the harness's own suites are not plugins one opts into


@pytest.fixture
def installed_distribution(tmp_path, monkeypatch):
    """A small distribution on sys.path declaring an entry point in group ``zoo``."""
    site = tmp_path / "site"
    package = site / "zoo_test_dist"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(good_plugin("from-entry-point"))
    info = site / "zoo_test_dist-1.2.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: zoo-test-dist\nVersion: 1.2.3\n")
    (info / "entry_points.txt").write_text("[zoo]\ntestdist = zoo_test_dist\n")
    monkeypatch.syspath_prepend(str(site))
    yield
    sys.modules.pop("zoo_test_dist", None)


def test_entry_point_distribution_is_loaded_with_name_and_version(installed_distribution):
    registry = load_registry()
    origin = registry.variant("from-entry-point").origin
    assert (origin.kind, origin.plugin, origin.distribution, origin.version) == ("entrypoint", "testdist", "zoo-test-dist", "1.2.3")


def test_entry_point_autoload_can_be_turned_off(installed_distribution, monkeypatch):
    monkeypatch.setenv("ZOO_DISABLE_PLUGIN_AUTOLOAD", "1")
    assert "from-entry-point" not in load_registry().list_variants()


def test_list_variants_wildcards(registry):
    assert registry.list_variants("*head*") == ["multi-head"]
    assert registry.list_variants(["lin*", "win*"]) == ["linear", "linformer", "windowed"]
    assert registry.list_variants("nothing*") == []


def test_unknown_variant_suggests_close_matches(registry):
    with pytest.raises(zoo.contract.UnknownVariantError, match="did you mean windowed"):
        registry.variant("windowd")
