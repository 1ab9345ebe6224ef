"""Exponent fits; wall-clock timing covers queued GPU work (the clock is read only after
the device has finished)."""

import torch

from zoo.scaling import fit_exponent, timed


def test_fit_exponent_reads_the_slope_of_the_largest_lengths():
    assert abs(fit_exponent([64, 128, 256, 512], [1e9, 4e3 * 128 ** 2, 4e3 * 256 ** 2, 4e3 * 512 ** 2]) - 2) < 1e-9
    assert fit_exponent([64], [1.0]) is None


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
