"""Cross attention: queries attend over a context with its own length and feature sizes.

Separate query/key/value projections (the context's key and value widths are ``kdim``/``vdim``),
named like ``nn.MultiheadAttention(kdim=..., vdim=...)``'s so either loads the other's state dict.
"""

import torch
import torch.nn.functional as F
from torch import nn

import zoo
from zoo.functional import call_torch_mha, masked_sdpa, merge_heads, split_heads
from zoo.reference import reference_mask, softmax_attention


class CrossAttention(nn.Module):
    def __init__(self, d_model: int, num_heads: int = 1, kdim: int | None = None, vdim: int | None = None):
        super().__init__()
        self.d_model, self.num_heads = d_model, num_heads
        self.kdim, self.vdim = kdim or d_model, vdim or d_model
        self.q_proj_weight = nn.Parameter(torch.empty(d_model, d_model))
        self.k_proj_weight = nn.Parameter(torch.empty(d_model, self.kdim))
        self.v_proj_weight = nn.Parameter(torch.empty(d_model, self.vdim))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * d_model))
        self.out_proj = nn.Linear(d_model, d_model)
        for weight in (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight):
            nn.init.xavier_uniform_(weight)
        nn.init.zeros_(self.out_proj.bias)

    def forward(self, query, key, value, attn_mask=None, is_causal=False):
        d, b = self.d_model, self.in_proj_bias
        q = F.linear(query, self.q_proj_weight, b[:d])
        k = F.linear(key, self.k_proj_weight, b[d:2 * d])
        v = F.linear(value, self.v_proj_weight, b[2 * d:])
        h = self.num_heads
        out = masked_sdpa(split_heads(q, h), split_heads(k, h), split_heads(v, h), attn_mask, is_causal)
        return self.out_proj(merge_heads(out))


def reference(module, query, key, value, attn_mask=None, is_causal=False):
    d, h = module.d_model, module.num_heads
    b = module.in_proj_bias.detach().double()
    weights = (module.q_proj_weight, module.k_proj_weight, module.v_proj_weight)
    projected = [x.double() @ w.detach().double().T + b[i * d:(i + 1) * d]
                 for i, (x, w) in enumerate(zip((query, key, value), weights))]
    heads = [x.unflatten(-1, (h, -1)).transpose(1, 2) for x in projected]
    mask = reference_mask(attn_mask, is_causal, query.shape[1], key.shape[1])
    out = softmax_attention(*heads, mask).transpose(1, 2).flatten(2)
    return out @ module.out_proj.weight.detach().double().T + module.out_proj.bias.detach().double()


def torch_mha(need_weights: bool):
    """A baseline: ``nn.MultiheadAttention(kdim=..., vdim=...)`` sharing the same weights."""

    def build(module):
        mha = nn.MultiheadAttention(module.d_model, module.num_heads, kdim=module.kdim, vdim=module.vdim,
                                    batch_first=True)
        state = module.state_dict()
        if mha._qkv_same_embed_dim:  # torch fuses the three projections when the widths agree
            state["in_proj_weight"] = torch.cat([state.pop(f"{x}_proj_weight") for x in "qkv"])
        mha.load_state_dict(state, assign=True)  # shares the tensors: no copy, and it works on any device
        mha.to(module.q_proj_weight.device, module.q_proj_weight.dtype).train(module.training)

        def run(query, key, value, attn_mask=None, is_causal=False):
            return call_torch_mha(mha, query, key, value, attn_mask, is_causal, need_weights)

        return run

    return build


def flops(batch, q_len, k_len, d_model, num_heads, kdim=None, vdim=None, **options):
    kdim, vdim = kdim or d_model, vdim or d_model
    projections = 2.0 * batch * d_model * (2 * q_len * d_model + k_len * (kdim + vdim))
    return projections + 4.0 * batch * q_len * k_len * d_model


@zoo.hookimpl
def zoo_register_variants(register):
    register(zoo.Variant(
        name="cross",
        summary="Multi-head cross attention over a context of its own length and key/value widths.",
        family="softmax",
        citation="Vaswani et al. 2017; Jaegle et al. 2021 (Perceiver) for cross attention over other modalities",
        factory=CrossAttention,
        reference=reference,
        tags=zoo.Tags(allows_kv_dims=True, has_parameters=True),
        complexity=zoo.Complexity(time=2, memory=1),
        options={"kdim": None, "vdim": None},
        baselines={"torch-mha": torch_mha(need_weights=False), "torch-mha-weights": torch_mha(need_weights=True)},
        flops=flops,
        targets=(
            zoo.Target("x-torch-mha", 1.05, phase="fwd", note="within 1.05x of nn.MultiheadAttention(need_weights=False)"),
            zoo.Target("x-torch-mha", 1.05, phase="fwd+bwd", note="within 1.05x of nn.MultiheadAttention(need_weights=False)"),
            zoo.Target("x-torch-mha-weights", 1.0, phase="fwd", note="faster than nn.MultiheadAttention's default path"),
        ),
    ))
