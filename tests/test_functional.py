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



@pytest.mark.parametrize("q_len, k_len", [(5, 7), (6, 6), (1, 9), (0, 4), (3, 0), (0, 0)])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("mask_kind", [None, "some", "a row with no key", "float"])
@pytest.mark.parametrize("device_path", ["cpu", "one more key"])
def test_attention_with_a_sink_is_the_sink_column_softmax_with_its_gradients(monkeypatch, q_len, k_len, is_causal,
                                                                            mask_kind, device_path):
    from zoo import functional
    from zoo.functional import causal_mask, sdpa_with_sink, softmax_with_sink

    if device_path == "one more key":  # the path every device but the CPU takes
        monkeypatch.setattr(functional, "LOGSUMEXP_DEVICES", ())
    generator = torch.Generator().manual_seed(q_len * 100 + k_len)
    q, k, v = (torch.randn(2, 3, n, 4, dtype=torch.float64, generator=generator, requires_grad=True)
               for n in (q_len, k_len, k_len))
    sink = (2 * torch.randn(3, dtype=torch.float64, generator=generator)).requires_grad_()
    mask = None if mask_kind is None else torch.rand(2, 1, q_len, k_len, generator=generator) > 0.3
    if mask_kind == "a row with no key" and q_len:
        mask[1, :, 0] = False
    bias = torch.randn(2, 1, q_len, k_len, dtype=torch.float64, generator=generator) if mask_kind == "float" else 0.0
    given = torch.where(mask, bias, float("-inf")) if mask_kind == "float" else mask  # additive: -inf where masked
    allowed = mask if not is_causal else causal_mask(q_len, k_len) if mask is None else mask & causal_mask(q_len, k_len)
    scores = q @ k.transpose(-1, -2) / 4 ** 0.5 + bias  # the definition: the sink as one more column of the softmax
    expected = softmax_with_sink(scores if allowed is None else scores.masked_fill(~allowed, float("-inf")), sink) @ v
    out = sdpa_with_sink(q, k, v, sink, given, is_causal)
    assert torch.allclose(out, expected, atol=1e-12)
    with torch.no_grad():  # a decode step's path: no graph kept
        assert torch.allclose(sdpa_with_sink(q, k, v, sink, given, is_causal), expected, atol=1e-12)
    if mask_kind == "a row with no key" and q_len:
        assert torch.equal(out[1, :, 0], torch.zeros_like(out[1, :, 0]))
    cotangent = torch.randn(out.shape, dtype=torch.float64, generator=generator)
    grads = torch.autograd.grad(out, (q, k, v, sink), cotangent)
    wanted = torch.autograd.grad(expected, (q, k, v, sink), cotangent)
    for name, mine, theirs in zip(("q", "k", "v", "sink"), grads, wanted):
        assert torch.isfinite(mine).all() and torch.allclose(mine, theirs, atol=1e-10), name


def test_attention_with_a_sink_treats_a_nan_as_torchs_sdpa_keeps_a_float_masks_gradient_and_wider_values():
    from zoo.functional import sdpa_with_sink, softmax_with_sink

    generator = torch.Generator().manual_seed(7)
    q, k = (torch.randn(1, 2, n, 4, dtype=torch.float64, generator=generator) for n in (3, 5))
    sink = torch.randn(2, dtype=torch.float64, generator=generator)
    poisoned = q.clone()
    poisoned[0, 1, 2, 0] = float("nan")
    out = sdpa_with_sink(poisoned, k, k, sink)
    # a NaN where torch's SDPA keeps one, and only there: its fused CPU kernel gives NaN for a NaN query row with
    # AVX2 and zeros with AVX-512 (seen on an Intel Xeon), so the sink's answer is checked against this machine's
    keeps = F.scaled_dot_product_attention(poisoned, k, k).isnan()
    assert torch.equal(out.isnan(), keeps) and not keeps[0, 0].any() and not keeps[0, 1, :2].any()  # other rows clean
    assert out[0, 1, 2].isnan().all() or torch.equal(out[0, 1, 2], torch.zeros(4, dtype=out.dtype))  # never garbage
    bias = torch.randn(1, 2, 3, 1, dtype=torch.float64, generator=generator, requires_grad=True)  # a column to broadcast
    wide = torch.randn(1, 2, 5, 6, dtype=torch.float64, generator=generator)  # values wider than queries and keys
    for values in (k, wide):
        out = sdpa_with_sink(q, k, values, sink, bias)
        expected = softmax_with_sink(q @ k.transpose(-1, -2) / 2.0 + bias, sink) @ values
        assert torch.allclose(out, expected, atol=1e-12)
        (mine,), (theirs,) = (torch.autograd.grad(x.sum(), bias) for x in (out, expected))
        assert torch.allclose(mine, theirs, atol=1e-12)  # the mask's own gradient, not a silent None


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("q_len, k_len", [(5, 5), (5, 9), (9, 5)])
def test_torch_mha_takes_sdpas_causal_kernel_for_a_causal_call_and_the_mask_for_any_other(monkeypatch, need_weights,
                                                                                          q_len, k_len):
    """nn.MultiheadAttention handed only the causal mask runs masked SDPA over the full square; told
    ``is_causal`` as well it runs SDPA's causal kernel. A comparator a user would write takes the causal one."""
    from zoo.functional import call_torch_mha

    calls = []
    real = F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **kwargs):
        calls.append((attn_mask is not None, is_causal))
        return real(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(16, 2, batch_first=True, dtype=torch.float64)
    q = torch.randn(2, q_len, 16, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, k_len, 16, dtype=torch.float64, requires_grad=True)
    padding = torch.arange(k_len) != 3
    causal = call_torch_mha(mha, q, k, k, is_causal=True, need_weights=need_weights)
    both = call_torch_mha(mha, q, k, k, attn_mask=padding, is_causal=True, need_weights=need_weights)
    # need_weights builds the weights itself, with the mask, and calls no SDPA
    assert calls == ([] if need_weights else [(False, True), (True, False)])
    lower = torch.ones(q_len, k_len, dtype=torch.bool).tril()  # aligned top-left, as SDPA's is_causal
    assert torch.allclose(causal, mha(q, k, k, attn_mask=~lower, need_weights=False)[0])
    assert torch.allclose(both, mha(q, k, k, attn_mask=~(lower & padding), need_weights=False)[0])
