"""Linear attention with the feature map elu(x) + 1 (Katharopoulos et al. 2020).

The kernel attention itself (non-causal in O(n d^2), causal over chunks of ``chunk`` tokens, key-padding
masks kept linear) is ``zoo.functional.kernel_attention``, shared with any positive feature map. Decoding is
the paper's RNN form: a fixed state, sum phi(k)^T v and sum phi(k) per head, one outer product per token.
"""

import torch
import torch.nn.functional as F
from torch import nn

import zoo
from zoo.functional import kernel_attention, merge_heads, split_heads
from zoo.reference import positive_kernel_attention, reference_mask


def feature_map(x):
    return F.elu(x) + 1


class LinearAttention(nn.Module):
    def __init__(self, d_model: int, num_heads: int = 1, chunk: int = 64):
        super().__init__()
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
            raise ValueError(f"chunk must be a positive integer, got {chunk!r}")
        self.d_model, self.num_heads, self.chunk = d_model, num_heads, chunk

    def forward(self, query, key, value, attn_mask=None, is_causal=False):
        q, k, v = (split_heads(x, self.num_heads) for x in (query, key, value))
        return merge_heads(kernel_attention(feature_map(q), feature_map(k), v, attn_mask, is_causal, self.chunk))


def reference(module, query, key, value, attn_mask=None, is_causal=False):
    """The quadratic form sum_j phi(q_i).phi(k_j) v_j / sum_j phi(q_i).phi(k_j), in float64."""
    h = module.num_heads
    q, k, v = (x.double().unflatten(-1, (h, -1)).transpose(1, 2) for x in (query, key, value))
    phi_q, phi_k = (torch.where(x > 0, x + 1, torch.exp(x)) for x in (q, k))  # elu(x) + 1, written out
    mask = reference_mask(attn_mask, is_causal, q.shape[2], k.shape[2])
    return positive_kernel_attention(phi_q, phi_k, v, mask).transpose(1, 2).flatten(2)


def prefill(module, query, key, value, key_mask=None):
    """The causal forward over the prompt, and the state its (unmasked) keys leave, in float32 at least: a
    long-running sum in half precision would lose the new tokens' digits."""
    dtype = torch.promote_types(query.dtype, torch.float32)
    q, k, v = (split_heads(x.to(dtype), module.num_heads) for x in (query, key, value))
    fq, fk = feature_map(q), feature_map(k)
    mask = None if key_mask is None else key_mask[:, None, None, :]
    out = kernel_attention(fq, fk, v, mask, True, module.chunk)
    if key_mask is not None:
        fk = fk * key_mask[:, None, :, None].to(dtype)
    state = {"kv": fk.transpose(-2, -1) @ v, "normaliser": fk.sum(-2).unsqueeze(-1)}  # (b, h, d, d_v), (b, h, d, 1)
    return merge_heads(out).to(query.dtype), state


def step(module, state, query, key, value, key_mask=None):
    """The next token: its key's features times its value added into the state in place, then its query's
    features read numerator and normaliser from it (zero while every key so far is masked)."""
    kv, normaliser = state["kv"], state["normaliser"]
    q, k, v = (split_heads(x.to(kv.dtype), module.num_heads) for x in (query, key, value))
    fq, fk = feature_map(q), feature_map(k).transpose(-2, -1)  # (b, h, 1, d) and (b, h, d, 1)
    if key_mask is not None:
        fk = fk * key_mask[:, None, None, :].to(kv.dtype)
    kv.addcmul_(fk, v)
    normaliser.add_(fk)
    numerator, denominator = fq @ kv, fq @ normaliser
    out = numerator / denominator.masked_fill(denominator == 0, 1.0)
    return merge_heads(out).to(query.dtype), state


def state_bytes(batch, context, d_model, num_heads, itemsize, **options):
    """Per head a d x d state and a d normaliser, in float32 at least, whatever the context."""
    return batch * d_model * (d_model // num_heads + 1) * max(itemsize, 4)


def ones_column(module):
    """phi(q) (phi(k)^T [v, 1]) written directly, the normaliser as a ones column riding with the values (one
    matmul each side); key padding zeroes those keys' features, any other mask takes the quadratic form. Causal
    attention goes to the module's chunked form: no plain-torch causal form faster than it is known."""
    def run(query, key, value, attn_mask=None, is_causal=False):
        if is_causal:
            return module(query, key, value, attn_mask, is_causal)
        q, k, v = (split_heads(x, module.num_heads) for x in (query, key, value))
        fq, fk = feature_map(q), feature_map(k)
        if attn_mask is not None:
            keep = attn_mask if attn_mask.dim() >= 2 else attn_mask.view(1, -1)
            if keep.shape[-2] != 1:
                scores = (fq @ fk.transpose(-2, -1)) * attn_mask
                out = scores @ F.pad(v, (0, 1), value=1.0)
                return merge_heads(out[..., :-1] / torch.where(out[..., -1:] == 0, 1.0, out[..., -1:]))
            fk = fk * keep.transpose(-2, -1).to(fk.dtype)
        out = fq @ (fk.transpose(-2, -1) @ F.pad(v, (0, 1), value=1.0))
        return merge_heads(out[..., :-1] / torch.where(out[..., -1:] == 0, 1.0, out[..., -1:]))
    return run


@zoo.hookimpl
def zoo_register_variants(register):
    register(zoo.Variant(
        name="linear",
        summary="Linear attention (elu+1 features); causal via chunked prefix states, O(n d^2).",
        family="linear",
        citation="Katharopoulos et al. 2020, Transformers are RNNs: Fast Autoregressive Transformers with Linear Attention",
        departures=(
            zoo.Departure("extension",
                          "takes any query-dependent mask, computed in the O(n^2) quadratic form; the paper defines full and causal only"),
        ),
        factory=LinearAttention,
        reference=reference,
        approximates="softmax",
        complexity=zoo.Complexity(time=1, memory=1),
        options={"chunk": 64},
        check_options={"chunk": 4},
        baselines={"ones-column": ones_column},
        best_known="ones-column",
        decoder=zoo.Decoder(prefill=prefill, step=step, growth="fixed", state_bytes=state_bytes),
        targets=(
            zoo.Target("decode-growth", at_least=1 / 1.1, at_most=1.1, mode="causal", phase="decode",
                       note="time per generated token constant within 10% from the shortest timed context to the longest"),
            zoo.Target("decode-ratio", versus="sdpa-kv-cache", at_most=0.1, mode="causal", phase="decode", n=16384,
                       note="at least 10x faster per token than softmax over a KV cache at 16384 context"),
            zoo.Target("time-ratio", versus="torch-sdpa", at_most=1 / 15, mode="causal", phase="fwd", n=16384,
                       note="causal: at least 15x faster than causal torch SDPA at n=16384"),
            zoo.Target("backward-cost", 3, mode="causal", phase="fwd+bwd", n=16384,
                       note="causal: forward+backward at most 3x its own forward at n=16384"),
        ),
    ))
