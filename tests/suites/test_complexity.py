"""The complexity suite's verdicts follow the counts: a false claim is caught."""

import dataclasses

import torch

import zoo
from zoo.checks import FAILED, PASSED
from zoo.profiles import get_profile
from zoo.suites.complexity import run_complexity

PROFILE = get_profile("smoke")


def rows_by_check(variant):
    rows = list(run_complexity(variant, PROFILE))
    return {(r.check, r.mode, r.phase): r for r in rows if r.n is None}, rows


def test_linear_claim_holds_and_sdpa_is_counted_alongside(registry):
    verdicts, rows = rows_by_check(registry.variant("linear"))
    assert verdicts[("flops-exponent", "causal", "fwd")].status == PASSED
    assert abs(verdicts[("flops-exponent", "causal", "fwd")].value - 1) < 0.1
    assert any((r.check, r.versus) == ("flops", "torch-sdpa") and r.value > 0 for r in rows)


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
    ratios = [r for r in rows if (r.check, r.versus) == ("memory-ratio", "naive-broadcast")]
    assert ratios and all(0 < r.value < 1 for r in ratios if r.n >= 128)


def test_half_precision_halves_the_memory_and_keeps_the_flops(registry):
    variant = registry.variant("dot-product")
    full, half = (list(run_complexity(variant, PROFILE.with_overrides(dtype=dtype))) for dtype in ("float32", "float16"))

    def counted(rows, check):
        return {(r.mode, r.phase, r.n): r.value for r in rows if r.check == check}

    assert counted(full, "flops") == counted(half, "flops")
    ratios = [counted(half, "memory")[k] / v for k, v in counted(full, "memory").items()]
    assert ratios and all(abs(r - 0.5) < 0.05 for r in ratios), ratios


def _formula_verdicts(variant):
    from zoo.suites.complexity import count_forward, cross_shape, formula_row

    n = PROFILE.of("complexity").lengths[0]
    rows = [formula_row(variant, PROFILE, n, n, {}, count_forward(variant, PROFILE, n, n))]
    if variant.tags.allows_different_lengths:
        q_len, k_len, kv = cross_shape(variant, PROFILE)
        rows.append(formula_row(variant, PROFILE, q_len, k_len, kv, count_forward(variant, PROFILE, q_len, k_len, **kv)))
    return rows


def test_every_built_in_flop_formula_matches_the_counted_flops_on_self_and_cross_shapes(registry):
    for name in registry.list_variants():
        variant = registry.variant(name)
        if variant.flops is not None:
            rows = _formula_verdicts(variant)
            assert all(r.status == PASSED for r in rows), (name, [(r.setting, r.detail) for r in rows])


def test_a_formula_that_mixes_up_queries_and_keys_is_caught_at_a_cross_shape(registry):
    """Right on self-attention, where q_len equals k_len; wrong as soon as they differ."""
    cross = registry.variant("cross")
    right = cross.flops

    def swapped(batch, q_len, k_len, d_model, num_heads, **options):
        return right(batch=batch, q_len=k_len, k_len=q_len, d_model=d_model, num_heads=num_heads, **options)

    verdicts = _formula_verdicts(dataclasses.replace(cross, flops=swapped))
    assert [r.status for r in verdicts] == [PASSED, FAILED]
    assert "q_len=64 k_len=128 kdim=32 vdim=128" in verdicts[1].setting


def test_the_variant_page_says_what_a_fitted_exponent_means_against_the_claim():
    from zoo.suites.complexity import EXPONENT_TOLERANCE, exponent_reading

    assert exponent_reading(2.02, 2) == "as claimed"
    assert exponent_reading(0.08, 1).startswith("grows slower than claimed over the lengths measured")
    assert exponent_reading(1 + EXPONENT_TOLERANCE + 0.01, 1).startswith("grows faster than claimed: the claim fails")
    assert exponent_reading(None, 1) == ""


def test_what_a_callable_builds_once_and_keeps_is_not_charged_to_the_phase_counted_first(registry):
    """A baseline that builds a 4 MiB table at its first call and keeps it (as a cached mask is kept) counts, in
    both phases, what the same callable without the table counts: a steady call's memory, whichever phase ran
    first."""
    variant = registry.variant("dot-product")

    def keeping(module):
        kept = []

        def run(query, key, value, attn_mask=None, is_causal=False):
            if not kept:
                kept.append(torch.ones(1 << 20))
            return module(query, key, value, attn_mask, is_causal)
        return run

    twin = dataclasses.replace(variant, baselines={"keeping": keeping, "plain": lambda module: module})
    rows = list(run_complexity(twin, PROFILE))
    memory = {(r.versus, r.mode, r.phase, r.n): r.value for r in rows if r.check == "memory"}
    kept = {key[1:]: value for key, value in memory.items() if key[0] == "keeping"}
    assert kept and kept == {key[1:]: value for key, value in memory.items() if key[0] == "plain"}


def test_a_variant_counts_a_steady_call_too_what_its_module_builds_at_its_first_call_is_not_counted(registry):
    """The variant is not called again before its counts: its finiteness check was its first call on the same module
    at the same length, so a table its module builds then and keeps is outside both phases' counts, as a
    baseline's is."""
    variant = registry.variant("dot-product")

    class Keeping(variant.factory):
        def forward(self, *args, **kwargs):
            if not hasattr(self, "kept"):
                self.kept = torch.ones(1 << 20)
            return super().forward(*args, **kwargs)

    def memory(twin):
        return {(r.mode, r.phase, r.n): r.value for r in run_complexity(twin, PROFILE) if r.check == "memory"
                and not r.versus}

    plain = memory(variant)
    assert plain and memory(dataclasses.replace(variant, factory=Keeping)) == plain
