"""The complexity suite's verdicts follow the counts: a false claim is caught."""

import dataclasses

import zoo
from zoo.checks import FAILED, PASSED
from zoo.profiles import PROFILES
from zoo.suites.complexity import run_complexity

PROFILE = PROFILES["smoke"]


def rows_by_check(variant):
    rows = list(run_complexity(variant, PROFILE))
    return {(r.check, r.mode, r.phase): r for r in rows if r.n is None}, rows


def test_linear_claim_holds_and_sdpa_is_counted_alongside(registry):
    verdicts, rows = rows_by_check(registry.variant("linear"))
    assert verdicts[("flops-exponent", "causal", "fwd")].status == PASSED
    assert abs(verdicts[("flops-exponent", "causal", "fwd")].value - 1) < 0.1
    assert any(r.check == "torch-sdpa-flops" and r.value > 0 for r in rows)


def test_a_false_linear_claim_for_quadratic_attention_is_violated(registry):
    liar = dataclasses.replace(registry.variant("dot-product"), name="liar", complexity=zoo.Complexity(time=1, memory=1))
    verdicts, _ = rows_by_check(liar)
    flops = verdicts[("flops-exponent", "full", "fwd")]
    assert flops.status == FAILED and "claimed 1" in flops.detail and flops.value > 1.8


def test_analytic_flop_formula_is_checked(registry):
    _, rows = rows_by_check(registry.variant("multi-head"))
    formula = [r for r in rows if r.check == "flops-formula"]
    assert formula and all(r.status == PASSED for r in formula)
    wrong = dataclasses.replace(registry.variant("multi-head"), flops=lambda **kw: 1.0)
    _, rows = rows_by_check(wrong)
    assert all(r.status == FAILED for r in rows if r.check == "flops-formula")


def test_memory_against_baseline_is_reported(registry):
    _, rows = rows_by_check(registry.variant("additive"))
    ratios = [r for r in rows if r.check == "memory-vs-naive-broadcast"]
    assert ratios and all(0 < r.value < 1 for r in ratios if r.n >= 128)


def test_half_precision_halves_the_memory_and_keeps_the_flops(registry):
    variant = registry.variant("dot-product")
    full, half = (list(run_complexity(variant, PROFILE.with_overrides(dtype=dtype))) for dtype in ("float32", "float16"))

    def counted(rows, check):
        return {(r.mode, r.phase, r.n): r.value for r in rows if r.check == check}

    assert counted(full, "flops") == counted(half, "flops")
    ratios = [counted(half, "memory")[k] / v for k, v in counted(full, "memory").items()]
    assert ratios and all(abs(r - 0.5) < 0.05 for r in ratios), ratios
