"""Callables the complexity and speed suites measure: the variant, the torch op it is compared with
on the same shapes, and the variant's baselines, each as a forward (no grad) and a forward+backward
step on shared inputs.

Like is compared with like: an attention *core* (no parameters) with torch SDPA, an attention *layer*
(with projections) with ``nn.MultiheadAttention(need_weights=False)``. The kind comes from the
contract (:attr:`zoo.Variant.kind`), never from the name. SDPA is timed beside every variant.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from .api import build
from .checks import ERROR, Result
from .contract import COMPARATORS, MHA, SDPA, Variant
from .functional import call_torch_mha



def comparator(variant: Variant) -> str:
    """The op the variant's kind is compared with."""
    return COMPARATORS[variant.kind]


@dataclass
class Workload:
    """A forward and a training step of one callable on fixed inputs."""
    forward: Callable[[], object]
    """One call without autograd; returns the output (checked for NaN/inf outside the timed loop)."""
    train_step: Callable[[], None] | None
    """One forward and backward pass (None for a floor: it bounds the forward pass only)."""
    checked_forward: Callable[[], object] | None = None
    """``forward`` through the zoo's input and output checks (the variant's only): called once, untimed."""


def modes_for(variant: Variant, modes: tuple[str, ...]) -> list[str]:
    """The profile's attention modes the variant computes; a causal-only variant runs causal whatever the profile
    asks for, so it is measured in the mode it is used in."""
    supported = [m for m in modes if m in variant.tags.modes]
    return supported or (["causal"] if variant.tags.causal_only else [])


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
                             baselines: bool = True, floors: bool = False, peers: bool = False,
                             only: set[str] | None = None) -> dict[str, Workload]:
    """Self-attention on one (batch, n, d_model) input of ``dtype``: the variant (under its own name),
    ``torch-sdpa`` on the same (batch, heads, n, d_model / heads) shapes, for a layer also
    ``nn.MultiheadAttention`` on the same (batch, n, d_model) input, each baseline and, with ``floors``, each
    floor (forward only), and with ``peers`` each peer (forward only, wherever the variant is) (``only``:
    just these callables).

    The timed callables run the bare module (no input checks), as the torch ops they are compared with
    run bare; the variant's ``checked_forward`` goes through the checks, for one untimed call.
    """
    torch.manual_seed(seed)
    dtype = getattr(torch, dtype)
    module = build(variant, d_model=d_model, num_heads=heads).to(device=device, dtype=dtype)
    x = torch.randn(batch, n, d_model, device=device, dtype=dtype, requires_grad=True)
    grad_out = torch.randn(batch, n, d_model, device=device, dtype=dtype)
    params = [p for p in module.parameters() if p.requires_grad]
    wanted = (lambda who: True) if only is None else (lambda who: who in only)
    loads = {}
    if wanted(variant.name):
        loads[variant.name] = _workload(lambda: module.forward(x, x, x, is_causal=causal), grad_out, [x, *params])
        loads[variant.name].checked_forward = torch.no_grad()(lambda: module(x, x, x, is_causal=causal))

    if wanted(SDPA):
        heads_in = torch.randn(batch, heads, n, d_model // heads, device=device, dtype=dtype, requires_grad=True)
        heads_grad = torch.randn_like(heads_in)
        loads[SDPA] = _workload(lambda: F.scaled_dot_product_attention(heads_in, heads_in, heads_in, is_causal=causal),
                                heads_grad, [heads_in])
    if variant.kind == "layer" and wanted(MHA):
        mha = torch.nn.MultiheadAttention(d_model, heads, batch_first=True).to(device=device, dtype=dtype)
        loads[MHA] = _workload(lambda: call_torch_mha(mha, x, x, x, is_causal=causal), grad_out,
                               [x, *mha.parameters()])
    if baselines:
        for label, make in variant.baselines.items():
            if wanted(label):
                fn = make(module)
                loads[label] = _workload(lambda fn=fn: fn(x, x, x, is_causal=causal), grad_out, [x, *params])
    forward_only = {**(variant.floors if floors else {}), **(variant.peers if peers and wanted(variant.name) else {})}
    for label, make in forward_only.items():
        if wanted(label) or label in variant.peers:
            fn = make(module) if label not in variant.peers else _deferred_failure(make, module)
            loads[label] = Workload(torch.no_grad()(lambda fn=fn: fn(x, x, x, is_causal=causal)), None)
    return loads


def _deferred_failure(make, module):
    """A peer's callable; if building it fails (e.g. its library is missing), a callable that raises that
    error at its first call, where the speed suite reports why the peer was not timed."""
    try:
        return make(module)
    except Exception as error:
        failure = error  # the except clause unbinds ``error`` when it ends

        def failed(*args, **kwargs):
            raise failure

        return failed


def non_finite_output(loads: dict[str, Workload], variant: str, mode: str, n: int, dtype: str) -> Result | None:
    """One checked call of the variant at this length: an error row if it returned NaN or inf, else None.
    Both the complexity and the speed suite call it before measuring a length."""
    output = loads[variant].checked_forward()
    if isinstance(output, torch.Tensor) and output.is_floating_point() and not bool(torch.isfinite(output).all()):
        return Result("finite-output", ERROR, f"{mode} fwd n={n}", n=n, mode=mode,
                      detail=f"the variant returned NaN or inf at n={n} (Gaussian self-attention inputs, {dtype}); "
                             "not measured")
    return None
