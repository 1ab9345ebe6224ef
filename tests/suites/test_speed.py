"""The speed suite reports medians, spread and ratios measured in one process (no timing asserts)."""

import torch

from zoo.profiles import get_profile
from zoo.suites.speed import run_approximation_error, run_speed

PROFILE = get_profile("smoke")


def test_speed_rows_cover_every_length_with_ratios_to_sdpa_and_baselines(registry):
    rows = list(run_speed(registry.variant("windowed"), PROFILE))
    checks = {(r.check, r.versus) for r in rows}
    assert {("time-ratio", "torch-sdpa"), ("time-ratio", "torch-sdpa-band"), ("time", "torch-sdpa")} <= checks
    assert {"matmul-peak", "allocator", "time", "time-iqr", "gflops", "peak-fraction", "tokens-per-s", "time-exponent",
            "backward-cost"} <= {check for check, versus in checks if not versus}
    time = {(r.n, r.phase): r.value for r in rows if r.check == "time" and r.mode == "full" and not r.versus}
    for row in (r for r in rows if r.check == "backward-cost" and r.mode == "full"):
        assert row.value == time[(row.n, "fwd+bwd")] / time[(row.n, "fwd")]
    timed = {r.n for r in rows if r.check == "time" and not r.versus}
    assert timed == set(PROFILE.of("speed").lengths)
    assert all(r.value > 0 for r in rows if r.check == "time-ratio")


def test_the_safety_net_stops_at_the_first_length_whose_call_is_over_the_limit_and_its_call_counts_the_flops(
        registry):
    variant = registry.variant("dot-product")
    lengths = PROFILE.of("speed").lengths
    stopped = [r for r in run_speed(variant, PROFILE.with_settings("speed", call_limit_seconds=1e-9))
               if r.check == "time" and not r.versus]
    assert [r.status for r in stopped if r.mode == "full"] == ["skipped"] * len(lengths)
    assert "safety net" in stopped[0].detail and f"n={lengths[0]}" in stopped[0].detail
    assert "not timed from this length on" in stopped[0].detail
    flops = [{(r.mode, r.phase, r.n): r.value for r in run_speed(variant, PROFILE.with_settings(
        "speed", call_limit_seconds=limit)) if r.check == "timed-flops"} for limit in (60.0, None)]
    assert flops[0] == flops[1] and len(flops[0]) == 2 * (len(lengths) + 1)  # the net's call counted as calibrate's
    assert all(flops[0][("full", "fwd+bwd", n)] > flops[0][("full", "fwd", n)] > 0 for n in lengths)


def test_approximation_error_is_measured_for_approximations_only(registry):
    [skipped] = run_approximation_error(registry.variant("dot-product"), PROFILE)
    assert skipped.status == "skipped" and "approximates=None" in skipped.detail
    everything = list(run_approximation_error(registry.variant("linear"), PROFILE))
    rows = [r for r in everything if r.check == "approximation-error"]
    settings = PROFILE.of("speed")
    assert {(r.mode, r.n) for r in rows} == {("full", n) for n in settings.lengths} | {
        ("causal", n) for n in settings.causal_lengths}  # causal only at the reference length in this profile
    assert len(rows) == len(settings.lengths) + len(settings.causal_lengths) and settings.causal_lengths == (256,)
    assert all(0 < r.value < 1 and r.unit == "normalised error" for r in rows), rows  # better than mean(V), not exact
    worst = {(r.mode, r.n): r.value for r in everything if r.check == "approximation-error-worst"}
    assert all(worst[(r.mode, r.n)] >= r.value for r in rows)  # the worst family is at least the structured mean


def test_a_bfloat16_run_times_bfloat16_tensors_and_says_so(registry):
    rows = list(run_speed(registry.variant("dot-product"), PROFILE.with_overrides(dtype="bfloat16")))
    peak = next(r for r in rows if r.check == "matmul-peak")
    assert peak.setting.startswith("bfloat16") and peak.value > 0
    size = int(peak.setting.split()[1].split("x")[0])  # measured at the size that keeps one call short
    assert peak.setting.startswith(f"bfloat16 {size}x{size} matmul") and 2 * size ** 3 / (peak.value * 1e9) <= 1.5
    assert {r.n for r in rows if r.check == "time"} == set(PROFILE.of("speed").lengths)


