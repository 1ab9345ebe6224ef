"""Multi-head self/cross attention with one fused input projection, on torch's fused SDPA.

Its parameters are named like ``nn.MultiheadAttention``'s, so either loads the other's state dict.
"""

import torch
import torch.nn.functional as F
from torch import nn

import zoo
from zoo.functional import call_torch_mha, masked_sdpa, merge_heads, split_heads
from zoo.reference import reference_mask, softmax_attention


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model: int, num_heads: int = 1, bias: bool = True):
        super().__init__()
        self.d_model, self.num_heads = d_model, num_heads
        self.in_proj_weight = nn.Parameter(torch.empty(3 * d_model, d_model))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * d_model)) if bias else None
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        nn.init.xavier_uniform_(self.in_proj_weight)
        if bias:
            nn.init.zeros_(self.out_proj.bias)

    def forward(self, query, key, value, attn_mask=None, is_causal=False):
        d, w, b = self.d_model, self.in_proj_weight, self.in_proj_bias
        bias = (None, None, None) if b is None else (b[:d], b[d:2 * d], b[2 * d:])
        if query is key and key is value:  # self-attention: one matmul for all three projections
            q, k, v = F.linear(query, w, b).chunk(3, dim=-1)
        elif key is value:
            q = F.linear(query, w[:d], bias[0])
            k, v = F.linear(key, w[d:], None if b is None else b[d:]).chunk(2, dim=-1)
        else:
            q, k, v = (F.linear(x, w[i * d:(i + 1) * d], bias[i]) for i, x in enumerate((query, key, value)))
        h = self.num_heads
        out = masked_sdpa(split_heads(q, h), split_heads(k, h), split_heads(v, h), attn_mask, is_causal)
        return self.out_proj(merge_heads(out))


def reference(module, query, key, value, attn_mask=None, is_causal=False):
    d, h = module.d_model, module.num_heads
    w = module.in_proj_weight.detach().double()
    b = module.in_proj_bias.detach().double() if module.in_proj_bias is not None else torch.zeros(3 * d, dtype=torch.float64)
    projected = [x.double() @ w[i * d:(i + 1) * d].T + b[i * d:(i + 1) * d] for i, x in enumerate((query, key, value))]
    heads = [x.unflatten(-1, (h, -1)).transpose(1, 2) for x in projected]
    mask = reference_mask(attn_mask, is_causal, query.shape[1], key.shape[1])
    out = softmax_attention(*heads, mask).transpose(1, 2).flatten(2)
    out_bias = module.out_proj.bias.detach().double() if module.out_proj.bias is not None else 0.0
    return out @ module.out_proj.weight.detach().double().T + out_bias


def torch_mha(need_weights: bool):
    """A baseline: ``nn.MultiheadAttention`` sharing the same weights."""

    def build(module):
        mha = nn.MultiheadAttention(module.d_model, module.num_heads, bias=module.in_proj_bias is not None,
                                    batch_first=True)
        mha.load_state_dict(module.state_dict(), assign=True)  # shares the tensors: no copy, and it works on any device
        mha.to(module.in_proj_weight.device, module.in_proj_weight.dtype).train(module.training)

        def run(query, key, value, attn_mask=None, is_causal=False):
            return call_torch_mha(mha, query, key, value, attn_mask, is_causal, need_weights)

        return run

    return build


def flops(batch, q_len, k_len, d_model, num_heads, **options):
    projections = 2.0 * batch * d_model * d_model * (2 * q_len + 2 * k_len)  # q, out; k, v
    return projections + 4.0 * batch * q_len * k_len * d_model


@zoo.hookimpl
def zoo_register_variants(register):
    register(zoo.Variant(
        name="multi-head",
        summary="Multi-head attention (fused in-projection, out-projection) on torch's fused SDPA.",
        family="softmax",
        citation="Vaswani et al. 2017, Attention Is All You Need",
        factory=MultiHeadAttention,
        reference=reference,
        tags=zoo.Tags(has_parameters=True),
        complexity=zoo.Complexity(time=2, memory=1),
        baselines={"torch-mha": torch_mha(need_weights=False), "torch-mha-weights": torch_mha(need_weights=True)},
        flops=flops,
        targets=(
            zoo.Target("x-torch-mha", 1.05, phase="fwd", note="within 1.05x of nn.MultiheadAttention(need_weights=False)"),
            zoo.Target("x-torch-mha", 1.05, phase="fwd+bwd", note="within 1.05x of nn.MultiheadAttention(need_weights=False)"),
            zoo.Target("x-torch-mha-weights", 1.0, phase="fwd", note="faster than nn.MultiheadAttention's default path"),
        ),
    ))
