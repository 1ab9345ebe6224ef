"""The conformance suite for plugin authors' own pytest suites (in the spirit of scikit-learn's
``parametrize_with_checks``)::

    from zoo.testing import parametrize_with_checks

    @parametrize_with_checks(["my-attention"], expected_failures={"key-permutation": "ALiBi is positional"})
    def test_conformance(variant, check):
        check(variant)

Each applicable correctness check becomes its own test with a readable id (``my-attention-gradcheck``);
checks the variant's tags rule out are skipped with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

from .checks import ERROR, FAILED, PASSED, SKIPPED, Check, Result
from .checks import run_check as run_check_rows
from .contract import Variant
from .profiles import Profile, get_profile

if TYPE_CHECKING:
    from .registry import Registry

SUITE = "correctness"


@dataclass
class CheckOutcome:
    """One check's verdict on one variant: its rows, and for a failure the smallest failing case."""

    check: str
    status: str
    rows: list[Result] = field(default_factory=list)
    reason: str = ""

    @property
    def smallest_failure(self) -> Result | None:
        """The failing row of the smallest case (the easiest to debug)."""
        failures = [r for r in self.rows if r.status in (FAILED, ERROR)]
        return min(failures, key=_case_size) if failures else None

    def describe(self) -> str:
        """The outcome in one line."""
        if self.status == SKIPPED:
            return f"{self.check}: skipped ({self.reason})"
        if self.status == PASSED:
            cases = f"{self.check}: passed ({sum(r.status == PASSED for r in self.rows)} cases)"
            judged = [r for r in self.rows if r.status == PASSED and r.value is not None]
            if not judged:
                return cases
            largest = max(judged, key=lambda r: r.value)  # the figure nearest its bound, for the checks' errors
            return (f"{cases}; largest figure judged: {largest.value:.3g}{f' {largest.unit}' if largest.unit else ''}"
                    f" [{largest.setting or 'no setting'}]" + (f" {largest.detail}" if largest.detail else ""))
        worst = self.smallest_failure
        failed = sum(r.status in (FAILED, ERROR) for r in self.rows)
        value = f", value {worst.value:.3g} {worst.unit}" if worst.value is not None else ""
        return (f"{self.check}: {self.status} in {failed} of {len(self.rows)} cases; smallest: "
                f"[{worst.setting or 'no setting'}] {worst.detail}{value}")


def _case_size(row: Result) -> int:
    """batch * q_len * k_len * d_model of the case a row ran on (large for a row of no case)."""
    shape = row.params or {}
    if not any(key in shape for key in ("batch", "q_len", "k_len", "d_model")):
        return 1 << 62
    size = 1
    for key in ("batch", "q_len", "k_len", "d_model"):
        size *= int(shape.get(key, 1))
    return size


def _resolve(variant: Variant | str, registry=None) -> Variant:
    if isinstance(variant, Variant):
        return variant
    from .api import default_registry

    return (registry or default_registry()).variant(variant)


def run_check(check: Check, variant: Variant, profile: Profile, kinds=None) -> CheckOutcome:
    """One check on one variant, as an outcome (``kinds``: the row kinds its suite declares, as a run holds it to)."""
    rows = run_check_rows(check, variant, profile, kinds=kinds)
    statuses = {r.status for r in rows}
    if statuses <= {SKIPPED}:  # ruled out by the tags, or e.g. no baselines declared: nothing was checked
        return CheckOutcome(check.name, SKIPPED, rows, reason="; ".join(sorted({r.detail for r in rows})))
    status = ERROR if ERROR in statuses else FAILED if FAILED in statuses else PASSED
    return CheckOutcome(check.name, status, rows)


def correctness_checks(registry=None) -> list[Check]:
    """The correctness suite's checks."""
    from .api import default_registry

    return (registry or default_registry()).checks_for(SUITE)


def _correctness_kinds(registry=None):
    """The row kinds the correctness suite declares (a run holds its checks' rows to them)."""
    from .api import default_registry

    registry = registry or default_registry()
    return registry.suite(SUITE).row_kinds(registry.checks_for(SUITE))


