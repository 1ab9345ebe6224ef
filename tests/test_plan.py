"""The measurement plan is decided from counted costs, never from a clock: the same plan on every run,
the comparators measured wherever the variant is, and a reason for every length left out."""

import pytest
import torch

import zoo
from conftest import BUILTINS, minimal_variant
from zoo.plan import plan_lengths, plan_rows
from zoo.workload import SDPA, Workload

MiB = 2 ** 20


def _allocating(bytes_at: callable) -> callable:
    """A callable whose one call keeps ``bytes_at(n)`` bytes alive (and counts no FLOPs)."""

    def loads_at(n, only=None):
        def step(n=n):
            torch.empty(int(bytes_at(n)), dtype=torch.uint8)

        return Workload(forward=step, train_step=step)

    return loads_at


def _loads(costs: dict[str, callable]):
    def loads_at(n, only=None):
        return {who: _allocating(cost)(n) for who, cost in costs.items() if only is None or who in only}

    return loads_at


def _variant(time=1, memory=1):
    return minimal_variant(name="v", complexity=zoo.Complexity(time=time, memory=memory))


def test_a_baseline_over_the_memory_cap_is_left_out_with_its_predicted_size():
    loads = _loads({"v": lambda n: n * 1024, SDPA: lambda n: n * 1024, "quadratic": lambda n: n * n * 64})
    plan = plan_lengths(loads, [256, 512, 1024, 2048], _variant(), {SDPA}, max_gflop=1e9, max_gib=128 * MiB / 2 ** 30)
    assert plan.lengths["v"] == plan.lengths[SDPA] == [256, 512, 1024, 2048]
    assert plan.lengths["quadratic"] == [256, 512, 1024]  # 2048^2 * 64 B = 256 MiB > 128 MiB
    assert "predicted 0.25 GiB per call" in plan.left_out["quadratic"][2048]


def test_the_comparator_is_measured_wherever_the_variant_is_whatever_it_costs():
    loads = _loads({"v": lambda n: n, SDPA: lambda n: n * n * 1024})
    plan = plan_lengths(loads, [64, 128, 256, 512], _variant(), {SDPA}, max_gflop=1e9, max_gib=1 * MiB / 2 ** 30)
    assert plan.lengths[SDPA] == plan.lengths["v"] == [64, 128, 256, 512]


def test_where_the_variant_is_over_a_cap_nothing_is_measured_and_every_callable_says_why():
    loads = _loads({"v": lambda n: n * n, SDPA: lambda n: n})
    plan = plan_lengths(loads, [256, 512, 1024], _variant(memory=2), {SDPA}, max_gflop=1e9, max_gib=0.5 * MiB / 2 ** 30)
    assert plan.lengths["v"] == plan.lengths[SDPA] == [256, 512]
    rows = list(plan_rows(plan, "v", "full", "timed"))
    assert {(r.check, r.versus, r.n) for r in rows} == {("plan", "", 1024), ("plan", SDPA, 1024)}
    assert all(r.status == "skipped" and r.detail.startswith("not timed: ") for r in rows)


def test_the_variants_claimed_exponent_is_the_least_slope_of_its_prediction():
    # counted cost grows like n at small n, but the variant claims n^2 memory: the prediction follows the claim
    loads = _loads({"v": lambda n: n * 1024, SDPA: lambda n: n})
    cap = 1.5 * 1024 * 1024 / 2 ** 30  # 1.5 MiB: n=1024 costs 1 MiB counted-linear, 4 MiB claimed-quadratic
    linear = plan_lengths(loads, [256, 512, 1024], _variant(memory=1), {SDPA}, max_gflop=1e9, max_gib=cap)
    quadratic = plan_lengths(loads, [256, 512, 1024], _variant(memory=2), {SDPA}, max_gflop=1e9, max_gib=cap)
    assert linear.lengths["v"] == [256, 512, 1024] and quadratic.lengths["v"] == [256, 512]


