"""Speed suite: the variant against torch SDPA (and its baselines) on the same shapes, in the same process.

Rounds interleave the callables so drift hits all of them alike; ratios per round; the thread count fixed for
the whole suite; the check is repeated in the run's fresh processes and its figures combined (:func:`combine`,
:mod:`zoo.timing`): medians over every process's rounds, intervals over their medians.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import os
import re
import statistics

import torch
from torch.utils.benchmark import Timer

import zoo
from zoo import approximation
from zoo import plots as plots_
from zoo.board import (RERUNS, Footnotes, approximates, behind_mark, best_known, best_known_rows, fmt_g, fmt_ms,
                       fmt_x)
from zoo.cases import relative_error
from zoo.environment import counted_once, run_shared
from zoo.contract import BEST_KNOWN_SLACK, COMPARATOR_LABELS, COMPARATORS
from zoo.checks import (ERROR, MEASURED, SKIPPED, TIMING_FORM_CHANGES, Check, Result, describe_exception,
                        form_changes)
from zoo.measure import count_flops
from zoo.plan import plan_lengths, plan_rows, shared
from zoo.scaling import fit_exponent, timed
from zoo.suite import legacy_names
from zoo.timing import figure, measure_cell, relative_spread, strays
from zoo.workload import SDPA, comparator, modes_for, non_finite_output, self_attention_workloads

SUITE = "speed"
MAX_CALL_OPS = 384_000.0
"""Ops dispatched per forward+backward call above which the plan leaves a callable out (in the full and smoke
profiles; quick: :data:`QUICK_MAX_CALL_OPS`). Counted FLOPs do not see a loop in Python over tokens: Based's
token-by-token recurrence (a baseline) took 44 s per forward+backward at n = 4096, 178 s at 8192 and 640 s at 16384
on the long board, most of its speed job's time. At n = 512 (d_model 512, 8 heads) the four token-by-token
recurrences (Based, Gated DeltaNet, GLA, Mamba-2) dispatched 25,219 to 45,784 ops in one forward+backward, every
other callable at most 6,826: the cap keeps each recurrence at n = 4096, where its target compares it, and leaves it
out from 8192 on."""
QUICK_MAX_CALL_OPS = 10_000.0
"""The quick profile's cap: it times no loop in Python over tokens. At n = 256 the recurrences dispatched 12,675
(GLA), 16,747 (Mamba-2), 17,586 (Based) and 23,000 (Gated DeltaNet) ops per forward+backward, at 512 from 25,219
up; the most of any other callable was 6,554 at 256 and 6,826 at 512 (Gated DeltaNet's chunked substitution). Their
targets are judged on the long board; the plan stops counting each at its 10,001st op."""
PHASES = ("fwd", "fwd+bwd")
ALLOCATOR_VARIABLES = ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_")


def allocator_setting() -> str:
    """The allocator settings the worker runs with (pinned or not)."""
    pinned = [f"{name}={os.environ[name]}" for name in ALLOCATOR_VARIABLES if name in os.environ]
    return " ".join(pinned) or "glibc default (not pinned)"


PEAK_SIZES = (256, 512, 1024, 2048)
"""Square matmul sizes the peak is measured at: the largest whose one call is estimated within PEAK_CALL_SECONDS."""
PEAK_CALL_SECONDS = 1.0


@functools.lru_cache(maxsize=None)
def matmul_peak(threads: int, device: str = "cpu", dtype: str = "float32") -> tuple[float, int]:
    """This device's matmul rate in ``dtype`` in FLOP/s (the ceiling for '% of peak'), and the size it was measured
    at: 2048 where the dtype has fast kernels, smaller where it does not (bfloat16 on a CPU without bfloat16
    instructions ran about 500x slower than float32 here, and one 2048 call would take seconds). Measured once in
    a run (:func:`zoo.environment.run_shared`), not again in each of its speed processes (66 in a quick run-all of
    22 variants; a multi-head speed process went from 6.5-6.7 s to 5.3 s)."""
    return run_shared(f"matmul-peak|{threads}|{device}|{dtype}", lambda: _measure_matmul_peak(threads, device, dtype),
                      tuple)


def _measure_matmul_peak(threads: int, device: str, dtype: str) -> tuple[float, int]:
    def rate(size):
        a, b = (torch.randn(size, size, device=device, dtype=getattr(torch, dtype)) for _ in range(2))
        timer = Timer("a @ b", globals={"a": a, "b": b}, num_threads=threads)
        return 2 * size ** 3 / timer.blocked_autorange(min_run_time=0.3).median

    estimate = rate(PEAK_SIZES[0])
    size = max(s for s in PEAK_SIZES if s == PEAK_SIZES[0] or 2 * s ** 3 / estimate <= PEAK_CALL_SECONDS)
    return (estimate if size == PEAK_SIZES[0] else rate(size)), size


def _counter(variant, profile, mode: str, phase: str, n: int):
    """What a cell's cold call of the variant also measures: the FLOPs of one call and the ops that ran, counted
    once in a run (:func:`zoo.environment.run_shared`). They are deterministic, so a further process of a timing
    makes its cold call plainly instead of counting again (a counted call runs every op through Python: 2-3x a
    plain one, 10 s of additive's speed check per process)."""
    key = f"timed-flops|{variant.name}|{mode}|{phase}|{n}|{profile!r}"

    def count(fn):
        flops, ops = counted_once(key, lambda: count_flops(fn, with_ops=True), fn)
        return flops, ops

    return count


def _loads_at(variant, profile, mode, n, only=None, peers=False):
    """The callables timed at (mode, n): in a mode other than the variant's primary one, only the variant and the
    ops it is compared with, unless ``baselines_in_every_mode`` (the full profile) times its baselines, floors and
    peers there too."""
    everything = profile.of(SUITE).baselines_in_every_mode or mode == variant.tags.primary_mode
    if not everything:
        compared = {variant.name, SDPA, comparator(variant)}
        only = compared if only is None else set(only) & compared
    return self_attention_workloads(
        variant, batch=profile.of(SUITE).batch, d_model=profile.of(SUITE).d_model, heads=profile.of(SUITE).heads,
        n=n, causal=mode == "causal", seed=profile.seed, device=profile.device, dtype=profile.dtype,
        floors=everything, peers=peers and everything, only=only,
    )


def peer_tolerance(dtype: str) -> float:
    """How far a peer's output may be from the variant's (relative): summation order differs between them."""
    return max(1e-4, 4 * torch.finfo(getattr(torch, dtype)).eps)


def admit_peers(variant, loads, mode, n, dtype):
    """Each peer's first call, outside the timed rounds (compilation happens there) and reported on its own.
    A peer whose first call fails, or whose output is not the variant's, is taken out of ``loads`` and not
    timed, with the reason (a ``plan`` row about the peer, as the plan's own reasons are)."""
    peers = [who for who in variant.peers if who in loads]
    if not peers:
        return
    ours = loads[variant.name].forward()
    tolerance = peer_tolerance(dtype)
    for who in peers:
        setting, tag = f"{mode} fwd n={n}", dict(n=n, mode=mode, phase="fwd")
        output = []
        try:
            seconds = timed(lambda: output.append(loads[who].forward()))
        except Exception as error:  # e.g. no C++ compiler for torch.compile: the board says so, the run goes on
            del loads[who]
            reason = str(error).strip().splitlines()[0] if str(error).strip() else ""
            yield Result("plan", SKIPPED, f"{mode} n={n}", n=n, mode=mode, versus=who,
                         detail=f"not timed: its first call failed here ({type(error).__name__}: {reason[:300]})")
            continue
        error = relative_error(output[0], ours)
        if not error <= tolerance:
            del loads[who]
            yield Result("plan", SKIPPED, f"{mode} n={n}", n=n, mode=mode, versus=who,
                         detail=f"not timed: its output differs from the variant's by {error:.3g} (relative), "
                                f"over {tolerance:g}")
            continue
        yield Result("first-call", MEASURED, setting, seconds, "s",
                     "its first call at this length, outside the timed rounds (compilation happens here)", versus=who,
                     **tag)
        yield Result("agreement", MEASURED, setting, error, "relative error",
                     "its output vs the variant's on the timed inputs", versus=who, **tag)


_PLANS: dict[tuple, tuple] = {}


def lengths_in(profile, mode: str, variant) -> tuple[int, ...]:
    """The lengths the suite times ``variant`` at in ``mode``: every length in its primary mode; causal as a second
    mode may be fewer (``causal_lengths``: the quick profile times it at the reference length only)."""
    settings = profile.of(SUITE)
    if mode != "causal" or mode == variant.tags.primary_mode:
        return settings.lengths
    return _causal_lengths(settings.lengths, settings.causal_lengths, settings.reference_length)


def _causal_lengths(lengths, causal, reference) -> tuple[int, ...]:
    """Those of ``causal`` among ``lengths`` (None: all of them; none left: the reference length, or the longest)."""
    if causal is None:
        return tuple(lengths)
    return tuple(n for n in lengths if n in set(causal)) or (reference if reference in lengths else max(lengths),)


def speed_plan(variant, profile, mode):
    """Which lengths the speed suite times, for the variant and what it is compared with (zoo.plan); made once
    per variant, profile and mode in a worker (the timing and the approximation error both follow it), and once
    in a run whose processes share a folder for it (:func:`zoo.plan.shared`)."""
    key = (variant.name, repr(profile), mode)
    made_for, plan = _PLANS.get(key, (None, None))
    if made_for is not variant:
        plan = shared(f"speed|{variant.name}|{mode}|{profile!r}", lambda: plan_lengths(
            functools.partial(_loads_at, variant, profile, mode), lengths_in(profile, mode, variant), variant,
            {SDPA, comparator(variant)}, profile.of(SUITE).max_call_gflop, profile.of(SUITE).max_call_gib,
            getattr(profile.of(SUITE), "max_call_ops", MAX_CALL_OPS)))
        _PLANS[key] = (variant, plan)
    return plan


def run_speed(variant, profile):
    """The speed check: every planned length and mode, fwd and fwd+bwd, with ratios and rates."""
    torch.set_num_threads(profile.threads)
    peak, size = matmul_peak(profile.threads, profile.device, profile.dtype)
    where = f"{profile.threads} threads" if profile.device == "cpu" else profile.device
    yield Result("matmul-peak", MEASURED, f"{profile.dtype} {size}x{size} matmul, {where}", peak / 1e9, "GFLOP/s")
    yield Result("allocator", MEASURED, detail=allocator_setting())
    for mode in modes_for(variant, profile.of(SUITE).modes):
        loads_at = functools.partial(_loads_at, variant, profile, mode)
        plan = speed_plan(variant, profile, mode)
        yield from plan_rows(plan, variant.name, mode, "timed")
        timed_here: list[Result] = []
        stopped_by = None
        for n in plan.lengths[variant.name]:
            if stopped_by:
                yield Result("time", SKIPPED, f"{mode} n={n}", detail=stopped_by, n=n, mode=mode)
                continue
            loads = loads_at(n, only=plan.at(n), peers=getattr(profile.of(SUITE), "peers", True))
            error = non_finite_output(loads, variant.name, mode, n, profile.dtype)
            if error:
                yield error
                continue
            limit, cold_call = profile.of(SUITE).call_limit_seconds, None
            if limit is not None:  # the variant's first forward+backward, its cold call in the fwd+bwd cell too
                counted = []
                count = _counter(variant, profile, mode, "fwd+bwd", n)
                seconds = timed(lambda: counted.append(count(loads[variant.name].train_step)))
                if seconds > limit:
                    stopped_by = (f"safety net: one cold forward+backward call took {seconds:.3g} s "
                                  f"at n={n}, over the profile's {limit:g} s limit; not timed from this length on")
                    yield Result("time", SKIPPED, f"{mode} n={n}", detail=stopped_by, n=n, mode=mode)
                    continue
                cold_call = seconds, counted[0]
            yield from admit_peers(variant, loads, mode, n, profile.dtype)
            for phase in PHASES:
                fns = {who: (load.forward if phase == "fwd" else load.train_step) for who, load in loads.items()
                       if phase == "fwd" or load.train_step is not None}
                samples, retries, (flops, kernels) = measure_cell(fns, profile.of(SUITE), variant.name,
                                                                  _counter(variant, profile, mode, phase, n),
                                                                  cold_call if phase == "fwd+bwd" else None)
                setting, tag = f"{mode} {phase} n={n}", dict(n=n, mode=mode, phase=phase)
                spread = max(map(relative_spread, samples.values()))
                yield Result("time-spread", MEASURED, setting, spread, "IQR/median",
                             f"largest IQR/median of the cell's callables; re-measured {retries} time(s)", **tag)
                yield Result("timed-flops", MEASURED, setting, flops, "FLOPs",
                             "counted in one call (torch's FlopCounterMode formulas)", **tag)
                fused = sorted(op for op in kernels if "scaled_dot_product" in op)
                yield Result("sdpa-backend", MEASURED, setting, detail=", ".join(fused) or "no fused attention kernel",
                             **tag)
                for row in _timed_rows(variant, profile, mode, phase, n, {who: {0: t} for who, t in samples.items()},
                                       flops, peak):
                    timed_here.append(row)
                    yield row
        yield from _summary_rows(variant, mode, timed_here)


DERIVED = {"time", "time-iqr", "time-ratio", "time-between", "tokens-per-s", "gflops", "peak-fraction",
           "backward-cost", "time-exponent"}
"""The rows the suite derives from the rounds of a cell: :func:`combine` derives them again from every process's."""


def _timed_rows(variant, profile, mode, phase, n, per_process: dict[str, dict[int, list[float]]], flops, peak):
    """A cell's figures from its callables' rounds (callable -> process -> its rounds there): times, ratios per
    round within each process that timed both, the spread between processes, and the rates."""
    setting, tag = f"{mode} {phase} n={n}", dict(n=n, mode=mode, phase=phase)
    mine = per_process[variant.name]
    ours = figure([mine[p] for p in sorted(mine)])
    yield Result("time", MEASURED, setting, ours.value, "s", f"IQR {ours.iqr:.3g} s over {len(ours.samples)} rounds "
                 f"in {ours.processes} process(es)", samples=ours.samples, low=ours.low, high=ours.high, **tag)
    yield Result("time-iqr", MEASURED, setting, ours.iqr, "s", **tag)
    yield from _between(ours, setting, tag, "its time")
    for who, times in per_process.items():
        both = sorted(set(times) & set(mine))  # a callable one process left out (a peer) pairs with the others only
        if who == variant.name or not both:
            continue
        other = figure([times[p] for p in both])
        yield Result("time", MEASURED, setting, other.value, "s", f"IQR {other.iqr:.3g} s", samples=other.samples,
                     versus=who, low=other.low, high=other.high, **tag)
        ratio = figure([[a / b for a, b in zip(mine[p], times[p])] for p in both])
        yield Result("time-ratio", MEASURED, setting, ratio.value, "ratio",
                     f"variant time / {who} time per round; IQR {ratio.iqr:.3g}", samples=ratio.samples, versus=who,
                     low=ratio.low, high=ratio.high, **tag)
        yield from _between(ratio, setting, tag, f"its ratio to {who}", versus=who)
    yield Result("tokens-per-s", MEASURED, setting, profile.of(SUITE).batch * n / ours.value, "tokens/s", **tag)
    yield Result("gflops", MEASURED, setting, flops / ours.value / 1e9, "GFLOP/s", f"{flops:.4g} FLOPs counted", **tag)
    yield Result("peak-fraction", MEASURED, setting, flops / ours.value / peak, "fraction",
                 "achieved FLOP/s / measured matmul peak", **tag)


def _between(figure_, setting, tag, what, versus=""):
    """How far apart the processes' medians of a figure landed (none from a single process)."""
    if figure_.between is not None:
        yield Result("time-between", MEASURED, setting, figure_.between, "(max-min)/median",
                     f"{what}: spread of {figure_.processes} processes' medians", versus=versus, **tag)


def _summary_rows(variant, mode, rows: list[Result]):
    """From the variant's own times over the mode's cells: what the backward pass costs at each length, and the
    time exponent of each phase. (No timed crossover with SDPA: near a ratio of 1 whether it exists flips with
    noise; the complexity suite's FLOP crossover is deterministic.)"""
    medians = {(row.phase, row.n): row.value for row in rows if row.check == "time" and not row.versus}
    for phase, n in sorted(medians):
        if phase == "fwd" and ("fwd+bwd", n) in medians:
            yield Result("backward-cost", MEASURED, f"{mode} fwd+bwd n={n}", medians["fwd+bwd", n] / medians["fwd", n],
                         "ratio", "the variant's fwd+bwd time / its own fwd time (medians, same cell)", n=n, mode=mode,
                         phase="fwd+bwd")
    for phase in PHASES:
        lengths = sorted(n for p, n in medians if p == phase)
        fitted = fit_exponent(lengths, [medians[phase, n] for n in lengths])
        if fitted is not None:
            yield Result("time-exponent", MEASURED, f"{mode} {phase}", fitted, "exponent",
                         f"claimed {variant.complexity.time:g}; timing is noisy, verdicts use FLOPs and memory",
                         mode=mode, phase=phase)


def combine(variant, profile, rows_by_process: list[list[Result]]):
    """The speed check's rows from several processes' (``Check.combine``): each cell's figures derived again from
    every process's rounds (:func:`zoo.timing.figure`), its within-process noise the largest any process saw, the
    matmul peak the median of theirs; every other row (plans, counts, kernels, peers' first calls, skips) as the
    first process gave it, and an error of a later process kept unless the first met the same one."""
    rounds: dict[tuple, dict[str, dict[int, list[float]]]] = {}
    spreads: dict[tuple, float] = {}
    flops: dict[tuple, float] = {}
    for process, rows in enumerate(rows_by_process):
        for row in rows:
            cell = (row.mode, row.phase, row.n)
            if row.check == "time" and row.status == MEASURED and row.samples:
                rounds.setdefault(cell, {}).setdefault(row.versus or variant.name, {})[process] = row.samples
            elif row.check == "time-spread" and row.value is not None:
                spreads[cell] = max(spreads.get(cell, 0.0), row.value)
            elif row.check == "timed-flops" and row.value is not None:
                flops.setdefault(cell, row.value)
    peaks = [row.value for rows in rows_by_process for row in rows if row.check == "matmul-peak" and row.value]
    kept = []
    for row in rows_by_process[0]:
        if row.check == "matmul-peak" and peaks:
            row = dataclasses.replace(row, value=statistics.median(peaks), samples=peaks,
                                      detail=f"median of the {len(peaks)} processes' figures, "
                                             f"{len(set(peaks))} measurement(s) (a run measures it once; "
                                             "samples: each process's)")
        elif row.check == "time-spread" and row.status == MEASURED:
            row = dataclasses.replace(row, value=spreads[(row.mode, row.phase, row.n)],
                                      detail="largest IQR/median of the cell's callables in any of the processes")
        if row.check not in DERIVED or row.status != MEASURED:
            kept.append(row)
    seen = {(row.check, row.setting, row.detail) for row in kept if row.status == ERROR}
    kept += [row for rows in rows_by_process[1:] for row in rows  # an error the first process also met: once
             if row.status == ERROR and (row.check, row.setting, row.detail) not in seen]
    peak = statistics.median(peaks) * 1e9 if peaks else float("nan")
    timed_here: dict[str, list[Result]] = {}
    first = {(r.mode, r.phase, r.n) for r in rows_by_process[0] if r.check == "time" and r.status == MEASURED}
    for (mode, phase, n), per_process in rounds.items():  # the cells the first process timed (its plan, its net)
        if variant.name not in per_process or (mode, phase, n) not in flops or (mode, phase, n) not in first:
            continue
        first_callables = {r.versus or variant.name for r in rows_by_process[0] if r.check == "time"
                           and r.status == MEASURED and (r.mode, r.phase, r.n) == (mode, phase, n)}
        cell = {who: runs for who, runs in per_process.items() if who in first_callables}  # the first's plan, its peers
        timed_here.setdefault(mode, []).extend(
            _timed_rows(variant, profile, mode, phase, n, cell, flops[(mode, phase, n)], peak))
    for mode, rows in timed_here.items():
        kept += rows + list(_summary_rows(variant, mode, rows))
    return kept


def run_approximation_error(variant, profile):
    """Normalised error against the function approximated, at every length the speed suite times the
    variant (see :mod:`zoo.approximation`): beside each time on the board stands its cost in accuracy."""
    reason = approximation.not_measurable(variant)
    if reason:
        yield Result("approximation-error", SKIPPED, detail=reason)
        return
    for mode in modes_for(variant, profile.of(SUITE).modes):
        for n in speed_plan(variant, profile, mode).lengths[variant.name]:
            tag = dict(n=n, mode=mode, phase="fwd")
            torch.manual_seed(profile.seed)
            try:  # one length failing (out of memory, say) costs that cell, not the other lengths and modes
                module = zoo.build(variant, d_model=profile.of(SUITE).d_model, num_heads=profile.of(SUITE).heads)
                errors = approximation.errors_by_input(variant, module, n, profile.of(SUITE).d_model, profile.of(SUITE).heads,
                                                       mode == "causal", profile.seed)
            except Exception as exc:
                yield Result("approximation-error", ERROR, f"{mode} fwd n={n}", detail=describe_exception(exc), **tag)
                continue
            easy = statistics.mean(error for family, error in errors.items() if family.easy)
            worst = max(errors, key=errors.get)
            yield Result("approximation-error", MEASURED, f"{mode} fwd n={n}", easy, "normalised error",
                         f"mean over the structured (easy) input families vs {variant.approximates} (0 exact, 1 = "
                         f"each query's mean of the values); all: {approximation.describe(errors)}", **tag)
            yield Result("approximation-error-worst", MEASURED, f"{mode} fwd n={n}", errors[worst], "normalised error",
                         f"the input family it approximates worst: {worst.label}", **tag)
    yield from _error_sweeps(variant, profile)


def _error_sweeps(variant, profile):
    """The approximation error at each value of each option the plugin sweeps (``Variant.error_sweeps``),
    at the reference length, in the variant's primary mode: what the option buys in accuracy."""
    n, mode = profile.of(SUITE).reference_length, variant.tags.primary_mode
    for option, values in variant.error_sweeps.items():
        for value in values:
            torch.manual_seed(profile.seed)
            module = zoo.build(variant, d_model=profile.of(SUITE).d_model, num_heads=profile.of(SUITE).heads, **{option: value})
            errors = approximation.errors_by_input(variant, module, n, profile.of(SUITE).d_model, profile.of(SUITE).heads,
                                                   mode == "causal", profile.seed)
            easy = statistics.mean(error for family, error in errors.items() if family.easy)
            worst = max(errors, key=errors.get)
            setting = f"{mode} fwd n={n} {option}={value!r}"
            tag = dict(n=n, mode=mode, phase="fwd")
            yield Result("approximation-error-sweep", MEASURED, setting, easy, "normalised error",
                         f"{option}={value!r}: mean over the structured input families; all: "
                         f"{approximation.describe(errors)}", params={option: value}, **tag)
            yield Result("approximation-error-sweep-worst", MEASURED, setting, errors[worst], "normalised error",
                         f"{option}={value!r}: the input family it approximates worst: {worst.label}",
                         params={option: value}, **tag)


# --- on the board ---------------------------------------------------------------------------------------

RANK_PHASE = "fwd+bwd"  # what variants are ranked by, at the run's reference length, in their primary mode
ADVICE_ERROR_CEILING = 0.5
"""The largest approximation error (normalised: 0 exact, 1 no better than each query's mean of the values) at which
an approximation is still offered as an answer to "which should I use?": nearer the function it approximates than
halfway to the trivial answer. It is ranked either way, among approximations."""


def _versus(board, variant) -> str:
    return COMPARATORS[board.kind(variant)]


def ratio_header(kind: str, phase: str, n) -> str:
    """The ranked table's column for a kind's ratio at (phase, n)."""
    return f"time / {COMPARATOR_LABELS[COMPARATORS[kind]]}, {phase}, n={n}"


def _is_noisy(board, variant, mode, phase, n) -> bool:
    spread, threshold = board.value(variant, "time-spread", mode, phase, n), board.settings_of(SUITE).noise_threshold
    return spread is not None and threshold is not None and spread > threshold


def _confirmed(board, variant, mode, phase, n, versus) -> bool:
    """Whether a ratio was measured by more than one process or run (a spread between processes, or earlier runs
    its interval spans): within one process, rounds agree more closely than a rerun does (a 1.22x at n=16384 on
    the long board came out 1.02x measured again)."""
    reruns = board.value(variant, "time-ratio", mode, phase, n, versus=versus, field="reruns") \
        if "reruns" in board.results else None  # a board not built from a store has no earlier runs
    return board.value(variant, "time-between", mode, phase, n, versus=versus) is not None or (reruns or 0) > 0


def _stated(board, variant, mode, phase, n, versus="") -> tuple[float, float, float] | None:
    """The figure and its stated interval: the variant's time, with the machine's drift over the run
    (:meth:`Board.drift`), or (versus) its ratio to that callable, measured in the same rounds. None for a figure
    stored without an interval."""
    check = "time-ratio" if versus else "time"
    value, low, high = (board.value(variant, check, mode, phase, n, versus=versus, field=f)
                        for f in ("value", "low", "high"))
    if None in (value, low, high) or value <= 0:
        return None
    drift = None if versus else board.drift(SUITE, "time", COMPARATORS.values(), mode, phase, n)
    if drift is not None:
        low, high = min(low, value * drift[0]), max(high, value * drift[1])
    return value, low, high


def _varies(board, variant, mode, phase, n, versus="") -> bool:
    """The figure's interval (its processes' medians, its rounds' spread, its earlier runs) reaches farther from it
    than the run's threshold allows (:func:`zoo.timing.strays`): a rerun may land elsewhere."""
    interval = _stated(board, variant, mode, phase, n, versus)
    threshold = getattr(board.settings_of(SUITE), "interval_threshold", None)
    return interval is not None and threshold is not None and strays(*interval, threshold)


def _earlier_form(board, variant, mode, versus) -> bool:
    """Whether the variant's ratios to ``versus`` in ``mode`` were timed before a change to how the harness calls
    it (:data:`zoo.checks.TIMING_FORM_CHANGES`): against the call as it was, not the one this zoo times."""
    form = board.timing_form_of(SUITE, variant)
    return form is not None and bool(form_changes(form, versus, mode))


def _missing(board, variant: str, mode: str, phase: str, n) -> str:
    """Why a variant has no time at (mode, phase, n): the plan's, the safety net's or an error's words."""
    rows = board.rows(SUITE, variant)
    if rows.empty:
        return "the speed suite did not run on this variant in this run"
    here = rows[(rows.n == n) & (rows["mode"] == mode) & rows.status.isin([SKIPPED, ERROR])]
    if not here.empty:
        return f"n={n}: {here.detail.iloc[0]}"
    if n not in set(rows[(rows.check == "time") & (rows.versus == "")].n.dropna()):
        errors = rows[rows.status == ERROR]
        if not errors.empty:
            return f"speed suite error: {errors.detail.iloc[0]}"
        return f"n={n} is not among this run's timed lengths"
    return f"no {phase} ratio recorded at n={n}"


def _interval(board, variant, phase, n, mode) -> tuple[float | None, float | None]:
    """The ends of the interval of the variant's ratio to its comparator at (mode, phase, n); None where not
    stated."""
    return tuple(board.value(variant, "time-ratio", mode, phase, n, versus=_versus(board, variant), field=f)
                 for f in ("low", "high"))


def _ratio_cell(board, variant, phase, n, notes=None, mode=None) -> tuple[float | None, str]:
    """The ratio to the comparator in ``mode`` (default the variant's primary mode: a causal-only variant's against
    the comparator's causal call, and its cell says 'causal') and its cell: marked noisy, or why it is missing (a
    footnote in ``notes``)."""
    versus, mode = _versus(board, variant), mode or board.primary_mode(variant)
    ratio = board.value(variant, "time-ratio", mode, phase, n, versus=versus)
    if ratio is None:
        why = _missing(board, variant, mode, phase, n)
        return None, "not timed " + (notes.mark(why) if notes is not None else f"({why})")
    low, high = _interval(board, variant, phase, n, mode)
    interval = f" [{low:.3g}-{high:.3g}]" if low is not None and high is not None else ""
    marks = [word for word, marked in (("causal", mode == "causal"), ("noisy", _is_noisy(board, variant, mode, phase, n)),
                                       ("varies", _varies(board, variant, mode, phase, n, versus)),
                                       ("earlier form", _earlier_form(board, variant, mode, versus))) if marked]
    return ratio, fmt_x(ratio) + interval + (f" ({', '.join(marks)})" if marks else "")


def rank_figure(board, variant) -> zoo.RankFigure:
    """Forward+backward time relative to the op the variant's kind is compared with, at the reference length, with
    the interval its processes and rounds span (overlapping intervals are tied places)."""
    n = board.settings_of(SUITE).reference_length
    value, text = _ratio_cell(board, variant, RANK_PHASE, n)
    return zoo.RankFigure(ratio_header(board.kind(variant), RANK_PHASE, n), value, text,
                          *_interval(board, variant, RANK_PHASE, n, board.primary_mode(variant)))


def details(board, variant) -> list:
    """The variant page's times: every timed mode, pass and length, its own time, its ratio to the op its kind is
    compared with and to its best known implementation."""
    mine = board.rows(variant=variant)
    mine = mine[(mine.check == "time") & (mine.versus == "")].dropna(subset=["value"])
    versus, label = _versus(board, variant), best_known(board.card(variant))
    target = approximates(board.card(variant))
    rows = []
    for r in mine.sort_values(["mode", "phase", "n"]).itertuples():
        ratio = board.value(variant, "time-ratio", r.mode, r.phase, r.n, versus=versus)
        peer = board.value(variant, "time-ratio", r.mode, r.phase, r.n, versus=label) if label else None
        former = {who: " (earlier form)" if _earlier_form(board, variant, r.mode, who) else ""
                  for who in (versus, label)}
        row = {"mode": r.mode, "phase": r.phase, "n": int(r.n), "time": fmt_ms(r.value),
               f"x {COMPARATOR_LABELS.get(versus, versus)}": fmt_x(ratio) + former[versus] if ratio is not None
               else "not timed",
               f"x best known ({label or 'none declared'})": fmt_x(peer) + former[label] if peer is not None else "-"}
        if target is not None:  # an approximation's speed is never shown without its cost in accuracy
            error = board.value(variant, "approximation-error", r.mode, "fwd", r.n)
            row[f"approximation error (of {target})"] = f"{error:.2f}" if error is not None else "not measured"
        rows.append(row)
    return [zoo.Table("Times per length", list(rows[0]), rows)] if rows else []


def axes(board, variant) -> list[zoo.Axis]:
    """What a reader weighs from this suite: the time ratio at the reference length in each mode (the reasons to
    choose for non-causal and causal training: a causal-only variant has only the causal one) and an
    approximation's error there (0 for an exact variant: a cost)."""
    n, mode = board.settings_of(SUITE).reference_length, board.primary_mode(variant)
    target = approximates(board.card(variant))
    error = 0.0 if target is None else board.value(variant, "approximation-error", mode, "fwd", n)
    error_text = "0 (exact)" if target is None else "not measured" if error is None else f"{error:.2f} (of {target})"
    column = ratio_header(board.kind(variant), RANK_PHASE, n)
    full = (None, "causal only") if mode == "causal" else _ratio_cell(board, variant, RANK_PHASE, n, mode="full")
    causal = _ratio_cell(board, variant, RANK_PHASE, n, mode="causal")
    full_interval = (None, None) if mode == "causal" else _interval(board, variant, RANK_PHASE, n, "full")
    causal_interval = _interval(board, variant, RANK_PHASE, n, "causal")
    axes = [zoo.Axis(column, full[0], "lower", full[1], use=f"non-causal training and encoding at n={n}",
                     low=full_interval[0], high=full_interval[1]),
            zoo.Axis(f"causal {column}", causal[0], "lower", causal[1], use=f"causal training and prefill at n={n}",
                     low=causal_interval[0], high=causal_interval[1]),
            zoo.Axis(f"approximation error, n={n}", error, "lower", error_text, tie=0.01, ceiling=ADVICE_ERROR_CEILING)]
    longest = _longest_length(board)
    if longest > n:  # the board times longer sequences than it ranks at: the answer for them is measured there
        value, text = _ratio_cell(board, variant, RANK_PHASE, longest)
        low, high = _interval(board, variant, RANK_PHASE, longest, mode)
        axes.append(zoo.Axis(ratio_header(board.kind(variant), RANK_PHASE, longest), value, "lower", text,
                             use=f"the longest sequences timed, n={longest}", low=low, high=high))
    return axes


def _longest_length(board) -> int:
    """The longest sequence length the board's runs timed a variant at (0: none)."""
    timed = board.rows(SUITE)
    timed = timed[(timed.check == "time") & (timed.versus == "")].n.dropna()
    return int(timed.max()) if not timed.empty else 0


def _approximation_missing(board, variant, n) -> str:
    rows = board.results
    skipped = rows[(rows.variant == variant) & (rows.check == "approximation-error") & (rows.status == SKIPPED)]
    if not skipped.empty:
        return f"approximation error not measured: {skipped.detail.iloc[0]}"
    return f"approximation error not measured at n={n} in this run (it is taken wherever the speed suite times the variant)"


def columns(board, variant) -> dict:
    """An approximation's cost in accuracy beside its speed, always; the ratios and the time at the reference n."""
    n, kind, mode = board.settings_of(SUITE).reference_length, board.kind(variant), board.primary_mode(variant)
    target = approximates(board.card(variant))
    if target is None:
        accuracy = "exact"
    else:
        error = board.value(variant, "approximation-error", mode, "fwd", n)
        worst = board.value(variant, "approximation-error-worst", mode, "fwd", n)
        accuracy = f"approx. of {target}: " + (
            f"error {error:.2f}" + (f", worst {worst:.2f}" if worst is not None else "") if error is not None else
            "not measured " + board.notes.mark(f"{variant}: " + _approximation_missing(board, variant, n)))
    row = {f"approximation error, n={n}": accuracy}
    for phase in (RANK_PHASE, "fwd"):
        row[ratio_header(kind, phase, n)] = _ratio_cell(board, variant, phase, n, board.notes)[1]
    row[f"fwd+bwd time, n={n}"] = fmt_ms(board.value(variant, "time", mode, RANK_PHASE, n))
    label = best_known(board.card(variant))
    ratio = board.value(variant, "time-ratio", mode, RANK_PHASE, n, versus=label) if label else None
    unrecorded = "best_known" not in board.card(variant)  # stored before plugins declared one
    if unrecorded or not label or ratio is None:
        row[f"fwd+bwd vs best known, n={n}"] = ("not recorded by its run" if unrecorded else "not declared"
                                                if not label else "not timed")
    else:
        low = board.value(variant, "time-ratio", mode, RANK_PHASE, n, versus=label, field="low")
        mark = behind_mark(ratio, low, _confirmed(board, variant, mode, RANK_PHASE, n, label))
        row[f"fwd+bwd vs best known, n={n}"] = f"{fmt_x(ratio)} {label}" + (f" ({mark})" if mark else "")
    return row


def _noise_line(board) -> str:
    spreads = board.results[board.results.check == "time-spread"].value.dropna()
    threshold = board.settings_of(SUITE).noise_threshold
    if spreads.empty:
        return "Noise: no timed cells on this board."
    over = int((spreads > threshold).sum()) if threshold is not None else 0
    rule = (f"; {over} of {len(spreads)} cells stayed above the {threshold:g} threshold after re-measuring and are "
            "marked (noisy)") if threshold is not None else ""
    return (f"Noise on this board: within a process, interquartile range / median of the timed cells (each cell's "
            f"noisiest callable), median {spreads.median():.3g}, largest {spreads.max():.3g}{rule}.")


def _reproducibility_line(board) -> str:
    """The run's reproducibility figures: how far apart its processes' medians of one cell land, for the ratios to
    the op each kind is ranked against and for the variants' own times, how far the machine drifted over the run,
    and how many figures are marked."""
    drifts = board.drifts(SUITE, "time", COMPARATORS.values())
    drift = (" The machine itself drifted over the run: the op each kind is ranked against, timed beside each "
             "variant in that variant's job, landed apart by (largest - smallest) / median "
             f"{statistics.median(drifts):.3g} (median over the cells), largest {max(drifts):.3g}; a variant's own "
             "time carries that drift, a ratio measured in the same rounds as its comparator does not, so compare "
             "ratios, not times, between runs." if drifts else "")
    rows = board.results[(board.results.suite == SUITE) & (board.results.check == "time-between")]
    comparators = {variant: _versus(board, variant) for variant in board.variants}
    if rows.empty:
        return ("Reproducibility: each cell was timed in one process, so within this run nothing says how far a "
                "rerun of it would land (run with --processes 2 or more)." + drift
                + _between_runs_text(board, comparators))
    ratios = rows[rows.versus == rows.variant.map(comparators)]
    times = rows[rows.versus == ""]
    described = "; ".join(f"{label} median {values.value.median():.3g}, largest {values.value.max():.3g}"
                          for label, values in (("ratios to the op each kind is ranked against", ratios),
                                                ("own times", times)) if not values.value.dropna().empty)
    threshold = getattr(board.settings_of(SUITE), "interval_threshold", None)
    marked = [_varies(board, r.variant, r.mode, r.phase, r.n, r.versus) for frame in (ratios, times)
              for r in frame.itertuples()]
    return (f"Reproducibility: each cell was timed in {board.settings.get('processes') or 'several'} fresh processes, "
            f"each a separate pass over the run's variants; the spread of their medians ((largest - smallest) / "
            f"median): {described}.{drift}{_between_runs_text(board, comparators)} A figure's interval [low-high] "
            "spans every process's median and at least the rounds' interquartile range, a time's also the run's "
            "drift, and the same figure in those earlier runs; "
            + (f"{sum(marked)} of {len(marked)} of these figures have one reaching farther than {threshold / 2:g} of "
               "their value from them and are marked *varies* (a rerun may land elsewhere); "
               if threshold is not None else "")
            + "ranked variants whose intervals overlap share a rank.")


def _between_runs_text(board, comparators) -> str:
    """How far the ratios to the op each kind is ranked against landed apart between this board's run and the
    earlier runs of the same sources it also spans (:data:`zoo.board.RERUNS`)."""
    rows = board.results[(board.results.suite == SUITE) & (board.results.check == "time-ratio")]
    rows = rows[rows.versus == rows.variant.map(comparators)]
    spanned = rows[rows.reruns > 0] if "reruns" in rows else rows.iloc[:0]
    if spanned.empty:
        return (" No earlier run of these sources on these settings and this kind of machine, timing them in the "
                "same form, is in the store, so nothing here has been seen across runs.")
    return (f" Between runs: {len(spanned)} of {len(rows)} ratios to the op each kind is ranked against were also "
            f"measured in up to {RERUNS} earlier runs of the same source on these settings and this kind of "
            "machine, timed in the same form; the spread of those runs' figures and this one's "
            f"((largest - smallest) / value): median {spanned.between_runs.median():.3g}, "
            f"largest {spanned.between_runs.max():.3g}.")


def _forms_line(board) -> str:
    """Which variants' ratios were timed before a change to their comparator's call (marked *earlier form*), what
    changed, and which variants on the board were timed against the call as it is now; '' where none were."""
    said = []
    for changes in TIMING_FORM_CHANGES.values():
        for change in changes:
            timed = [v for v in board.variants if _versus(board, v) == change.versus and any(
                board.value(v, "time-ratio", change.mode, phase, versus=change.versus) is not None for phase in PHASES)]
            earlier = [v for v in timed if _earlier_form(board, v, change.mode, change.versus)]
            if not earlier:
                continue
            label, now = COMPARATOR_LABELS.get(change.versus, change.versus), sorted(set(timed) - set(earlier))
            said.append(f"the {change.mode} ratios to {label} of {', '.join(earlier)} were timed when {change.before}; "
                        f"now {change.now}"
                        + (f" (as in the ratios of {', '.join(now)} here, not comparable with them)" if now else "")
                        + (f"; {change.also} timed the same earlier call in those runs" if change.also else ""))
    return ("Marked *earlier form*, timed before a change to how the harness calls a comparator "
            f"(zoo.checks.TIMING_FORM): {'; '.join(said)}. They are ranked on those figures all the same; a run of "
            "them with this zoo on the board's settings replaces them.") if said else ""


def rank_intro(board) -> list[str]:
    """What the ranking compares, for the board's header, and the board's noise."""
    settings, mine = board.settings, board.settings_of(SUITE)
    return [
        "Like is compared with like: attention *cores* against "
        "torch SDPA, attention *layers* (with projections) against nn.MultiheadAttention(need_weights=False), "
        f"each on the same shapes in the same process: non-causal (a variant that computes only its causal form: "
        f"causal, against the comparator's causal call, marked *causal*), n = {mine.reference_length}, batch "
        f"{mine.batch}, {mine.heads} heads, d_model {mine.d_model}, "
        f"{settings.get('dtype', 'float32')}, {settings.get('threads')} threads; lower is better. "
        "Variants without a time at that length come last, with the reason. \"exact\": the variant computes its "
        "own documented function exactly (not necessarily softmax). An approximation's error is measured against "
        "the function it approximates, normalised so that 0 is exact and 1 is no better than the trivial answer "
        "(each query's mean of the values it may see), at the same shapes: first the mean over structured inputs "
        "(low-rank and clustered queries and keys), then the worst over all input families (random ones at "
        "higher logit scales included). An approximation no better than the trivial answer on the structured "
        "inputs fails correctness and is not ranked.",
        _noise_line(board),
        *([_reproducibility_line(board)] if (board.results.check == "time").any() else []),
        *([line] if (line := _forms_line(board)) else []),
    ]


def _kernels(board, variant, mode, phase, n) -> str:
    """The fused attention kernels a timed call ran (its sdpa-backend row), without aten's decorations."""
    rows = board.rows(variant=variant)
    rows = rows[(rows.check == "sdpa-backend") & (rows["mode"] == mode)
                & (rows.phase == phase) & (rows.n == n)].detail.dropna()
    if rows.empty:
        return ""
    names = [re.sub(r"^aten\._scaled_dot_product_|\.default$", "", op.strip()) for op in rows.iloc[-1].split(",")]
    forward = [name for name in names if not name.endswith("_backward")]
    return ", ".join(name + (" (+ backward)" if f"{name}_backward" in names else "") for name in forward)


def _first_call(board, variant, who, mode, n) -> str:
    """A peer's first call at n (compilation happens there), shown beside its ratio."""
    seconds = board.value(variant, "first-call", mode, "fwd", n, versus=who)
    return "" if seconds is None else f"; first call {seconds:.2g} s"


def _baseline_gap(board, variant, who, mode, n, notes) -> str:
    """Why a baseline has no ratio at n: the plan's reason if it left the baseline out."""
    rows = board.rows(variant=variant)
    rows = rows[(rows.check == "plan") & (rows.versus == who) & (rows.n == n)
                & (rows["mode"] == mode)]
    return "not timed " + notes.mark(f"{who}, n={n}: {rows.detail.iloc[0]}") if not rows.empty else ""


def section(board) -> zoo.Section:
    """The speed section: times and ratios per length, baselines and peers, error sweeps, rates, the time plot."""
    results, settings, variants = board.results, board.settings, board.variants
    ref = board.settings_of(SUITE).reference_length
    speed = results[(results.suite == SUITE) & (results.check == "time") & (results.versus == "")]
    lengths = sorted(int(n) for n in speed.n.dropna().unique())
    notes = Footnotes()
    rows = []
    for variant in variants:
        versus = _versus(board, variant)
        timed = board.rows(SUITE, variant)
        timed = timed[(timed.check == "time") & (timed.versus == "")]
        for mode in ("full", "causal"):
            for phase in PHASES:
                if timed[(timed["mode"] == mode) & (timed.phase == phase)].empty:
                    continue
                row = {"variant": variant, "mode": mode, "pass": phase, "versus": versus}
                for n in lengths:
                    t = board.value(variant, "time", mode, phase, n)
                    if t is None:
                        row[f"n={n}"] = "not timed " + notes.mark(_missing(board, variant, mode, phase, n))
                        continue
                    iqr, x = board.value(variant, "time-iqr", mode, phase, n), board.value(variant, "time-ratio", mode, phase, n,
                                                                                           versus=versus)
                    error = board.value(variant, "approximation-error", mode, "fwd", n) if phase == "fwd" else None
                    ratio_marks = "".join(f", {word}" for word, marked in (
                        ("varies", _varies(board, variant, mode, phase, n, versus)),
                        ("earlier form", _earlier_form(board, variant, mode, versus))) if marked)
                    row[f"n={n}"] = (fmt_ms(t, iqr) + (" varies" if _varies(board, variant, mode, phase, n) else "")
                                     + (f" ({fmt_x(x)}{ratio_marks})" if x is not None
                                        else " (no ratio)")
                                     + (" noisy" if _is_noisy(board, variant, mode, phase, n) else "")
                                     + (f"; approx. error {error:.2f}" if error is not None else ""))
                rows.append(row)
    extra = []
    peers_timed = getattr(board.settings_of(SUITE), "peers", True)  # a run stored before the setting timed them
    for variant in variants:
        mine = board.rows(variant=variant)
        mine = mine[mine.check == "time-ratio"]
        peers = set(board.card(variant).get("peers", [])) if peers_timed else set()
        for who in sorted((set(mine.versus) | peers) - {_versus(board, variant), best_known(board.card(variant))}):
            for mode in ("full", "causal"):
                for phase in PHASES:
                    values = {n: board.value(variant, "time-ratio", mode, phase, n, versus=who) for n in lengths}
                    timed_here = board.value(variant, "time", mode, phase, None) is not None
                    if any(v is not None for v in values.values()) or (who in peers and phase == "fwd" and timed_here):
                        extra.append({"variant": variant, "versus": who + (" (peer)" if who in peers else ""),
                                      "mode": mode, "pass": phase,
                                      **{f"n={n}": (fmt_x(v) + (" varies" if _varies(board, variant, mode, phase, n, who)
                                                                 else "")
                                                    + (" earlier form" if _earlier_form(board, variant, mode, who)
                                                       else "")
                                                    + _first_call(board, variant, who, mode, n)
                                                    if v is not None
                                                    else _baseline_gap(board, variant, who, mode, n, notes))
                                         for n, v in values.items()}})
    sweeps = []
    for row in results[results.check == "approximation-error-sweep"].itertuples():
        worst = results[(results.variant == row.variant) & (results.check == "approximation-error-sweep-worst")
                        & (results.params == row.params) & (results.n == row.n)]
        option = ", ".join(f"{key}={value!r}" for key, value in sorted((row.params or {}).items()))
        sweeps.append({"variant": row.variant, "option": option, f"error at n={int(row.n)}": f"{row.value:.3g}",
                       "worst input family": "" if worst.empty else f"{worst.value.iloc[0]:.3g}"})
    rates = []
    for variant in variants:
        for mode in ("full", "causal"):
            for phase in PHASES:
                g = board.value(variant, "gflops", mode, phase, ref)
                if g is not None:
                    fraction = board.value(variant, "peak-fraction", mode, phase, ref)
                    rates.append({"variant": variant, "mode": mode, "pass": phase, f"GFLOP/s at n={ref}": fmt_g(g),
                                  "% of matmul peak": fmt_g(None if fraction is None else 100 * fraction),
                                  "tokens/s": fmt_g(board.value(variant, "tokens-per-s", mode, phase, ref)),
                                  "fused attention kernels": _kernels(board, variant, mode, phase, ref)})
    peak = results[results.check == "matmul-peak"]
    each = [x for samples, value in zip(peak.samples, peak.value) if value == value
            for x in (samples if isinstance(samples, list) and samples else [value])]
    peak_text = (f"{statistics.median(each):.3g} GFLOP/s (median over the run's worker processes; from "
                 f"{min(each):.3g} to {max(each):.3g} between them: the machine itself runs faster or slower from "
                 "minute to minute, which no setting of the harness removes)") if each else "not measured"
    dtype = settings.get("dtype", "float32")
    text = ("Median time per call over interleaved rounds (± interquartile range) and, in brackets, the ratio "
            "to the op named under *versus* (torch SDPA for cores, nn.MultiheadAttention(need_weights=False) for "
            "layers) on the same shapes in the same process (median of per-round ratios, over every process that "
            "timed the cell); *noisy* marks a cell whose IQR/median stayed above the run's threshold after "
            "re-measuring, *varies* a time or ratio whose interval (every process's median, at least the rounds' "
            "interquartile range, the same figure in earlier runs of the same source and timing form; for a time also "
            "the machine's drift over the run, see Reproducibility above) reaches farther from it than half the run's "
            "threshold (a rerun may land elsewhere)"
            + ("; *earlier form*, a ratio timed before a change to how the harness calls what it is compared with "
               "(the board's header says which)" if _forms_line(board) else "")
            + ". An approximation's forward cells also give its normalised error at that length (0 exact, 1 = each "
            "query's mean of the values). "
            f"{dtype.capitalize()} matmul peak of this machine in this run: {peak_text}.")
    behind, undeclared = best_known_rows(board, "time-ratio", PHASES, lengths, functools.partial(_confirmed, board),
                                         functools.partial(_earlier_form, board))
    tables = [zoo.Table("", [], rows, footnotes=notes.reasons),  # its own and the baselines' empty cells
              zoo.Table("Against the best known implementation of the same math", [], behind, note=[
                  "Time of the variant / time of the fastest implementation of its own math its plugin knows "
                  "(*best known*: one of its baselines, checked equal to it by the correctness suite, or the op its "
                  "kind is ranked against where that is the same math), same shapes, same process, median of "
                  f"per-round ratios. A ratio over {BEST_KNOWN_SLACK:g} is marked *behind* (the variant trails a "
                  "known implementation of what it computes, and closing that gap needs no new idea), *behind?* "
                  "where the ratio's interval reaches down to it or one process of one run measured it (its rounds "
                  "understate what a rerun sees: a rerun may find it within)."
                  + (f" No best known implementation declared (or recorded by their runs): {', '.join(undeclared)}."
                     if undeclared else "")]),
              zoo.Table("Against each variant's own baselines, floors and torch SDPA", [], extra, note=[
                  "Time of the variant / time of the named callable, same shapes, same process (a *floor* is the op "
                  "the variant cannot avoid, timed in the forward pass only; a *peer* is another library's "
                  "implementation of the same function, timed in the forward pass after a first call that is not "
                  "timed, whose output agreed with the variant's; its first call, where compilation happens, is "
                  "given beside its ratio; *varies*: the ratio's interval reaches farther from it than half the run's threshold)."
                  + ("" if peers_timed else " This board's profile times no peer: the full profile does (the long "
                                            "board).")])]
    if sweeps:
        tables.append(zoo.Table("Approximation error against the plugin's own options", [], sweeps, note=[
            "Each approximation's normalised error (0 exact, 1 = each query's mean of the values) at the values of "
            "the options its plugin sweeps, on the speed suite's shapes, in its primary mode (non-causal unless it "
            "computes only its causal form): first the mean over the "
            "structured inputs, then the worst input family."]))
    tables.append(zoo.Table("Achieved rate", [], rates, note=[
        "Counted FLOPs of one call / its median time, and that rate / the matmul peak above. The FLOPs are "
        "torch's count, which charges a causal SDPA call the full n x n scores; a fused causal kernel skips the "
        "masked half, so a causal figure can read up to twice the rate achieved (over 100% where it does)."]))
    mine = board.rows(SUITE)
    plot = plots_.log_log(board.in_primary_mode(mine[mine.phase == "fwd+bwd"]), "time", "time.png",
                          "seconds per call (forward+backward, speed shapes)",
                          panels=plots_.kind_panels(board, {k: (c, COMPARATOR_LABELS[c]) for k, c in COMPARATORS.items()}),
                          greyed=plots_.unranked(board), palette=tuple(board.variants))
    return zoo.Section("Speed", [text], tables, dict([plot]) if plot else {})


LEGACY_NAMES = {"time-ratio": "x-{}", "time": "{}-time", "plan": "{}-plan", "first-call": "{}-first-call",
                "agreement": "{}-agreement"}
"""How rows named the callable before ``versus`` was a field: ``x-torch-sdpa``, ``torch-sdpa-time``..."""


def upgrade(row: dict) -> dict:
    """A stored row as the suite yields it today: the callable out of its name, a swept option out of its setting."""
    row = legacy_names(row, LEGACY_NAMES, [m.name for m in SUITE_DEFINITION.measures])
    if row.get("form", 1) < 2 and row["check"].startswith("approximation-error-sweep") and not row.get("params") and "=" in row["setting"]:
        option, _, text = row["setting"].rsplit(" ", 1)[-1].partition("=")
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):  # a value that was no literal (torch.float16): kept as written
            value = text
        row = {**row, "params": Result("", MEASURED, params={option: value}).params}
    return row


def settle(settings: dict) -> dict:
    """The reference length must be timed: when the lengths leave it out, the longest of them takes its place; the
    causal lengths are those of ``causal_lengths`` among the lengths (None: all; none left: the reference). A run
    stored before ``max_call_ops`` existed reads as one with the long cap (:data:`MAX_CALL_OPS`), so a full run
    shares a board with a new one of its settings: that cap leaves out only loops in Python over long sequences,
    which no figure ranks; one stored before ``peers`` existed timed its peers."""
    lengths = tuple(sorted(set(settings["lengths"])))
    reference = settings["reference_length"] if settings["reference_length"] in lengths else max(lengths)
    causal = _causal_lengths(lengths, settings.get("causal_lengths"), reference)
    return {"max_call_ops": MAX_CALL_OPS, "peers": True, **settings, "lengths": lengths, "reference_length": reference,
            "causal_lengths": causal}


def noise(rows):
    """Each timed cell's spread within its processes (its ``time-spread``), by (variant, mode, phase, n)."""
    spread = rows[(rows.check == "time-spread") & (rows.status == MEASURED)].dropna(subset=["value"])
    return spread.set_index(["variant", "mode", "phase", "n"]).value


SUITE_DEFINITION = zoo.Suite(
    SUITE, "time per call against the op each kind is ranked against (torch SDPA, nn.MultiheadAttention) and the "
    "variant's own baselines, floors and peers, on the same shapes in one process", measures=(
        zoo.Measure("time", "median seconds per call over interleaved rounds (with versus: that callable's, in the "
                    "same cell)", "s"),
        zoo.Measure("time-iqr", "interquartile range of the time over rounds", "s"),
        zoo.Measure("time-spread", "the cell's largest IQR/median over its callables in any process: its noise within "
                    "a process", "IQR/median"),
        zoo.Measure("time-between", "the spread of the processes' medians of the variant's time (with versus: of its "
                    "ratio to that callable), (max - min) / median: how far a rerun may land", "(max-min)/median"),
        zoo.Measure("timed-flops", "FLOPs of one timed call of the variant, counted", "FLOPs"),
        zoo.Measure("time-ratio", "time / the time of the callable named in versus, median of per-round ratios", "ratio"),
        zoo.Measure("tokens-per-s", "tokens processed per second", "tokens/s"),
        zoo.Measure("gflops", "counted FLOPs / time", "GFLOP/s"),
        zoo.Measure("peak-fraction", "achieved FLOP/s / the measured matmul peak", "fraction"),
        zoo.Measure("sdpa-backend", "the fused attention kernels a timed call ran"),
        zoo.Measure("backward-cost", "fwd+bwd time / fwd time", "ratio"),
        zoo.Measure("time-exponent", "time's fitted exponent in n (timing is noisy: no verdict)", "exponent"),
        zoo.Measure("matmul-peak", "this device's matmul rate in the run's dtype", "GFLOP/s"),
        zoo.Measure("allocator", "the allocator settings the worker ran with"),
        zoo.Measure("approximation-error", "an approximation's normalised error (0 exact, 1 = each query's mean of "
                    "the values) on structured inputs, at each timed length; -worst: the worst input family",
                    "normalised error"),
        zoo.Measure("approximation-error-worst", "the same on the input family it approximates worst",
                    "normalised error"),
        zoo.Measure("approximation-error-sweep", "the same at each value of an option the plugin sweeps (params: "
                    "the option and its value)", "normalised error"),
        zoo.Measure("approximation-error-sweep-worst", "the same on the worst input family", "normalised error"),
        zoo.Measure("first-call", "the first call of the peer in versus, where compilation happens", "s"),
        zoo.Measure("agreement", "the output of the peer in versus against the variant's", "relative error"),
        zoo.Measure("plan", "a length the measurement plan left out for the variant (or the callable in versus), "
                    "and why")),
    section=section, columns=columns, details=details, ranking=zoo.Ranking(rank_figure, rank_intro), upgrade=upgrade,
    noise=noise,
    axes=axes, order=30,
    settings={
        "batch": 1, "d_model": 512, "heads": 8, "lengths": (256, 512), "modes": ("full", "causal"),
        # the lengths causal mode is timed at, among ``lengths``, where it is not the variant's primary mode (None:
        # all of them; none of them: the reference; a causal-only variant is timed at every length)
        "causal_lengths": (512,),
        # baselines, floors and peers timed in both modes (False: only in the variant's primary mode, the other
        # timing the variant against the ops it is compared with)
        "baselines_in_every_mode": False,
        # the plugins' peers timed too (other libraries' forms of the variant's math, FlexAttention's compiled
        # one, whose first call compiles for seconds on a fresh machine): the quick profile leaves them to the full
        "peers": False,
        # rounds per process (a figure pools the rounds of the run's processes: 2 in quick, 3 in full), each costing
        # every callable about round_seconds
        "repeats": 2, "round_seconds": 0.01,
        # fewer rounds in a process where they would cost a cell more than this (at least one; None: no cap): a
        # cell of slow calls gets one round in each process, whose spread between processes is what a rerun sees
        "cell_seconds": 0.25,
        # the measurement plan (zoo.plan): a length is left out for a callable whose forward+backward call is
        # predicted, from counted FLOPs, memory and dispatched ops, to exceed these caps; no clock decides what is
        # measured; 1 GiB leaves the memory-bound broadcasts to the full profile (additive attention's naive
        # baseline holds 1.51 GiB at n = 512 in one forward+backward, any other callable at most 0.18 GiB)
        "max_call_gflop": 100.0, "max_call_gib": 1.0, "max_call_ops": QUICK_MAX_CALL_OPS,
        # a cell whose IQR exceeds this fraction of its median is re-measured (up to noise_retries times, adding
        # rounds) and, if still noisy, marked on the board
        "noise_threshold": 0.2, "noise_retries": 1,
        # a time or ratio whose interval (every process's median, at least the rounds' IQR, earlier runs) reaches
        # farther than half this fraction from it is marked on the board (zoo.timing.strays: a rerun may land
        # elsewhere); overlapping ranks are tied
        "interval_threshold": 0.1,
        # a last-resort safety net, not a plan: a variant whose one warm call takes longer is not timed at larger
        # lengths, and the board says so (None: none, as in the smoke profile: no clock decides anything there)
        "call_limit_seconds": 30.0,
        "reference_length": 512,  # variants are ranked by fwd+bwd time / their comparator's at this n
    },
    presets={
        "full": {"lengths": (256, 512, 1024, 2048, 4096, 8192, 16384), "causal_lengths": None,
                 "baselines_in_every_mode": True, "peers": True, "repeats": 4,
                 "round_seconds": 0.2, "cell_seconds": None, "max_call_gflop": 2500.0, "max_call_gib": 8.0,
                 "max_call_ops": MAX_CALL_OPS,
                 "call_limit_seconds": 60.0,
                 "reference_length": 4096},
        "smoke": {"d_model": 64, "heads": 2, "lengths": (64, 128, 256), "peers": True, "repeats": 2,
                  "round_seconds": 0.005, "reference_length": 256, "call_limit_seconds": None,
                  "max_call_ops": MAX_CALL_OPS},
    },
    legacy={"speed_batch": "batch", "speed_d_model": "d_model", "speed_heads": "heads", "speed_lengths": "lengths",
            "speed_modes": "modes", "repeats": "repeats", "round_seconds": "round_seconds",
            "max_call_gflop": "max_call_gflop", "max_call_gib": "max_call_gib", "noise_threshold": "noise_threshold",
            "noise_retries": "noise_retries", "call_limit_seconds": "call_limit_seconds",
            "reference_length": "reference_length"},
    settle=settle)


@zoo.hookimpl
def zoo_register_suites(register):
    register(SUITE_DEFINITION)


@zoo.hookimpl
def zoo_register_checks(register):
    register(Check("speed", SUITE, "median time, IQR, x SDPA and baselines, GFLOP/s and % of matmul peak over n",
                   run_speed, combine=combine))
    register(Check("approximation-error", SUITE, "error against the function approximated over n, normalised "
                   "(0 exact, 1 = mean of the values)", run_approximation_error))
