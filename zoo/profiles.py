"""Run profiles: the shapes, lengths, caps and repeat counts each suite uses (``quick`` is the default)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from .contract import OptionError


@dataclass(frozen=True)
class Profile:
    """Settings every suite reads. Figures in the leaderboard are stated with these."""

    name: str
    seed: int = 0
    device: str = "cpu"
    threads: int = 2
    dtype: str = "float32"  # of the complexity and speed suites' tensors (--dtype); correctness tests every dtype
    # correctness: random cases per check, on small shapes
    cases: int = 3
    # complexity (FLOPs, memory): one head of 64, where the additive baseline still fits in memory
    complexity_d_model: int = 64
    complexity_heads: int = 1
    complexity_lengths: tuple[int, ...] = (256, 512, 1024, 2048)
    complexity_modes: tuple[str, ...] = ("full", "causal")
    # speed: batch 1, 8 heads of 64
    speed_batch: int = 1
    speed_d_model: int = 512
    speed_heads: int = 8
    speed_lengths: tuple[int, ...] = (256, 512, 1024)
    speed_modes: tuple[str, ...] = ("full",)
    repeats: int = 5
    round_seconds: float = 0.02
    # the measurement plan (zoo.plan): a length is left out for a callable whose forward+backward call is
    # predicted, from counted FLOPs and memory, to exceed these; no clock decides what is measured
    max_call_gflop: float = 100.0
    max_call_gib: float = 4.0
    # a timed cell whose interquartile range exceeds this fraction of its median is re-measured (up to
    # noise_retries times, adding rounds) and, if still noisy, flagged on the leaderboard
    noise_threshold: float = 0.2
    noise_retries: int = 1
    # last-resort safety net, not a plan: a variant whose one warm call takes longer than this is not
    # timed at larger lengths, and the leaderboard says the safety net fired
    call_limit_seconds: float | None = 30.0  # None: no safety net (the smoke profile, for tests)
    reference_length: int = 1024  # the leaderboard ranks by fwd+bwd x SDPA at this n
    # quality: training budget per task (not among the quick profile's default suites); a task whose counted
    # training FLOPs (one step, counted, times the steps) exceed the cap is skipped before it starts
    quality_steps: int = 300
    quality_recall_steps: int = 600  # the recall-versus-pairs sweep: harder settings need longer training
    quality_seeds: int = 2
    quality_task_max_gflop: float | None = 5000.0  # None: no cap
    # a variant's worker is stopped after this long (--timeout overrides)
    variant_timeout_seconds: float = 900.0
    # variant option defaults for this run (--option KEY=VALUE), applied to variants that have the option
    variant_options: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Profile":
        """Inverse of :meth:`as_dict` after a JSON round trip (lists back to tuples)."""
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in known})

    def with_overrides(self, **changes) -> "Profile":
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})


PROFILES = {
    "quick": Profile(name="quick"),
    "full": Profile(
        name="full",
        cases=8,
        complexity_lengths=(256, 512, 1024, 2048, 4096, 8192, 16384),
        speed_lengths=(256, 512, 1024, 2048, 4096, 8192, 16384),
        speed_modes=("full", "causal"),
        repeats=11,
        round_seconds=0.2,
        max_call_gflop=2500.0,
        max_call_gib=8.0,
        call_limit_seconds=60.0,
        reference_length=4096,
        quality_steps=600,
        quality_recall_steps=1500,  # long enough for softmax attention to learn the 32-pair setting here
        quality_seeds=3,
        quality_task_max_gflop=20000.0,
        variant_timeout_seconds=4 * 3600.0,
    ),
}


# Seconds, not minutes: for tests and for trying a new plugin end to end (figures too coarse to publish).
PROFILES["smoke"] = Profile(
    name="smoke", cases=1, complexity_lengths=(64, 128, 256), threads=1,
    speed_d_model=64, speed_heads=2, speed_lengths=(64, 128, 256), repeats=2, round_seconds=0.005,
    reference_length=256, quality_steps=20, quality_recall_steps=20, quality_seeds=1, quality_task_max_gflop=None,
    call_limit_seconds=None,  # no clock decides anything in a smoke run: tests pass on a busy machine
)


def get_profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise OptionError(f"--profile: unknown profile {name!r} (choose from {', '.join(PROFILES)})") from None