def test_a_floor_is_timed_beside_the_variant_in_the_forward_pass_only(registry):
    rows = list(run_speed(registry.variant("additive"), PROFILE.with_settings("speed", lengths=(64, 128))))
    floor = [r for r in rows if (r.check, r.versus) == ("time-ratio", "tanh-floor")]
    assert {(r.n, r.phase) for r in floor} == {(64, "fwd"), (128, "fwd")} and all(r.value > 0 for r in floor)
    assert {r.phase for r in rows if (r.check, r.versus) == ("time-ratio", "naive-broadcast")} == {"fwd", "fwd+bwd"}
    # causal, not its primary mode: timed against the ops it is compared with only (this profile), at n=128
    causal = {(r.versus, r.n) for r in rows if r.check == "time-ratio" and r.mode == "causal"}
    assert {versus for versus, _ in causal} == {"torch-sdpa", "torch-mha-layer"} and {n for _, n in causal} == {128}


def test_a_slow_call_is_timed_once_per_round_with_no_hidden_warm_up_calls():
    """Rounds of one slow call each cost one call: a cold call and a warm-up (one call when a call is longer than
    a round) calibrate, then one per round (a cold call ten rounds long calibrates alone)."""
    import time

    from zoo.timing import measure_cell

    calls = []

    def slow():
        calls.append(1)
        time.sleep(PROFILE.of("speed").round_seconds * 2)  # longer than a round, so one call per round

    settings = PROFILE.with_settings("speed", repeats=4, noise_retries=0).of("speed")
    samples, retries, counted = measure_cell({"slow": slow}, settings)
    assert retries == 0 and len(samples["slow"]) == 4 and counted is None
    assert len(calls) == 2 + 4
    assert all(s >= PROFILE.of("speed").round_seconds * 2 for s in samples["slow"])


def test_a_noisy_cell_is_re_measured_with_more_rounds_and_no_second_calibration():
    """A cell over the noise threshold gets as many rounds again, timed with the calls per round it was
    calibrated with: no second cold call or warm-up."""
    import time

    from zoo.timing import measure_cell

    calls = []
    round_seconds = PROFILE.of("speed").round_seconds

    def uneven():  # alternately two and eight rounds long: an IQR far over any threshold
        calls.append(1)
        time.sleep(round_seconds * (2 if len(calls) % 2 else 8))

    settings = PROFILE.with_settings("speed", repeats=4, noise_retries=1, noise_threshold=0.2,
                                     cell_seconds=None).of("speed")
    samples, retries, _ = measure_cell({"uneven": uneven}, settings)
    assert retries == 1 and len(samples["uneven"]) == 8
    assert len(calls) == 2 + 4 + 4


def test_peers_are_timed_only_after_a_first_call_that_works_and_agrees(registry):
    """A peer is timed beside the variant after an untimed first call (reported on its own); one whose library
    is missing or whose output differs is not timed, the reason is on its row, and the run goes on."""
    import dataclasses

    import torch

    from zoo.functional import merge_heads, split_heads

    def same(module):
        def run(q, k, v, attn_mask=None, is_causal=False):
            h = module.num_heads
            return merge_heads(torch.nn.functional.scaled_dot_product_attention(
                split_heads(q, h), split_heads(k, h), split_heads(v, h), is_causal=is_causal))
        return run

    def missing(module):
        raise ImportError("no module named 'fastattn'")

    def wrong(module):
        return lambda q, k, v, attn_mask=None, is_causal=False: torch.zeros_like(q)

    variant = dataclasses.replace(registry.variant("dot-product"), peers={"same": same, "missing": missing, "wrong": wrong})
    rows = list(run_speed(variant, PROFILE.with_settings("speed", lengths=(64,), modes=("full",))))
    by_check = {(r.check, r.versus, r.phase): r for r in rows}
    assert by_check[("time-ratio", "same", "fwd")].value > 0 and ("time-ratio", "same", "fwd+bwd") not in by_check
    assert by_check[("first-call", "same", "fwd")].value > 0
    assert by_check[("agreement", "same", "fwd")].value < 1e-4
    assert "ImportError: no module named 'fastattn'" in by_check[("plan", "missing", "")].detail
    assert "differs from the variant's by 1" in by_check[("plan", "wrong", "")].detail
    assert not any(r.versus in ("missing", "wrong") for r in rows if r.check in ("time-ratio", "time"))
    assert by_check[("time-ratio", "torch-sdpa", "fwd+bwd")].value > 0  # the rest of the cell was measured