def variants_of(target: str, installed: Callable[[], "Registry"] | None = None,
                warn: Callable[[Any], None] | None = None) -> tuple["Registry", list[str]]:
    """The variants ``zoo check TARGET`` checks, and the registry that holds them: ``target`` is an installed
    variant's name (``installed()`` gives the registry it is looked up in: the default one unless given), a
    module or a ``.py`` file (loaded beside the core suites alone: only its own variants are checked). A target
    that names none is refused in one line saying what to do. ``warn(failure)`` hears of each plugin that failed
    to load: in the installed registry as soon as it is loaded, in the file's or module's before a refusal (the
    reason is often there; a dashed name is no module, so its failed import is not heard of)."""
    from pathlib import Path

    from .contract import OptionError
    from .registry import Registry

    def heard(registry: Registry) -> Registry:
        for failure in registry.failures if warn else ():
            warn(failure)
        return registry

    def alone(load) -> tuple[Registry, list[str]]:
        registry = Registry()
        registry.load_core()
        kind = load(registry)
        return registry, [n for record in registry.plugins.values() if record.origin.kind == kind
                          for n in record.variants]

    if target.endswith(".py"):
        if not Path(target).is_file():
            raise OptionError(f"TARGET: no such file {target!r}")
        registry, names = alone(lambda r: (r.load_file(target), "file")[1])
    else:
        from .api import default_registry

        registry = heard((installed or default_registry)())
        names = [target] if target in registry.variants else []
        if names:
            return registry, names
        registry, names = alone(lambda r: (r.load_module(target, "module"), "module")[1])
        if not names and not registry.failures:
            raise OptionError(f"TARGET {target!r} is neither a variant name nor a module or .py file that "
                              "registers one")
    if not names and "-" in target and not target.endswith(".py"):  # a variant's name (no module has a dash)
        scaffolded = Path(f"zoo-{target}")
        install = (f"pip install -e {scaffolded} (what zoo new wrote)" if (scaffolded / "pyproject.toml").is_file()
                   else "pip install the distribution that provides it")
        raise OptionError(f"TARGET {target!r} is not an installed variant: {install}, or give its .py file "
                          "(zoo list shows the installed ones)")
    heard(registry)  # why the file or module registered none (a dashed name is no module: nothing to hear)
    if not names:
        raise OptionError(f"TARGET {target!r} registered no variant")
    return registry, names


def check_variant(variant: Variant | str, profile: str | Profile = "quick", registry=None) -> list[CheckOutcome]:
    """Run every correctness check on one variant (a name or a :class:`zoo.Variant`)."""
    profile = get_profile(profile, registry.suites if registry else None) if isinstance(profile, str) else profile
    resolved = _resolve(variant, registry)
    kinds = _correctness_kinds(registry)
    return [run_check(check, resolved, profile, kinds) for check in correctness_checks(registry)]


class _BoundCheck:
    """What a parametrized test receives as ``check``: call it with the variant."""

    def __init__(self, check: Check, profile: Profile, kinds=None) -> None:
        self.check, self.profile, self.kinds = check, profile, kinds

    def __call__(self, variant: Variant) -> CheckOutcome:
        import pytest

        outcome = run_check(self.check, variant, self.profile, self.kinds)
        if outcome.status == SKIPPED:
            pytest.skip(outcome.reason)
        if outcome.status != PASSED:
            pytest.fail(outcome.describe(), pytrace=False)
        return outcome

    def __repr__(self) -> str:
        return self.check.name


def parametrize_with_checks(variants: Iterable[Variant | str], expected_failures: Mapping[str, str] | None = None,
                            profile: str = "quick", registry=None):
    """A ``pytest.mark.parametrize`` over (variant, check) for every correctness check.

    ``expected_failures`` maps a check name to the reason it is expected to fail for these variants;
    those tests are marked ``xfail(strict=True)`` so a fix is noticed too.
    """
    import pytest

    expected_failures = dict(expected_failures or {})
    resolved = [_resolve(v, registry) for v in variants]
    checks = correctness_checks(registry)
    unknown = sorted(set(expected_failures) - {c.name for c in checks})
    if unknown:
        raise ValueError(f"expected_failures names unknown checks {unknown}; known: {[c.name for c in checks]}")
    chosen = get_profile(profile, registry.suites if registry else None) if isinstance(profile, str) else profile
    kinds = _correctness_kinds(registry)
    params = []
    for variant in resolved:
        for check in checks:
            marks = ()
            if check.name in expected_failures:
                marks = (pytest.mark.xfail(reason=expected_failures[check.name], strict=True),)
            params.append(pytest.param(variant, _BoundCheck(check, chosen, kinds), id=f"{variant.name}-{check.name}", marks=marks))
    return pytest.mark.parametrize("variant, check", params)
