"""Timing: interleaved rounds inside one process, and what the rounds of several fresh processes say together.

Inside a process the callables of a cell take turns, round after round, each running a call count calibrated so
a round costs it about ``round_seconds``; the turn order alternates between rounds (ABBA), so whatever one
callable leaves behind for the next (caches, a thread pool's state) falls on each alike.

Rounds in one process are not the uncertainty of a figure: a fresh process, or the same one minutes later, lands
elsewhere by more than the rounds spread. On the shared 2-core virtual machines the zoo runs on, the cause is the
machine itself: its matmul rate moves by tens of percent from second to second and from minute to minute (no
steal time is reported), and a variant made of many small ops moves with it more than one fused call does;
pinning the OpenMP threads, their wait policy and address-space randomisation changed none of that. So a run
measures a timing in several processes, a pass over the variants apart (:attr:`zoo.Check.combine`), and a figure
(:func:`figure`) is the median of all their rounds, its interval spans every process's median and at least the
pooled rounds' first to third quartile, and its spread between processes is (largest - smallest process median)
/ median.
"""

from __future__ import annotations

import statistics
import timeit
from dataclasses import dataclass

from torch.utils.benchmark.utils.timer import timer as synchronized_clock

from .scaling import timed


def _quartile_ends(values: list[float]) -> tuple[float, float, float]:
    """First quartile, median, third quartile (a single value is all three)."""
    if len(values) < 2:
        return values[0], values[0], values[0]
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, median, q3


def quartiles(values: list[float]) -> tuple[float, float]:
    """Median and interquartile range (0 for a single value)."""
    q1, median, q3 = _quartile_ends(values)
    return median, q3 - q1


def relative_spread(values: list[float]) -> float:
    """Interquartile range over median: the within-process noise figure a cell is re-measured and flagged by."""
    median, iqr = quartiles(values)
    return iqr / median if median > 0 else 0.0


def calibrate(fns: dict[str, callable], settings, count: str | None = None, counter=None, cold_call=None):
    """A timer and a per-round call count for each callable, the seconds a round of them all costs, and
    ``count``'s ``counter(fn)`` from its cold call (else None). ``cold_call``: ``count``'s cold call already made
    by the caller, as its seconds and its ``counter`` result (the speed suite's safety net makes it), so it is not
    made again: at n = 1024 that is a whole forward+backward of a variant whose one call takes seconds.

    Each callable runs a call count calibrated once from a warm-up (after a first, cold call): calls, untimed,
    for one round's worth of time, since a callable's first tenth of a second here ran 10-20% slower than its
    steady state; so a round costs every callable about ``round_seconds``. A cold call already ten rounds long
    needs no warm-up (its count is one). A round is the stdlib's ``timeit.Timer`` on torch's benchmark clock (which
    waits for queued GPU work): ``torch.utils.benchmark.Timer.timeit`` adds two or more warm-up calls to every
    measurement, which tripled the cost of rounds of one slow call, and ``blocked_autorange`` re-calibrates every
    round. ``counter``: what the cold call of ``count`` also measures (FLOPs, say; its overhead only lengthens a
    call that is not timed).
    """
    timers, numbers, round_cost, counted = {}, {}, 0.0, None
    for label, fn in fns.items():
        timers[label] = timeit.Timer(fn, timer=synchronized_clock)
        if label == count and cold_call is not None:
            cold, counted = cold_call
        elif label == count and counter is not None:
            results = []
            cold = timed(lambda: results.append(counter(fn)))
            counted = results[0]
        else:
            cold = timed(fn)  # first-call costs (allocation, dispatch caches)
        warm = cold if cold >= 10 * settings.round_seconds else _warm_up(fn, settings.round_seconds)
        numbers[label] = max(1, int(settings.round_seconds / max(warm, 1e-9)))
        round_cost += numbers[label] * warm
    return timers, numbers, round_cost, counted