def test_windowed_is_timed_beside_compiled_flex_attention_or_says_why_not(registry):
    rows = list(run_speed(registry.variant("windowed"), PROFILE.with_settings("speed", lengths=(128,))))
    by_check = {r.check: r for r in rows if r.phase in ("fwd", "") and r.versus == "flex-attention"}
    if "plan" in by_check:  # torch.compile does not work on this machine: the reason is given
        assert by_check["plan"].detail.startswith("not timed: its first call failed here")
    else:
        assert by_check["agreement"].value < 1e-4
        assert by_check["time-ratio"].value > 0 and by_check["first-call"].value > 0


def test_a_cold_call_ten_rounds_long_calibrates_alone_and_the_counted_one_counts_flops():
    import time

    import torch

    from zoo.measure import count_flops
    from zoo.timing import measure_cell

    calls = {"slow": 0, "counted": 0}
    a = torch.randn(64, 64)

    def slow():
        calls["slow"] += 1
        time.sleep(PROFILE.of("speed").round_seconds * 10)

    def counted():
        calls["counted"] += 1
        return a @ a

    settings = PROFILE.with_settings("speed", repeats=3, noise_retries=0, cell_seconds=None).of("speed")
    samples, _, (flops, ops) = measure_cell({"slow": slow, "counted": counted}, settings, "counted",
                                             lambda fn: count_flops(fn, with_ops=True))
    assert calls["slow"] == 1 + 3  # cold, then one per round
    assert flops == 2 * 64 ** 3 and ops == ["aten.mm"]
    assert len(samples["counted"]) == 3 and calls["counted"] >= 2 + 3  # counted cold call, warm-up, rounds


def test_a_cells_flops_are_counted_once_in_a_run_and_a_further_process_calls_plainly(monkeypatch, tmp_path, registry):
    """The first process counts (its cold call under the counting mode); a further process of the same run reads
    the count and still makes its cold call, outside any dispatch mode."""
    import torch
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    from zoo.environment import RUN_CACHE
    from zoo.suites.speed import _counter

    monkeypatch.setenv(RUN_CACHE, str(tmp_path))
    a = torch.randn(32, 32)
    modes = []

    def call():
        modes.append(_get_current_dispatch_mode())
        return a @ a

    variant = registry.variant("dot-product")
    first = _counter(variant, PROFILE, "full", "fwd", 64)(call)
    again = _counter(variant, PROFILE, "full", "fwd", 64)(call)
    other_cell = _counter(variant, PROFILE, "full", "fwd", 128)(call)
    assert first == again == other_cell == (2 * 32 ** 3, ["aten.mm"])
    assert len(modes) == 3 and modes[0] is not None and modes[1] is None and modes[2] is not None


def test_a_cold_call_the_caller_already_made_is_not_made_again_and_its_count_is_the_cells():
    import time

    from zoo.timing import measure_cell

    calls = {"slow": 0, "other": 0}

    def slow():
        calls["slow"] += 1
        time.sleep(PROFILE.of("speed").round_seconds * 10)

    def other():
        calls["other"] += 1
        time.sleep(PROFILE.of("speed").round_seconds * 10)

    settings = PROFILE.with_settings("speed", repeats=3, noise_retries=0, cell_seconds=None).of("speed")
    cold_call = (PROFILE.of("speed").round_seconds * 10, ("flops", ["ops"]))
    samples, _, counted = measure_cell({"slow": slow, "other": other}, settings, "slow", lambda fn: fn() or 0,
                                       cold_call)
    assert counted == ("flops", ["ops"]) and len(samples["slow"]) == 3
    assert calls == {"slow": 3, "other": 1 + 3}  # the given one: its rounds only; the other: its cold call too


