"""Helpers the second-author checks of the recurrent and sparse built-ins share (tests/plugins/test_*_paper.py):
seeded float64 inputs, a comparison relative to the expected output's scale, gradients of a cotangent, and the
causal forward through the calling contract. The forms themselves stay in each test file: they are the part
written independently of the fast path."""

import torch


def make_inputs(batch, n, d_model, seed, same=False):
    """query, key and value (batch, n, d_model) in float64 from ``seed``; one tensor three times with ``same``."""
    g = torch.Generator().manual_seed(20_000 + seed)
    if same:
        x = torch.randn(batch, n, d_model, generator=g, dtype=torch.float64)
        return x, x, x
    return tuple(torch.randn(batch, n, d_model, generator=g, dtype=torch.float64) for _ in range(3))


def close(got, expected, tol, what, dtype=torch.float64):
    """max |got - expected| <= tol * max(1, max |expected|), ``got`` finite, of ``expected``'s shape and ``dtype``."""
    assert got.shape == expected.shape, (what, tuple(got.shape), tuple(expected.shape))
    assert got.dtype == dtype, (what, got.dtype)
    assert torch.isfinite(got).all(), (what, "non-finite values", got)
    if not got.numel():
        return
    scale = max(1.0, expected.abs().max().item())
    error = (got.double() - expected.double()).abs().max().item()
    assert error <= tol * scale, (f"{what}: max |got - expected| = {error:.3e} > {tol:.0e} * {scale:.3g}"
                                  f"\ngot={got}\nexpected={expected}")


def grads(output, cotangent, tensors):
    """The gradients of (output . cotangent) with respect to ``tensors``, zeros where one does not reach it."""
    if not output.requires_grad:  # e.g. an empty output built fresh: every gradient is zero
        return [torch.zeros_like(t) for t in tensors]
    found = torch.autograd.grad(output, tensors, grad_outputs=cotangent, allow_unused=True)
    return [torch.zeros_like(t) if g is None else g for t, g in zip(tensors, found)]


def causal_forward(module, query, key, value):
    """The module called as the contract calls a causal-only variant."""
    return module(query, key, value, attn_mask=None, is_causal=True)
