"""Callables the complexity and speed suites measure: the variant, torch SDPA on the same shapes, and
the variant's baselines, each as a forward (no grad) and a forward+backward step on shared inputs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from .api import build
from .contract import Variant

SDPA = "torch-sdpa"


@dataclass
class Workload:
    forward: Callable[[], object]
    train_step: Callable[[], None]


def modes_for(variant: Variant, modes: tuple[str, ...]) -> list[str]:
    """The profile's attention modes the variant can run: 'causal' only where it supports it."""
    return [m for m in modes if m == "full" or variant.tags.supports_causal]


def _workload(call: Callable[[], torch.Tensor], grad_out: torch.Tensor, leaves: list[torch.Tensor]) -> Workload:
    def forward():
        with torch.no_grad():
            return call()

    def train_step():
        for leaf in leaves:
            leaf.grad = None
        call().backward(grad_out)

    return Workload(forward, train_step)


def self_attention_workloads(variant: Variant, *, batch: int, d_model: int, heads: int, n: int, causal: bool,
                             seed: int, device: str = "cpu", dtype: str = "float32",
                             baselines: bool = True) -> dict[str, Workload]:
    """Self-attention on one (batch, n, d_model) input of ``dtype``: the variant (under its own name),
    ``torch-sdpa`` on the same (batch, heads, n, d_model / heads) shapes, and each baseline."""
    torch.manual_seed(seed)
    dtype = getattr(torch, dtype)
    module = build(variant, d_model=d_model, num_heads=heads).to(device=device, dtype=dtype)
    x = torch.randn(batch, n, d_model, device=device, dtype=dtype, requires_grad=True)
    grad_out = torch.randn(batch, n, d_model, device=device, dtype=dtype)
    params = [p for p in module.parameters() if p.requires_grad]
    loads = {variant.name: _workload(lambda: module(x, x, x, is_causal=causal), grad_out, [x, *params])}

    heads_in = torch.randn(batch, heads, n, d_model // heads, device=device, dtype=dtype, requires_grad=True)
    heads_grad = torch.randn_like(heads_in)
    loads[SDPA] = _workload(lambda: F.scaled_dot_product_attention(heads_in, heads_in, heads_in, is_causal=causal),
                            heads_grad, [heads_in])
    if baselines:
        for label, make in variant.baselines.items():
            fn = make(module)
            loads[label] = _workload(lambda fn=fn: fn(x, x, x, is_causal=causal), grad_out, [x, *params])
    return loads
