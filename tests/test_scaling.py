"""Ladders and exponent fits; wall-clock timing covers queued GPU work (the clock is read only after
the device has finished)."""

import torch

from zoo.scaling import Ladder, fit_exponent, timed


def test_fit_exponent_reads_the_slope_of_the_largest_lengths():
    assert abs(fit_exponent([64, 128, 256, 512], [1e9, 4e3 * 128 ** 2, 4e3 * 256 ** 2, 4e3 * 512 ** 2]) - 2) < 1e-9
    assert fit_exponent([64], [1.0]) is None


def test_ladder_stops_a_callable_before_its_predicted_time_exceeds_the_budget():
    ladder = Ladder(budget_seconds=1.0, exponent=2)
    ladder.record("slow", 256, 0.3)
    ladder.record("fast", 256, 0.01)
    assert not ladder.allows("slow", 512) and ladder.allows("fast", 512) and ladder.allows("new", 4096)


def test_timed_waits_for_the_gpu_before_each_clock_reading(monkeypatch):
    events = []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: events.append("synchronize"))
    timed(lambda: events.append("call"))
    assert events == ["synchronize", "call", "synchronize"]


def test_timed_without_cuda_in_use_just_reads_the_clock(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: (_ for _ in ()).throw(AssertionError("synchronized")))
    assert timed(lambda: sum(range(1000))) >= 0


def test_climb_stops_at_the_budget_and_names_the_lengths_it_left_out():
    ladder = Ladder(budget_seconds=1.0, exponent=2)
    climbed = []
    for n in ladder.climb("slow", [256, 512, 1024, 2048]):
        climbed.append(n)
        ladder.record("slow", n, 0.3 if n == 256 else 10.0)  # judged after each record
    assert climbed == [256] and ladder.skipped == [512, 1024, 2048]
    assert ladder.skipped_note("timed") == "n=512, 1024, 2048 not timed: predicted over the 1 s per-call budget"
