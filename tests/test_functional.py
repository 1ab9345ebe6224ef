"""The shared helpers plugins build on: masked SDPA gives zeros (and finite gradients) for rows that may
attend to nothing, and always hands torch SDPA a 4-D mask its fused kernels take."""

import pytest
import torch
import torch.nn.functional as F

from zoo.functional import sdpa_zeroing_empty_rows
from zoo.reference import softmax_attention


def _spy(monkeypatch):
    seen = []
    real = F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kwargs):
        seen.append(None if attn_mask is None else tuple(attn_mask.shape))
        return real(q, k, v, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    return seen


def test_empty_rows_are_zero_with_finite_gradients_and_other_rows_match_the_reference(monkeypatch):
    seen = _spy(monkeypatch)
    torch.manual_seed(0)
    q = torch.randn(2, 3, 5, 4, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(2, 3, 6, 4, dtype=torch.float64, requires_grad=True) for _ in range(2))
    mask = torch.rand(3, 5, 6) > 0.4  # (heads, rows, keys): 3-D and unbroadcast over the batch
    mask[1, 2] = False
    out = sdpa_zeroing_empty_rows(q, k, v, mask)
    out.sum().backward()
    assert seen == [(1, 3, 5, 6)]
    empty = ~mask.any(-1)
    assert empty[1, 2] and (out[:, empty] == 0).all()
    expected = softmax_attention(q.detach(), k.detach(), v.detach(), mask)
    assert torch.allclose(out[:, ~empty], expected[:, ~empty])
    assert all(torch.isfinite(x.grad).all() for x in (q, k, v))


def test_windowed_and_block_sparse_edges_hand_sdpa_4d_masks(monkeypatch):
    import zoo

    x = torch.randn(1, 200, 16)
    for name, options in (("windowed", {"window": 8, "block": 16}), ("block-sparse", {"block": 16})):
        seen = _spy(monkeypatch)
        module = zoo.create(name, d_model=16, num_heads=2, **options)
        module(x, x, x, attn_mask=torch.rand(200, 200) > 0.2, is_causal=True)
        masks = [shape for shape in seen if shape is not None]
        assert masks and all(len(shape) == 4 for shape in masks), (name, seen)
        monkeypatch.undo()


@pytest.mark.parametrize("n, window, key_heads", [(1, 3, 1), (7, 3, 1), (13, 4, 3), (16, 4, 1), (5, 8, 1)])
def test_sliding_window_attention_is_softmax_over_the_band_with_shared_or_own_key_heads(n, window, key_heads):
    """Blocked and padded as it is, it equals softmax over 0 <= i - j <= window in float64; keys of one head serve
    every query head (the heads folded into rows) as they would repeated per head."""
    from zoo.functional import sliding_window_attention

    torch.manual_seed(n * 10 + window)
    q = torch.randn(2, 3, n, 4, dtype=torch.float64)
    k, v = (torch.randn(2, key_heads, n, 4, dtype=torch.float64) for _ in range(2))
    i, j = torch.arange(n).view(n, 1), torch.arange(n).view(1, n)
    band = (i - j >= 0) & (i - j <= window)
    expected = softmax_attention(q, k.expand(2, 3, n, 4), v.expand(2, 3, n, 4), band)
    assert torch.allclose(sliding_window_attention(q, k, v, window), expected, atol=1e-12)
