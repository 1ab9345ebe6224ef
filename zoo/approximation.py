"""How far an approximation is from the function it approximates, on inputs where attention matters.

Relative error against softmax on Gaussian inputs says little: an all-zero output scores exactly 1, and
since softmax attention there is close to the mean of the values, returning that mean scores well below
1 while having learnt nothing. Here the error is *normalised by the trivial answer*:

    error = ||out - target|| / ||trivial - target||,   trivial = each query's mean of the values it may see

so 0 is exact and 1 is no better than ignoring the queries and keys altogether. Inputs are built so that
attention is meaningful: queries and keys of a fixed length scaled so that the attention logits are
``beta * cos(q, k)``, drawn at random, from a low-rank subspace, or around a few cluster centres.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from .contract import SOFTMAX

TRIVIAL_LEVEL = 0.98
"""An approximation whose mean normalised error on the easy inputs reaches this is no better than the
trivial answer (which scores 1.0 by construction; the margin absorbs sampling noise)."""


@dataclass(frozen=True)
class Inputs:
    """One family of test inputs: ``kind`` (gaussian, low-rank, clustered) at logit scale ``beta``."""

    kind: str
    beta: float
    easy: bool  # the gate's inputs: structure any approximation of softmax should capture

    @property
    def label(self) -> str:
        """The family's name as the board shows it."""
        return f"{self.kind} beta={self.beta:g}"


INPUTS = (
    Inputs("gaussian", 1, easy=False),
    Inputs("gaussian", 4, easy=False),
    Inputs("low-rank", 4, easy=True),
    Inputs("clustered", 4, easy=True),
    Inputs("clustered", 16, easy=False),
)
RANK, CLUSTERS, CLUSTER_NOISE = 2, 8, 0.3


def make_inputs(inputs: Inputs, batch: int, n: int, d_model: int, num_heads: int,
                generator: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
    """(query, key, value), each (batch, n, d_model), whose per-head logits q.k/sqrt(d_head) are
    ``beta * cos(q, k)``."""
    d_head = d_model // num_heads

    def randn(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    shape = (batch, num_heads, n, d_head)
    if inputs.kind == "gaussian":
        q, k = randn(*shape), randn(*shape)
    elif inputs.kind == "low-rank":
        basis = randn(batch, num_heads, RANK, d_head)
        q, k = randn(batch, num_heads, n, RANK) @ basis, randn(batch, num_heads, n, RANK) @ basis
    elif inputs.kind == "clustered":
        centres = randn(batch, num_heads, CLUSTERS, d_head)

        def around(count):
            which = torch.randint(CLUSTERS, (batch, num_heads, count), generator=generator)
            picked = torch.gather(centres, 2, which.unsqueeze(-1).expand(-1, -1, -1, d_head))
            return picked + CLUSTER_NOISE * randn(batch, num_heads, count, d_head)

        q, k = around(n), around(n)
    else:
        raise ValueError(f"unknown input kind {inputs.kind!r}")
    norm = math.sqrt(inputs.beta * math.sqrt(d_head))  # |q| |k| / sqrt(d_head) = beta
    q, k = (x / x.norm(dim=-1, keepdim=True) * norm for x in (q, k))
    v = randn(*shape)
    return tuple(x.transpose(1, 2).flatten(2).float() for x in (q, k, v))


def split(x: Tensor, num_heads: int) -> Tensor:
    """Heads of a (batch, n, d_model) tensor: (batch, heads, n, d_head)."""
    return x.double().unflatten(-1, (num_heads, -1)).transpose(1, 2)


def softmax_target(query, key, value, num_heads: int, is_causal: bool, chunk_elements: int = 2 ** 25) -> Tensor:
    """Softmax attention in float64, a block of queries at a time (n x n at n=16384 would not fit), every
    block's scores in one reused buffer and written straight into one output: under the pinned allocator
    (no mmap, no trim) a fresh block-sized temporary per block fragmented the heap until the worker ran
    into its address-space cap (16 GB resident at n=16384)."""
    q, k, v = (split(x, num_heads) for x in (query, key, value))
    batch, heads, n, width = q.shape
    k_len = k.shape[2]
    block = max(1, min(n, chunk_elements // max(1, batch * heads * k_len)))
    scores = q.new_empty(batch, heads, block, k_len)
    out = q.new_empty(batch, heads, n, v.shape[-1])
    keys_t, scale = k.transpose(-2, -1), 1.0 / math.sqrt(width)
    for start in range(0, n, block):
        rows = min(block, n - start)
        part = scores[:, :, :rows]
        torch.matmul(q[:, :, start:start + rows], keys_t, out=part).mul_(scale)
        if is_causal:  # key j <= query i; every row keeps its diagonal, so none is empty
            later = torch.arange(k_len).view(1, -1) > torch.arange(start, start + rows).view(-1, 1)
            part.masked_fill_(later, float("-inf"))
        part.sub_(part.amax(dim=-1, keepdim=True)).exp_()
        part.div_(part.sum(dim=-1, keepdim=True))
        out[:, :, start:start + rows] = part @ v
    return out.transpose(1, 2).flatten(2)


def visible_mean(value, is_causal: bool) -> Tensor:
    """The trivial answer: each query's mean of the values it may see (all of them, or the prefix)."""
    v = value.double()
    if not is_causal:
        return v.mean(dim=1, keepdim=True).expand_as(v)
    counts = torch.arange(1, v.shape[1] + 1, dtype=v.dtype).view(1, -1, 1)
    return v.cumsum(dim=1) / counts


def normalised_error(out: Tensor, target: Tensor, trivial: Tensor) -> float:
    """||out - target|| / ||trivial - target||: 0 exact, 1 as good as the trivial answer."""
    baseline = float((trivial - target).norm())
    return float((out.double() - target).norm()) / baseline if baseline > 0 else float("nan")


def target_output(variant, query, key, value, num_heads: int, is_causal: bool) -> Tensor:
    """The output of the function ``variant.approximates``, in float64."""
    if variant.approximates == SOFTMAX:
        return softmax_target(query, key, value, num_heads, is_causal)
    from .api import build

    target = variant.approximated
    module = build(target, d_model=query.shape[-1], num_heads=num_heads)
    return target.reference(module, query.double(), key.double(), value.double(), None, is_causal)


def not_measurable(variant) -> str | None:
    """Why the variant's approximation error cannot be measured, or None when it can."""
    if variant.approximates is None:
        return "exact for its own function (approximates=None): nothing to compare with"
    if variant.tags.has_parameters:
        return (f"a layer: its projections have no counterpart in {variant.approximates!r} to compare with "
                "on the same inputs")
    if variant.approximates != SOFTMAX and variant.approximated is None:
        return f"approximates {variant.approximates!r}, which is not registered here"
    return None


def errors_by_input(variant, module, n: int, d_model: int, num_heads: int, is_causal: bool, seed: int,
                    inputs=INPUTS, batch: int = 1) -> dict[Inputs, float]:
    """The normalised error of ``module`` against the function approximated, for each input family."""
    errors = {}
    for family in inputs:
        generator = torch.Generator().manual_seed(seed)
        query, key, value = make_inputs(family, batch, n, d_model, num_heads, generator)
        with torch.no_grad():
            out = module(query, key, value, is_causal=is_causal)
        target = target_output(variant, query, key, value, num_heads, is_causal)
        errors[family] = normalised_error(out, target, visible_mean(value, is_causal))
    return errors


def describe(errors: dict[Inputs, float]) -> str:
    """Every input family's error, short, for a row's detail."""
    return ", ".join(f"{family.label}: {error:.3g}" for family, error in errors.items())
