"""FLOP counting (with the fused CPU attention formulas) and deterministic peak memory."""

import torch
import torch.nn.functional as F

from zoo.measure import count_flops, peak_memory
from zoo.scaling import Ladder, fit_exponent


def test_fused_cpu_sdpa_is_counted_not_zero():
    q = torch.randn(1, 2, 128, 32)
    assert count_flops(lambda: F.scaled_dot_product_attention(q, q, q)) == 4 * 2 * 128 * 128 * 32


def test_fused_cpu_sdpa_backward_is_counted():
    q = torch.randn(1, 2, 64, 16, requires_grad=True)
    forward = count_flops(lambda: F.scaled_dot_product_attention(q, q, q))
    both = count_flops(lambda: F.scaled_dot_product_attention(q, q, q).sum().backward())
    assert both == forward * 3.5  # torch's backward formula: 5 matmuls against 2


def test_peak_memory_is_deterministic_and_grows_like_the_score_matrix():
    def naive(n):
        q = torch.randn(1, 1, n, 32)
        return peak_memory(lambda: torch.softmax(q @ q.transpose(-1, -2), -1) @ q)

    assert naive(256) == naive(256)
    assert 3.5 < naive(1024) / naive(512) <= 4.1


def test_fit_exponent_reads_the_slope_of_the_largest_lengths():
    assert abs(fit_exponent([64, 128, 256, 512], [1e9, 4e3 * 128 ** 2, 4e3 * 256 ** 2, 4e3 * 512 ** 2]) - 2) < 1e-9
    assert fit_exponent([64], [1.0]) is None


def test_ladder_stops_a_callable_before_its_predicted_time_exceeds_the_budget():
    ladder = Ladder(budget_seconds=1.0, exponent=2)
    ladder.record("slow", 256, 0.3)
    ladder.record("fast", 256, 0.01)
    assert not ladder.allows("slow", 512) and ladder.allows("fast", 512) and ladder.allows("new", 4096)
