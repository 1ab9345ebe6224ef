"""Speed suite: the variant against torch SDPA (and its baselines) on the same shapes, in one process.

``torch.utils.benchmark.Timer`` with the thread count fixed; rounds interleave the callables so
drift hits all of them alike; medians and interquartile ranges over rounds; ratios per round.
"""

from __future__ import annotations

import functools
import os
import statistics

import torch
from torch.utils.benchmark import Timer

import zoo
from zoo.checks import MEASURED, SKIPPED, Check, Result
from zoo.measure import count_flops
from zoo.scaling import Ladder, fit_exponent, timed
from zoo.workload import SDPA, modes_for, self_attention_workloads

SUITE = "speed"
PHASES = ("fwd", "fwd+bwd")
ALLOCATOR_VARIABLES = ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_")


def allocator_setting() -> str:
    pinned = [f"{name}={os.environ[name]}" for name in ALLOCATOR_VARIABLES if name in os.environ]
    return " ".join(pinned) or "glibc default (not pinned)"


def _quartiles(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return values[0], 0.0
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return statistics.median(values), q3 - q1


@functools.lru_cache(maxsize=None)
def matmul_peak(threads: int, device: str = "cpu", dtype: str = "float32", size: int = 2048) -> float:
    """This device's matmul rate in ``dtype`` in FLOP/s, measured now: the ceiling for '% of peak'."""
    a, b = (torch.randn(size, size, device=device, dtype=getattr(torch, dtype)) for _ in range(2))
    seconds = Timer("a @ b", globals={"a": a, "b": b}, num_threads=threads).blocked_autorange(min_run_time=0.3).median
    return 2 * size ** 3 / seconds


def _time_round_robin(fns: dict[str, callable], profile) -> dict[str, list[float]]:
    """Per-call seconds of each callable, over ``profile.repeats`` interleaved rounds.

    Each Timer runs a call count calibrated once from the warm-up, so a round costs every callable
    about ``round_seconds``; blocked_autorange would re-calibrate (and repeat slow calls) every round.
    """
    timers, numbers = {}, {}
    for label, fn in fns.items():
        timers[label] = Timer("fn()", globals={"fn": fn}, num_threads=profile.threads)
        once = timed(fn)  # also the warm-up
        numbers[label] = max(1, int(profile.round_seconds / max(once, 1e-9)))
    samples: dict[str, list[float]] = {label: [] for label in fns}
    for _ in range(profile.repeats):
        for label, timer in timers.items():
            samples[label].append(timer.timeit(numbers[label]).median)
    return samples


def run_speed(variant, profile):
    torch.set_num_threads(profile.threads)
    peak = matmul_peak(profile.threads, profile.device, profile.dtype)
    where = f"{profile.threads} threads" if profile.device == "cpu" else profile.device
    yield Result("matmul-peak", MEASURED, f"{profile.dtype} 2048x2048 matmul, {where}", peak / 1e9, "GFLOP/s")
    yield Result("allocator", MEASURED, detail=allocator_setting())
    for mode in modes_for(variant, profile.speed_modes):
        medians: dict[str, dict[str, dict[int, float]]] = {phase: {} for phase in PHASES}
        ladder = Ladder(profile.call_budget_seconds)
        for n in ladder.climb(variant.name, profile.speed_lengths):
            loads = self_attention_workloads(
                variant, batch=profile.speed_batch, d_model=profile.speed_d_model, heads=profile.speed_heads,
                n=n, causal=mode == "causal", seed=profile.seed, device=profile.device, dtype=profile.dtype,
            )
            loads = {who: load for who, load in loads.items() if ladder.allows(who, n)}
            for phase in PHASES:
                fns = {who: (load.forward if phase == "fwd" else load.train_step) for who, load in loads.items()}
                samples = _time_round_robin(fns, profile)
                yield from _rows(variant, profile, mode, phase, n, samples, fns[variant.name], peak)
                for who, times in samples.items():
                    medians[phase].setdefault(who, {})[n] = statistics.median(times)
            for who in loads:
                ladder.record(who, n, medians["fwd+bwd"][who][n])
        if ladder.skipped:
            yield Result("ladder", SKIPPED, mode, detail=ladder.skipped_note("timed"), mode=mode)
        for phase in PHASES:
            yield from _summary_rows(variant, mode, phase, medians[phase])


def _rows(variant, profile, mode, phase, n, samples, fn, peak):
    setting = f"{mode} {phase} n={n}"
    tag = dict(n=n, mode=mode, phase=phase)
    median, iqr = _quartiles(samples[variant.name])
    yield Result("time", MEASURED, setting, median, "s", f"IQR {iqr:.3g} s over {len(samples[variant.name])} rounds", **tag)
    yield Result("time-iqr", MEASURED, setting, iqr, "s", **tag)
    for who, times in samples.items():
        if who == variant.name:
            continue
        other, other_iqr = _quartiles(times)
        yield Result(f"{who}-time", MEASURED, setting, other, "s", f"IQR {other_iqr:.3g} s", **tag)
        ratios = [a / b for a, b in zip(samples[variant.name], times)]
        ratio, ratio_iqr = _quartiles(ratios)
        yield Result(f"x-{who}", MEASURED, setting, ratio, "ratio",
                     f"variant time / {who} time per round; IQR {ratio_iqr:.3g}", **tag)
    yield Result("tokens-per-s", MEASURED, setting, profile.speed_batch * n / median, "tokens/s", **tag)
    flops, kernels = count_flops(fn, with_ops=True)
    yield Result("gflops", MEASURED, setting, flops / median / 1e9, "GFLOP/s", f"{flops:.4g} FLOPs counted", **tag)
    fused = sorted(op for op in kernels if "scaled_dot_product" in op)
    yield Result("sdpa-backend", MEASURED, setting, detail=", ".join(fused) or "no fused attention kernel", **tag)
    yield Result("peak-fraction", MEASURED, setting, flops / median / peak, "fraction",
                 "achieved FLOP/s / measured matmul peak", **tag)


def _summary_rows(variant, mode, phase, medians):
    ours = medians.get(variant.name, {})
    lengths = sorted(ours)
    fitted = fit_exponent(lengths, [ours[n] for n in lengths])
    if fitted is not None:
        yield Result("time-exponent", MEASURED, f"{mode} {phase}", fitted, "exponent",
                     f"claimed {variant.complexity.time:g}; timing is noisy, verdicts use FLOPs and memory",
                     mode=mode, phase=phase)
    sdpa = medians.get(SDPA, {})
    faster = [n for n in lengths if ours[n] < sdpa.get(n, 0)]
    if faster and all(ours[n] < sdpa[n] for n in lengths if n >= faster[0]):
        yield Result("crossover-time", MEASURED, f"{mode} {phase}", faster[0], "n",
                     "smallest timed n from which the variant is faster than SDPA", mode=mode, phase=phase)
    else:
        yield Result("crossover-time", SKIPPED, f"{mode} {phase}", detail="not faster than SDPA at any timed n from there on",
                     mode=mode, phase=phase)


def run_approximation_error(variant, profile):
    """Relative error against exact softmax attention (SDPA on the same head split), across lengths."""
    if variant.tags.has_parameters:
        yield Result("approximation-error", SKIPPED,
                     detail="variant has parameters: no parameter-free exact counterpart to compare with")
        return
    heads = profile.speed_heads
    for mode in modes_for(variant, profile.speed_modes):
        for n in profile.speed_lengths:
            torch.manual_seed(profile.seed)
            module = zoo.build(variant, d_model=profile.speed_d_model, num_heads=heads)
            x = torch.randn(1, n, profile.speed_d_model)
            split = x.unflatten(-1, (heads, -1)).transpose(1, 2)
            with torch.no_grad():
                out = module(x, x, x, is_causal=mode == "causal")
                exact = torch.nn.functional.scaled_dot_product_attention(split, split, split, is_causal=mode == "causal")
                exact = exact.transpose(1, 2).flatten(2)
            error = float((out - exact).norm() / exact.norm())
            yield Result("approximation-error", MEASURED, f"{mode} fwd n={n}", error, "rel. error",
                         "||out - softmax attention|| / ||softmax attention||, Gaussian inputs", n=n, mode=mode, phase="fwd")


def approximations_only(tags):
    return None if not tags.exact else "exact variant: no approximation error"


@zoo.hookimpl
def zoo_register_checks(register):
    register(Check("speed", SUITE, "median time, IQR, x SDPA and baselines, GFLOP/s and % of matmul peak over n",
                   run_speed))
    register(Check("approximation-error", SUITE, "relative error against exact softmax attention over n",
                   run_approximation_error, approximations_only))