def test_an_error_sweep_measures_the_approximation_at_each_option_value(registry):
    import dataclasses

    variant = dataclasses.replace(registry.variant("performer"), error_sweeps={"features": (2, 512)})
    rows = [r for r in run_approximation_error(variant, PROFILE) if r.check.startswith("approximation-error-sweep")]
    error = {r.setting.rsplit(" ", 1)[-1]: r.value for r in rows if r.check == "approximation-error-sweep"}
    worst = {r.setting.rsplit(" ", 1)[-1]: r.value for r in rows if r.check == "approximation-error-sweep-worst"}
    assert set(error) == set(worst) == {"features=2", "features=512"}
    assert all(r.n == PROFILE.of("speed").reference_length and r.mode == "full" for r in rows)
    assert error["features=512"] < error["features=2"]  # more random features approximate softmax better
    assert all(worst[k] >= error[k] for k in error)


def test_the_softmax_target_is_the_textbook_reference_at_any_block_size():
    from zoo.approximation import softmax_target, split
    from zoo.reference import reference_mask, softmax_attention

    generator = torch.Generator().manual_seed(0)
    query, key, value = (torch.randn(2, 9, 16, generator=generator) for _ in range(3))
    for is_causal in (False, True):
        textbook = softmax_attention(*(split(x, 4) for x in (query, key, value)), reference_mask(None, is_causal, 9, 9))
        for chunk_elements in (2 ** 25, 2 * 4 * 9 * 2, 1):  # one block, blocks of two rows, one row at a time
            got = softmax_target(query, key, value, 4, is_causal, chunk_elements)
            assert torch.allclose(got, textbook.transpose(1, 2).flatten(2), atol=1e-12, rtol=0)


def test_an_approximation_error_that_fails_at_one_length_loses_only_that_cell(registry, monkeypatch):
    from zoo import approximation

    measure = approximation.errors_by_input

    def out_of_memory_at_the_largest(variant, module, n, *args, **kwargs):
        if n == max(PROFILE.of("speed").lengths):
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 268435456 bytes")
        return measure(variant, module, n, *args, **kwargs)

    monkeypatch.setattr(approximation, "errors_by_input", out_of_memory_at_the_largest)
    rows = [r for r in run_approximation_error(registry.variant("linear"), PROFILE) if r.check == "approximation-error"]
    failed = [r for r in rows if r.status == "error"]
    assert {(r.mode, r.n) for r in failed} == {(mode, max(PROFILE.of("speed").lengths)) for mode in PROFILE.of("speed").modes}
    assert all("out of memory" in r.detail for r in failed)
    measured = {(r.mode, r.n) for r in rows if r.status == "measured"}
    settings = PROFILE.of("speed")
    assert measured == {(mode, n) for mode in settings.modes
                        for n in (settings.causal_lengths if mode == "causal" else settings.lengths)
                        if n != max(settings.lengths)}


def test_a_ratio_pairs_the_variant_and_its_comparator_round_by_round():
    """Rounds interleave the callables, so drift hits both alike: the per-round ratio of a variant twice as fast
    as the comparator in every round is 0.5 with no spread, however much the rounds drift."""
    from types import SimpleNamespace

    from zoo.suites.speed import _timed_rows

    drift = [1.0, 2.0, 4.0, 8.0, 16.0]
    samples = {"mine": {0: [t / 2 for t in drift]}, "torch-sdpa": {0: drift}}
    rows = list(_timed_rows(SimpleNamespace(name="mine"), PROFILE, "full", "fwd", 64, samples, 1e6, 1e12))
    [ratio] = [r for r in rows if (r.check, r.versus) == ("time-ratio", "torch-sdpa")]
    assert ratio.samples == [0.5] * 5 and ratio.value == 0.5 and "IQR 0" in ratio.detail


def test_the_plan_is_made_once_for_the_timing_and_the_approximation_error(registry, monkeypatch):
    import zoo.suites.speed as speed

    made = []
    real = speed.plan_lengths
    monkeypatch.setattr(speed, "plan_lengths", lambda *args, **kw: made.append(1) or real(*args, **kw))
    variant, profile = registry.variant("linear"), PROFILE.with_settings("speed", lengths=(64,), modes=("full",))
    list(run_speed(variant, profile))
    errors = [r for r in run_approximation_error(variant, profile) if r.check == "approximation-error"]
    assert len(made) == 1 and [r.n for r in errors] == [64]
    list(run_speed(variant, profile.with_settings("speed", lengths=(64, 96))))
    assert len(made) == 2  # another profile: another plan