def test_the_plan_of_a_real_variant_is_the_same_every_time(registry):
    from zoo.workload import self_attention_workloads

    variant = registry.variant("additive")

    def loads_at(n, only=None):
        return self_attention_workloads(variant, batch=1, d_model=64, heads=2, n=n, causal=False, seed=0, only=only)

    plans = [plan_lengths(loads_at, [64, 128, 256, 512], variant, {SDPA}, max_gflop=0.05, max_gib=0.01) for _ in range(2)]
    assert plans[0] == plans[1]
    assert any(plans[0].left_out.values())  # the caps bite somewhere, so the comparison means something


def test_a_baseline_that_runs_out_of_memory_while_counted_is_left_out_from_there_and_the_rest_is_planned():
    """What a quadratic baseline did at n = 8192 under a worker's memory cap: its counting call failed, and the
    whole speed job with it. Now it alone is left out, from that length on, saying why; any other error still
    surfaces."""
    import pytest

    def too_big(n):
        if n >= 512:
            raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory")
        return 8 * MiB  # 128 MiB at n = 1024 if it grew with the square of the length: over the cap, so counted again

    loads = _loads({"v": lambda n: n * 1024, SDPA: lambda n: n * 1024, "quadratic": too_big})
    plan = plan_lengths(loads, [256, 512, 1024], _variant(), {SDPA}, max_gflop=1e9, max_gib=100 * MiB / 2 ** 30)
    assert plan.lengths["v"] == plan.lengths[SDPA] == [256, 512, 1024]
    assert plan.lengths["quadratic"] == [256]
    assert set(plan.left_out["quadratic"]) == {512, 1024}
    assert all("one call at n=512 ran out of memory" in why for why in plan.left_out["quadratic"].values())

    def broken(n):
        raise RuntimeError("shape mismatch")

    with pytest.raises(RuntimeError, match="shape mismatch"):
        plan_lengths(_loads({"v": lambda n: n, SDPA: lambda n: n, "wrong": broken}), [256, 512], _variant(), {SDPA},
                     max_gflop=1e9, max_gib=1.0)


