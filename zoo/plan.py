"""The measurement plan: which callables are measured at which lengths, decided before any timing.

The rule is the same for every variant and every callable it is compared with, and it reads no
clock, so the machine's load cannot change which figures exist. Each callable's FLOPs, peak live
tensor memory and dispatched ops for one forward+backward call are counted (deterministic counters) at
the two smallest lengths (the second only where the first does not already bound it within the caps);
a log-log line through them (for the variant, at least as steep as its claimed exponents) predicts
FLOPs and memory at every length, and ops grow in proportion to the length. Ops are
what a loop in Python over tokens costs: a token-by-token recurrence does few FLOPs, yet at n = 16384 one
forward+backward of one took minutes. Then:

- the variant is measured at every length where its prediction is within the profile's caps
  (``max_call_gflop``, ``max_call_gib``, ``max_call_ops``);
- the callable it is ranked against (torch SDPA, or nn.MultiheadAttention for a layer) is measured at
  every length the variant is, whatever its cost: a figure is never shown without its comparison;
- each of the variant's own baselines and floors is measured where the variant is and its own
  prediction is within the caps.

Every length left out gets a reason, which the leaderboard shows.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable, Mapping

from .checks import SKIPPED, Result
from .contract import Variant
from .environment import run_shared
from .measure import TooManyOps, TooMuchMemory, call_counts
from .workload import Workload


@dataclass(frozen=True)
class Cost:
    """Predicted cost of one forward+backward call; ``uncounted``: why it could not be counted (then it is not
    measured)."""

    flops: float
    bytes: float
    ops: float = 0.0
    uncounted: str | None = None


@dataclass
class Plan:
    """Per callable, the lengths it is measured at and, for each one left out, why."""

    lengths: dict[str, list[int]] = field(default_factory=dict)
    left_out: dict[str, dict[int, str]] = field(default_factory=dict)

    def at(self, n: int) -> set[str]:
        """The callables planned at length ``n``."""
        return {who for who, lengths in self.lengths.items() if n in lengths}


def _counted(load: Workload, max_ops: float | None, max_bytes: float | None = None) -> Cost:
    """The cost of one forward+backward call (a floor's forward: it has no backward pass);
    :class:`~zoo.measure.TooManyOps` once it dispatches more than ``max_ops``, :class:`~zoo.measure.TooMuchMemory`
    once its live tensors take more than ``max_bytes``."""
    flops, peak, ops = call_counts(load.train_step or load.forward, max_ops, max_bytes)
    return Cost(flops=float(flops), bytes=float(peak), ops=float(ops))


def extrapolate(n: int, points: list[tuple[int, float]], floor: float = 0.0) -> float:
    """The log-log line through the counted points, at ``n`` (exact at a counted length), its slope at
    least ``floor``: small lengths understate a quadratic cost next to linear projections."""
    for counted_n, value in points:
        if counted_n == n:
            return value
    (n0, v0), (n1, v1) = points[0], points[-1]
    if v0 <= 0 or v1 <= 0 or n0 == n1:
        return v1
    slope = min(max(loglog_slope(points[0], points[-1]), floor, 0.0), 4.0)
    return v1 * (n / n1) ** slope


def in_proportion(n: int, points: list[tuple[int, float]]) -> float:
    """The count at ``n`` (exact at a counted length), else in proportion to the length from the longest counted:
    how dispatched ops grow, a loop over tokens or chunks dispatching a fixed number per step. What a call does
    once (a pattern built in Python and cached) is counted at the smallest lengths, where it can be most of a
    call's few ops: a log-log line through it would predict a fused call growing as fast as a loop."""
    for counted_n, value in points:
        if counted_n == n:
            return value
    longest, value = points[-1]
    return value * n / longest


def loglog_slope(first: tuple[int, float], last: tuple[int, float]) -> float:
    """How fast a cost grows between two counted (length, cost) points: the log-log slope (infinite where the
    first counted nothing, or the lengths are the same)."""
    (n0, v0), (n1, v1) = first, last
    return math.log(v1 / v0) / math.log(n1 / n0) if v0 > 0 and v1 > 0 and n0 != n1 else math.inf


def out_of_memory(exc: BaseException) -> bool:
    """An allocation failed: the machine (or the worker's memory cap) cannot hold what was asked."""
    return isinstance(exc, MemoryError) or (isinstance(exc, RuntimeError) and (
        "can't allocate memory" in str(exc) or "out of memory" in str(exc)))


GROWTH_BOUND = 2.0
"""The steepest log-log slope of an attention callable's FLOPs and memory in the length (every query against every
key); its ops grow at most in proportion (a loop over tokens)."""


def bounded(n: int, counted_n: int, cost: Cost, least: tuple[float, float] = (0, 0)) -> Cost:
    """What ``cost``, counted at ``counted_n``, grows to at ``n`` at most (:data:`GROWTH_BOUND`, or the claimed
    exponents ``least`` where steeper)."""
    scale = n / counted_n
    return Cost(cost.flops * scale ** max(GROWTH_BOUND, least[0]), cost.bytes * scale ** max(GROWTH_BOUND, least[1]),
                cost.ops * scale)


def predict_costs(loads_at: Callable[[int], Mapping[str, Workload]], lengths: Iterable[int],
                  claims: Mapping[str, tuple[float, float]] = {}, max_ops: float | None = None,
                  fits: Callable[[Cost], bool] | None = None, max_bytes: float | None = None,
                  ) -> dict[str, dict[int, Cost]]:
    """Every callable's counted cost at the (up to) two smallest lengths, extrapolated to all of them;
    ``claims`` gives a callable's claimed (time, memory) exponents, used as the least slopes. A callable whose
    counting call runs out of memory is uncounted from that length on (the others are counted as usual). One
    whose ops at the smallest length already predict more than ``max_ops`` at the second is not counted there:
    it is left out there anyway, and that count was the longest call of a plan (a token-by-token recurrence); one
    that dispatches more than ``max_ops`` in a count, or whose live tensors take more than ``max_bytes`` (materialising
    an n x n x d tensor, say: counting one to its end took seconds), is stopped there, and left out from that length
    on. One whose
    smallest count, grown as fast as attention's costs grow (:func:`bounded`), ``fits`` the caps at every length is
    not counted again: where the bound holds, its second count could not leave any length out (a test holds the
    built-ins' plans to those made counting twice). At the quick profile's two lengths that spares most callables
    their second count, the dearer one."""
    lengths = sorted(lengths)
    counted: dict[str, list[tuple[int, Cost]]] = {}
    failed: dict[str, tuple[int, str]] = {}
    fitting: set[str] = set()  # counted once: within the caps wherever it grows to
    for n in lengths[:2]:
        for who, load in loads_at(n).items():
            counted.setdefault(who, [])
            if who in failed or (max_ops is not None and counted[who]
                                 and in_proportion(n, [(m, c.ops) for m, c in counted[who]]) > max_ops):
                continue
            if fits is not None and counted[who] and all(
                    fits(bounded(m, *counted[who][0], claims.get(who, (0, 0)))) for m in lengths):
                fitting.add(who)
                continue
            try:
                counted[who].append((n, _counted(load, max_ops, max_bytes)))
            except TooManyOps as exc:
                failed[who] = (n, f"{exc} at n={n} (a loop in Python): the profile's cap")
            except TooMuchMemory as exc:
                failed[who] = (n, f"{exc} at n={n}: the profile's cap")
            except (MemoryError, RuntimeError) as exc:
                if not out_of_memory(exc):
                    raise
                failed[who] = (n, f"one call at n={n} ran out of memory while its cost was counted (the worker's "
                                  "memory cap)")

    def cost(who, points, n):
        if who in failed and n >= failed[who][0]:
            return Cost(math.inf, math.inf, math.inf, failed[who][1])
        least = claims.get(who, (0, 0))
        if who in fitting:
            return bounded(n, *points[0], least)
        return Cost(extrapolate(n, [(m, c.flops) for m, c in points], least[0]),
                    extrapolate(n, [(m, c.bytes) for m, c in points], least[1]),
                    in_proportion(n, [(m, c.ops) for m, c in points]))

    return {who: {n: cost(who, points, n) for n in lengths} for who, points in counted.items()}


def over_caps(cost: Cost, max_gflop: float, max_gib: float, max_ops: float | None = None) -> str | None:
    """Why a call of this predicted cost is not planned, or None if it fits (``max_ops`` None: no cap on ops)."""
    if cost.uncounted:
        return cost.uncounted
    if cost.flops > max_gflop * 1e9:
        return f"predicted {cost.flops / 1e9:.3g} GFLOP per call, over the profile's cap of {max_gflop:g}"
    if cost.bytes > max_gib * 2 ** 30:
        return f"predicted {cost.bytes / 2 ** 30:.3g} GiB per call, over the profile's cap of {max_gib:g} GiB"
    if max_ops is not None and cost.ops > max_ops:
        return (f"predicted {cost.ops:.3g} ops dispatched per call (a loop in Python), over the profile's cap of "
                f"{max_ops:g}")
    return None


def plan_lengths(loads_at: Callable[[int], Mapping[str, Workload]], lengths: Iterable[int], variant: Variant,
                 comparators: set[str], max_gflop: float, max_gib: float, max_ops: float | None = None) -> Plan:
    """The plan for one variant and its comparators and baselines (see the module's docstring)."""
    lengths = sorted(set(lengths))
    costs = predict_costs(loads_at, lengths, {variant.name: (variant.complexity.time, variant.complexity.memory)},
                          max_ops, lambda cost: over_caps(cost, max_gflop, max_gib, max_ops) is None, max_gib * 2 ** 30)
    plan = Plan()
    for who in costs:
        plan.lengths[who], plan.left_out[who] = [], {}
    for n in lengths:
        reason = over_caps(costs[variant.name][n], max_gflop, max_gib, max_ops)
        for who in costs:
            why = reason and f"variant not measured here: {reason}"
            if why is None and who != variant.name and who not in comparators:
                why = over_caps(costs[who][n], max_gflop, max_gib, max_ops)
            if why is None:
                plan.lengths[who].append(n)
            else:
                plan.left_out[who][n] = why
    return plan


def shared(key: str, make: Callable[[], Plan]) -> Plan:
    """The plan ``key`` names, made once in a run (:func:`zoo.environment.run_shared`): a plan is counted, never
    timed, so every process would make the same one, and a timing check repeated in fresh processes counts its
    plan once."""
    return run_shared(f"plan|{key}", lambda: asdict(make()), lambda data: Plan(
        {who: list(lengths) for who, lengths in data["lengths"].items()},
        {who: {int(n): why for n, why in reasons.items()} for who, reasons in data["left_out"].items()}))


def plan_rows(plan, variant_name: str, mode: str, verb: str):
    """One skipped row per (callable, length) the plan left out, with the reason (for the board)."""
    for who, left_out in plan.left_out.items():
        for n, reason in sorted(left_out.items()):
            yield Result("plan", SKIPPED, f"{mode} n={n}", detail=f"not {verb}: {reason}", n=n, mode=mode,
                         versus="" if who == variant_name else who)
