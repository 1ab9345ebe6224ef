"""FLOP counting (with the fused CPU attention formulas) and deterministic peak memory."""

import torch
import torch.nn.functional as F

from zoo.measure import count_flops, peak_memory


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


def test_a_view_of_a_tensor_given_to_the_call_costs_nothing():
    """Slicing a parameter or an input allocates nothing; a copy of the slice does."""
    import torch

    from zoo.measure import peak_memory

    big = torch.zeros(1024, 1024)
    assert peak_memory(lambda: big[:, :16].unbind(0)) == 0
    assert peak_memory(lambda: big[:, :16].contiguous()) == 1024 * 16 * 4


def test_flops_and_peak_memory_in_one_pass_equal_each_counter_alone():
    from zoo.measure import flops_and_peak_memory

    q = torch.randn(2, 4, 96, 16, requires_grad=True)

    def step():
        (torch.softmax(q @ q.transpose(-1, -2), -1) @ q).sum().backward()

    assert flops_and_peak_memory(step) == (count_flops(step), peak_memory(step))
