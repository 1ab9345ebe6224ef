"""Cross attention: queries attend over a context with its own length and feature sizes.

Separate query/key/value projections (the context's key and value widths are ``kdim``/``vdim``),
named like ``nn.MultiheadAttention(kdim=..., vdim=...)``'s: where kdim or vdim differs from d_model either loads
the other's state dict (at equal widths torch fuses them into one ``in_proj_weight``; the baseline maps them).
"""

import torch
import torch.nn.functional as F
from torch import nn

import zoo
from zoo.functional import merge_heads, projected_sdpa, sdpa_zeroing_empty_rows, split_heads, torch_mha_baseline
from zoo.reference import projected_softmax


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
        return projected_sdpa(q, k, v, self.num_heads, attn_mask, is_causal, self.out_proj)


def reference(module, query, key, value, attn_mask=None, is_causal=False):
    d, b = module.d_model, module.in_proj_bias
    return projected_softmax(query, key, value, (module.q_proj_weight, module.k_proj_weight, module.v_proj_weight),
                             (b[:d], b[d:2 * d], b[2 * d:]), module.out_proj.weight, module.out_proj.bias,
                             module.num_heads, attn_mask, is_causal)


def prefill(module, query, key, value, key_mask=None):
    """The context projected and split into heads once: its keys and values (and padding) are the whole state,
    laid out head by head (on a strided view of the projection, CPU SDPA took 2-3x as long per step)."""
    d, b, h = module.d_model, module.in_proj_bias, module.num_heads
    state = {"k": split_heads(F.linear(key, module.k_proj_weight, b[d:2 * d]), h).contiguous(),
             "v": split_heads(F.linear(value, module.v_proj_weight, b[2 * d:]), h).contiguous()}
    if key_mask is not None:
        state["key_mask"] = key_mask.to(torch.bool)
    return step(module, state, query)


def step(module, state, query, key=None, value=None, key_mask=None):
    """The next queries over the cached context; the state is left as it is (nothing grows)."""
    d, b = module.d_model, module.in_proj_bias
    q = split_heads(F.linear(query, module.q_proj_weight, b[:d]), module.num_heads)
    if "key_mask" in state:
        out = sdpa_zeroing_empty_rows(q, state["k"], state["v"], state["key_mask"][:, None, None, :])
    else:
        out = F.scaled_dot_product_attention(q, state["k"], state["v"])
    return module.out_proj(merge_heads(out)), state


def context_bytes(batch, context, d_model, num_heads, itemsize, **options):
    return 2 * batch * context * d_model * itemsize  # the context's keys and values, projected to d_model


def _state(module, mha):
    state = module.state_dict()
    if mha._qkv_same_embed_dim:  # torch fuses the three projections when the widths agree
        state["in_proj_weight"] = torch.cat([state.pop(f"{x}_proj_weight") for x in "qkv"])
    return state


def torch_mha(need_weights: bool):
    """A baseline: ``nn.MultiheadAttention(kdim=..., vdim=...)`` sharing the same weights."""
    return torch_mha_baseline(need_weights, lambda m: {"embed_dim": m.d_model, "num_heads": m.num_heads,
                                                       "kdim": m.kdim, "vdim": m.vdim}, _state)


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
        departures=(
            zoo.Departure("extension",
                          "biases on the query, key, value and output projections, always on; the papers' projections have none"),
            zoo.Departure("extension",
                          "takes is_causal and any mask over the context; neither paper defines causal cross attention"),
            zoo.Departure("omission",
                          "none of Perceiver's block around it: no learned latent array (the queries are given), no input LayerNorms"),
        ),
        factory=CrossAttention,
        reference=reference,
        tags=zoo.Tags(allows_kv_dims=True, has_parameters=True),
        complexity=zoo.Complexity(time=2, memory=1),
        options={"kdim": None, "vdim": None},
        baselines={"torch-mha": torch_mha(need_weights=False), "torch-mha-weights": torch_mha(need_weights=True)},
        best_known="torch-mha",
        flops=flops,
        decoder=zoo.Decoder(prefill=prefill, step=step, growth="fixed", state_bytes=context_bytes, context=True),
        targets=(
            zoo.Target("time-ratio", versus="torch-mha", at_most=1.05, phase="fwd",
                       note="within 1.05x of nn.MultiheadAttention(need_weights=False)"),
            zoo.Target("time-ratio", versus="torch-mha", at_most=1.05, phase="fwd+bwd",
                       note="within 1.05x of nn.MultiheadAttention(need_weights=False)"),
            zoo.Target("time-ratio", versus="torch-mha-weights", at_most=1.0, phase="fwd",
                       note="faster than nn.MultiheadAttention's default path"),
        ),
    ))
