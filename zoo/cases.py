"""Random inputs for the suites, shaped by what a variant's tags allow."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from .api import build
from .contract import Variant


@dataclass
class Case:
    """One call: sizes, mode and options; :meth:`inputs` makes the tensors from a seed."""

    batch: int = 2
    q_len: int = 9
    k_len: int = 9
    d_model: int = 16
    num_heads: int = 2
    kdim: int | None = None
    vdim: int | None = None
    causal: bool = False
    mask: str | None = None  # None, "random" (every row keeps a key), "padding", "empty-rows", "key-1d" (k_len,)
    options: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        """The case as a row's setting ('batch=2 q_len=9 ...')."""
        parts = [f"batch={self.batch}", f"q_len={self.q_len}", f"k_len={self.k_len}",
                 f"d_model={self.d_model}", f"heads={self.num_heads}"]
        if self.kdim or self.vdim:
            parts.append(f"kdim={self.kdim or self.d_model} vdim={self.vdim or self.d_model}")
        if self.causal:
            parts.append("causal")
        if self.mask:
            parts.append(f"mask={self.mask}")
        return " ".join(parts)

    def params(self) -> dict[str, Any]:
        """The case's shape and mode as a row's ``params`` (what ``zoo.testing`` orders failures by)."""
        shape = {"batch": self.batch, "q_len": self.q_len, "k_len": self.k_len, "d_model": self.d_model,
                 "heads": self.num_heads, "causal": self.causal}
        extra = {"kdim": self.kdim, "vdim": self.vdim, "mask": self.mask}
        return {**shape, **{k: v for k, v in extra.items() if v is not None}}

    def build(self, variant: Variant, dtype=torch.float64, device="cpu"):
        """The variant's module for this case, in ``dtype`` on ``device``."""
        options = dict(self.options)
        if self.kdim or self.vdim:
            options.update(kdim=self.kdim, vdim=self.vdim)
        module = build(variant, d_model=self.d_model, num_heads=self.num_heads, **options)
        return module.to(device=device, dtype=dtype)

    def inputs(self, seed: int, dtype=torch.float64, device="cpu", scale: float = 1.0):
        """(query, key, value, mask) drawn from ``seed``."""
        generator = torch.Generator().manual_seed(seed)

        def randn(*shape):
            return (torch.randn(*shape, generator=generator, dtype=torch.float64) * scale).to(device, dtype)

        query = randn(self.batch, self.q_len, self.d_model)
        key = randn(self.batch, self.k_len, self.kdim or self.d_model)
        value = randn(self.batch, self.k_len, self.vdim or self.d_model)
        return query, key, value, self.make_mask(generator, device)

    def make_mask(self, generator: torch.Generator, device="cpu"):
        """The case's boolean mask (True = may attend), or None."""
        shape = (self.batch, 1, self.q_len, self.k_len)
        if self.mask is None:
            return None
        if self.mask in ("padding", "key-1d"):
            keep = torch.rand(self.batch, 1, 1, self.k_len, generator=generator) > 0.3
            keep[..., 0] = True
            return (keep[0, 0, 0] if self.mask == "key-1d" else keep).to(device)  # key-1d: shape (k_len,)
        mask = torch.rand(*shape, generator=generator) > 0.4
        rows = torch.arange(self.q_len).clamp(max=self.k_len - 1)
        mask[..., torch.arange(self.q_len), rows] = True  # every row keeps one key (causal-safe)
        if self.mask == "empty-rows":
            mask[:, :, ::3] = False
        return mask.to(device)


def cases_for(variant: Variant) -> list[Case]:
    """A spread of small shapes and modes within the variant's capabilities, with its check options."""
    tags = variant.tags
    cases = [Case(batch=2, q_len=9, k_len=9)]
    if tags.allows_different_lengths:
        cases += [Case(batch=1, q_len=5, k_len=12), Case(batch=2, q_len=13, k_len=6)]
    if tags.supports_causal:
        cases.append(Case(q_len=11, k_len=11, causal=True))
    if tags.accepts_attn_mask:
        cases += [Case(q_len=10, k_len=10, mask="random"), Case(q_len=10, k_len=10, mask="padding"),
                  Case(q_len=10, k_len=10, mask="empty-rows"), Case(q_len=10, k_len=10, mask="key-1d")]
        if tags.supports_causal:
            cases.append(Case(q_len=12, k_len=12, causal=True, mask="random"))
    if tags.allows_kv_dims:
        cases.append(Case(q_len=7, k_len=8 if tags.allows_different_lengths else 7, kdim=12, vdim=20))
    cases += [Case(batch=1, q_len=n, k_len=n, num_heads=h, d_model=8 * h) for n, h in ((1, 1), (33, 4))]
    for case in cases:
        case.options = dict(variant.check_options)
    return cases


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max |actual - expected| / max(max |expected|, 1e-30), in float64."""
    actual, expected = actual.detach().double(), expected.detach().double()  # a number: no graph
    return float((actual - expected).abs().max() / expected.abs().max().clamp_min(1e-30))