def _measured(registry, name):
    """One process's speed rows for ``name`` (smoke shapes, two lengths)."""
    return list(run_speed(registry.variant(name), PROFILE.with_settings("speed", lengths=(64, 128))))


def _scaled(rows, scale):
    """The same rows as another process would give them with the variant's every round ``scale`` times as long:
    no second timing, so what the test asserts never rests on a clock."""
    import dataclasses

    return [dataclasses.replace(r, samples=[x * scale for x in r.samples]) if r.check == "time" and not r.versus
            else r for r in rows]


def test_processes_combine_into_pooled_figures_whose_interval_spans_every_process(registry):
    """Two processes, the second timing the variant 30% slower: the combined time pools both processes' rounds,
    its interval reaches both processes' medians, the cell's spread between processes says 0.3-ish, and the
    derived rates follow the pooled median; rows that are not timings come from the first process."""
    import statistics

    from zoo.suites.speed import combine

    variant = registry.variant("dot-product")
    first = _measured(registry, "dot-product")
    second = _scaled(first, 1.3)
    rows = list(combine(variant, PROFILE, [first, second]))
    own = lambda rows_, check: next(r for r in rows_ if (r.check, r.phase, r.n, r.versus) == (check, "fwd", 64, ""))
    time, one, two = own(rows, "time"), own(first, "time"), own(second, "time")
    assert time.samples == one.samples + two.samples and time.value == statistics.median(time.samples)
    assert time.low <= statistics.median(one.samples) and time.high >= statistics.median(two.samples)
    between = own(rows, "time-between").value
    assert between >= (statistics.median(two.samples) - statistics.median(one.samples)) / time.value > 0.2
    assert own(rows, "tokens-per-s").value == PROFILE.of("speed").batch * 64 / time.value
    ratio = next(r for r in rows if (r.check, r.phase, r.n, r.versus) == ("time-ratio", "fwd", 64, "torch-sdpa"))
    assert len(ratio.samples) == len(time.samples) and ratio.low <= ratio.value <= ratio.high
    assert [r for r in rows if r.check == "sdpa-backend"] == [r for r in first if r.check == "sdpa-backend"]
    [peak] = [r for r in rows if r.check == "matmul-peak"]
    assert peak.samples == [r.value for r in first + second if r.check == "matmul-peak"]
    assert {r.check for r in rows} >= {"backward-cost", "time-exponent", "time-spread", "timed-flops"}


def test_a_process_that_failed_a_cell_costs_that_process_only_and_its_error_is_kept(registry):
    from zoo.checks import ERROR, Result
    from zoo.suites.speed import combine

    variant = registry.variant("dot-product")
    first = _measured(registry, "dot-product")
    second = [Result("speed", ERROR, detail="RuntimeError: out of memory")]
    rows = list(combine(variant, PROFILE, [first, second]))
    key = lambda r: (r.check, r.phase, r.n, r.versus) == ("time", "fwd", 64, "")
    assert next(filter(key, rows)).samples == next(filter(key, first)).samples
    assert not [r for r in rows if r.check == "time-between"]  # one process: no spread between processes to state
    assert [r.detail for r in rows if r.status == ERROR] == ["RuntimeError: out of memory"]


def test_a_peer_one_process_left_out_pairs_only_with_the_processes_that_timed_it(registry):
    """The ratio to a callable is taken per round within each process that timed both; the variant's own time
    keeps every process."""
    import statistics

    from zoo.suites.speed import combine

    variant = registry.variant("dot-product")
    first = _measured(registry, "dot-product")
    second, third = _scaled(first, 1.5), _scaled(first, 2.0)
    second = [r for r in second if r.versus != "torch-sdpa"]  # the comparator was not timed in process 2
    rows = list(combine(variant, PROFILE, [first, second, third]))
    pick = lambda rows_, check, versus="": next(r for r in rows_ if (r.check, r.phase, r.n, r.versus) == (check, "fwd", 64, versus))
    assert pick(rows, "time").samples == sum((pick(p, "time").samples for p in (first, second, third)), [])
    ratio = pick(rows, "time-ratio", "torch-sdpa")
    expected = [a / b for p in (first, third) for a, b in zip(pick(p, "time").samples, pick(p, "time", "torch-sdpa").samples)]
    assert ratio.samples == expected and ratio.value == statistics.median(expected)
