"""Growth with sequence length (log-log fits) and wall-clock reading that covers queued GPU work."""

from __future__ import annotations

import math
import time
from typing import Callable, Sequence

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
