"""Growth with sequence length: climbing a ladder of lengths within a time budget, and log-log fits."""

from __future__ import annotations

import math
import time
from typing import Callable, Iterator, Sequence

import torch


def fit_exponent(lengths: Sequence[float], values: Sequence[float], points: int = 3) -> float | None:
    """Least-squares slope of log(value) on log(n) over the largest ``points`` lengths (the asymptote)."""
    pairs = sorted((n, v) for n, v in zip(lengths, values) if n > 0 and v and v > 0)[-points:]
    if len(pairs) < 2:
        return None
    xs = [math.log(n) for n, _ in pairs]
    ys = [math.log(v) for _, v in pairs]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / spread


class Ladder:
    """Per-callable time budget up a ladder of lengths: a callable stops climbing before the length at
    which one call is predicted (growing as n^exponent from its last time) to exceed the budget."""

    def __init__(self, budget_seconds: float, exponent: float = 2.0) -> None:
        self.budget, self.exponent = budget_seconds, exponent
        self.last: dict[str, tuple[int, float]] = {}
        self.skipped: list[int] = []  # lengths climb() left out for its callable

    def climb(self, who: str, lengths: Sequence[int]) -> Iterator[int]:
        """The lengths ``who`` may still be measured at, each judged after the previous one was recorded;
        the others are kept in ``skipped``."""
        for n in lengths:
            if self.allows(who, n):
                yield n
            else:
                self.skipped.append(n)

    def skipped_note(self, verb: str) -> str:
        """'n=4096, 8192 not <verb>: predicted over the 5 s per-call budget'."""
        lengths = ", ".join(map(str, self.skipped))
        return f"n={lengths} not {verb}: predicted over the {self.budget:g} s per-call budget"

    def allows(self, who: str, n: int) -> bool:
        if who not in self.last:
            return True
        last_n, seconds = self.last[who]
        return seconds * (n / last_n) ** self.exponent <= self.budget

    def record(self, who: str, n: int, seconds: float) -> None:
        self.last[who] = (n, seconds)


def synchronize() -> None:
    """Wait for the GPU's queued work (a no-op until CUDA is in use), so a wall-clock reading covers
    the kernels a call launched and not just their launch."""
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()


def timed(fn: Callable[[], object]) -> float:
    """Wall-clock seconds of one call of ``fn``, queued GPU work included."""
    synchronize()
    start = time.perf_counter()
    fn()
    synchronize()
    return time.perf_counter() - start