def test_a_loop_over_tokens_is_left_out_where_its_dispatched_ops_pass_the_cap_and_is_not_counted_there():
    """A token-by-token recurrence does few FLOPs and holds little memory, yet every op it dispatches costs the
    framework's overhead: the plan counts ops too. Where the smallest length already predicts the second over the
    cap, the callable is not counted there (at the long board's lengths that count was the plan's longest call)."""
    counted_at = []

    def looping(n):
        state = torch.zeros(1)

        def step():
            counted_at.append(n)
            x = state
            for _ in range(n // 8):  # one op per 8 tokens
                x = x + 1

        return Workload(forward=step, train_step=step)

    def loads_at(n, only=None):
        return {**_loads({"v": lambda n: n, SDPA: lambda n: n})(n, only), "recurrent": looping(n)}

    lengths = [256, 512, 1024, 2048]
    plan = plan_lengths(loads_at, lengths, _variant(), {SDPA}, max_gflop=1e9, max_gib=1.0, max_ops=100)
    assert plan.lengths["v"] == plan.lengths[SDPA] == lengths
    assert plan.lengths["recurrent"] == [256, 512] and counted_at == [256, 512]  # 32 and 64 ops; 128 predicted
    assert plan.left_out["recurrent"][1024] == ("predicted 128 ops dispatched per call (a loop in Python), over the "
                                                "profile's cap of 100")
    counted_at.clear()
    plan = plan_lengths(loads_at, lengths, _variant(), {SDPA}, max_gflop=1e9, max_gib=1.0, max_ops=50)
    assert plan.lengths["recurrent"] == [256] and counted_at == [256]  # 64 predicted at 512: not counted there
    assert set(plan.left_out["recurrent"]) == {512, 1024, 2048}
    counted_at.clear()
    plan = plan_lengths(loads_at, lengths, _variant(), {SDPA}, max_gflop=1e9, max_gib=1.0, max_ops=20)
    assert plan.lengths["recurrent"] == [] and counted_at == [256]  # stopped at its 21st op of 32
    assert plan.left_out["recurrent"] == {n: "over 20 ops dispatched in one call at n=256 (a loop in Python): the "
                                             "profile's cap" for n in lengths}
    assert plan_lengths(loads_at, lengths, _variant(), {SDPA}, max_gflop=1e9, max_gib=1.0).lengths["recurrent"] == \
        lengths  # no cap on ops: as before


def test_a_run_stored_before_the_ops_cap_shares_a_board_with_a_run_of_the_same_settings_today():
    from zoo.board import _comparable_settings
    from zoo.profiles import get_profile
    from zoo.suites.speed import MAX_CALL_OPS

    for name in ("full", "smoke"):
        today = get_profile(name).as_dict()
        assert today["suites"]["speed"]["max_call_ops"] == MAX_CALL_OPS
        before = {**today, "suites": {**today["suites"], "speed": {
            k: v for k, v in today["suites"]["speed"].items() if k != "max_call_ops"}}}
        assert _comparable_settings(before) == _comparable_settings(today)
        changed = {**today, "suites": {**today["suites"], "speed": {**today["suites"]["speed"], "max_call_ops": 1.0}}}
        assert _comparable_settings(changed) != _comparable_settings(today)


def test_a_callable_whose_smallest_count_fits_every_length_as_attention_grows_is_counted_once():
    """At the quick profile's two lengths most callables are far inside the caps: counted at the smallest length and
    grown with the square of the length (its ops in proportion), they fit at the second, so the plan is made
    without their second counts and is the same; one that might not fit is counted there."""
    counted = []

    def loads_at(n, only=None):
        def tracked(who, size):
            def step():
                counted.append((who, n))
                torch.empty(size, dtype=torch.uint8)

            return Workload(forward=step, train_step=step)

        loads = {"v": tracked("v", n * 64), SDPA: tracked(SDPA, n * 64), "big": tracked("big", n * 4096)}
        return {who: load for who, load in loads.items() if only is None or who in only}

    plan = plan_lengths(loads_at, [256, 512], _variant(), {SDPA}, max_gflop=1e9, max_gib=3 * MiB / 2 ** 30)
    assert sorted(counted) == [("big", 256), ("big", 512), (SDPA, 256), ("v", 256)]  # big: 1 MiB, 4 MiB at most
    assert plan.lengths == {"v": [256, 512], SDPA: [256, 512], "big": [256, 512]}  # counted: 2 MiB at 512
    plan = plan_lengths(loads_at, [256, 512], _variant(), {SDPA}, max_gflop=1e9, max_gib=1.5 * MiB / 2 ** 30)
    assert plan.lengths["big"] == [256]  # stopped as its live tensors passed the cap, not run to its end
    assert plan.left_out["big"][512] == "over 0.00146 GiB of tensors live at once in one call at n=512: the profile's cap"


@pytest.mark.parametrize("name", BUILTINS)
def test_each_built_ins_plan_counting_once_where_the_bound_fits_is_the_plan_counting_twice(registry, name, monkeypatch):
    """Where the first count bounds a callable within the caps at every length, the plan skips its second count:
    that must never change the plan. Each built-in's, with its baselines and floors, at caps under which most
    callables are counted once and some are left out (the recurrences over the ops cap, additive attention's naive
    broadcast over the memory cap at the longest length, MLA over the FLOP cap there)."""
    import zoo.plan
    from zoo.workload import self_attention_workloads

    variant = registry.variant(name)

    def loads_at(n, only=None):
        return self_attention_workloads(variant, batch=1, d_model=32, heads=2, n=n, causal=False, seed=0,
                                        floors=True, only=only)

    def plan():
        return plan_lengths(loads_at, [32, 64, 256], variant, {SDPA}, max_gflop=0.2, max_gib=4 * MiB / 2 ** 30,
                            max_ops=3000)

    once = plan()
    monkeypatch.setattr(zoo.plan, "GROWTH_BOUND", 60.0)  # nothing fits: every callable counted at both lengths
    assert plan() == once