def rounds_within(settings, round_cost: float) -> int:
    """``settings.repeats`` rounds, fewer where they would cost more than ``settings.cell_seconds`` (None: no cap),
    never none: a cell of slow calls takes one round in each of the run's processes instead of several in one."""
    cap = getattr(settings, "cell_seconds", None)
    if cap is None or round_cost <= 0:
        return settings.repeats
    return max(1, min(settings.repeats, int(cap / round_cost)))


def _warm_up(fn, seconds: float) -> float:
    """Call ``fn`` until ``seconds`` have passed (at least once); the mean seconds per call."""
    calls, started = 0, synchronized_clock()
    while True:
        fn()
        calls += 1
        elapsed = synchronized_clock() - started
        if elapsed >= seconds:
            return elapsed / calls


def rounds(timers: dict[str, timeit.Timer], numbers: dict[str, int], repeats: int) -> dict[str, list[float]]:
    """``repeats`` rounds of every timer, per-call seconds each; the turn order reverses every other round."""
    samples: dict[str, list[float]] = {label: [] for label in timers}
    order = list(timers)
    for index in range(repeats):
        for label in (order if index % 2 == 0 else order[::-1]):
            samples[label].append(timers[label].timeit(numbers[label]) / numbers[label])
    return samples


def measure_cell(fns: dict[str, callable], settings, count: str | None = None, counter=None, cold_call=None):
    """Interleaved rounds of every callable (how many: :func:`rounds_within`); while any callable's spread is over
    the profile's noise threshold, as many rounds again are added with the same calibration (at most
    ``noise_retries`` times; ``settings``: the suite's). Returns the samples, how many times the cell was
    re-measured, and ``count``'s ``counter`` result (None without one; ``cold_call``: see :func:`calibrate`)."""
    timers, numbers, round_cost, counted = calibrate(fns, settings, count, counter, cold_call)
    repeats = rounds_within(settings, round_cost)
    samples = rounds(timers, numbers, repeats)
    retries = 0
    while retries < settings.noise_retries and max(map(relative_spread, samples.values())) > settings.noise_threshold:
        retries += 1
        more = rounds(timers, numbers, repeats)
        samples = {label: samples[label] + more[label] for label in samples}
    return samples, retries, counted


@dataclass(frozen=True)
class Figure:
    """One timed figure from the rounds of one or more processes."""

    value: float  # median of every round of every process
    iqr: float  # interquartile range of those rounds
    low: float  # the interval: every process's median, and at least the pooled rounds' quartiles (never past them
    # into a negative time on a skewed spread)
    high: float
    between: float | None  # (largest - smallest process median) / value; None from a single process
    samples: list[float]  # every round, process after process
    processes: int


def figure(per_process: list[list[float]]) -> Figure:
    """The figure the rounds of several processes give (one list of rounds per process)."""
    per_process = [rounds_ for rounds_ in per_process if rounds_]
    pooled = [value for rounds_ in per_process for value in rounds_]
    q1, value, q3 = _quartile_ends(pooled)
    iqr = q3 - q1
    medians = [statistics.median(rounds_) for rounds_ in per_process]
    between = (max(medians) - min(medians)) / value if len(medians) > 1 and value > 0 else None
    return Figure(value, iqr, min(*medians, q1), max(*medians, q3), between, pooled, len(per_process))


def strays(value: float, low: float, high: float, threshold: float) -> bool:
    """Whether a figure's interval [low, high] reaches farther from the figure than half of ``threshold`` (a
    fraction of it) on either side: a rerun may land that far from what the board shows. A figure in the middle of
    its interval is marked from an interval ``threshold`` wide on; one at an end of it as soon as the other end is
    half that far. Of the 805 figures of three quick runs back to back, 116 landed more than 5% from the median of
    the three; judged by the width of their intervals alone, 46 of those were unmarked on some board, judged so 15
    (``scripts/reproducibility``)."""
    return max(high / value - 1, 1 - low / value) > threshold / 2
