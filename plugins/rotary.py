"""Multi-head attention with rotary position embeddings (RoPE, Su et al. 2021).

After projection, each head's query and key features are rotated in pairs by an angle proportional to
their position (pair i of position p by p * base^(-2i/d)), so a score depends on the two tokens and
their offset only. Pairs are (x_i, x_{i + d/2}), the "rotate half" layout of GPT-NeoX and Llama in
Hugging Face. Positions count from 0 in the queries and in the keys (top-left, like ``is_causal``).
Decoding caches the keys already rotated: a key's rotation depends on its own position only.
"""

from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

import zoo
from zoo.functional import cached_attention, masked_sdpa, merge_heads, split_heads
from zoo.reference import linear, reference_mask, softmax_attention


def rotate(x, cos, sin):
    """x * cos + rotate_half(x) * sin on (..., d), with cos/sin tables (..., d) (each pair's angle in both halves).
    Without autograd: the product with cos, then each half's multiply-add in place, three passes where the textbook
    form takes a negation, a concatenation, two products and a sum (a flip of the halves instead is a slow strided
    copy). Under autograd the textbook form: the backward of an in-place half clones the whole gradient (a
    forward+backward's peak memory was 1.11x the textbook form's)."""
    if torch.is_grad_enabled() and x.requires_grad:
        return rotate_half_textbook(x, cos, sin)
    half = x.shape[-1] // 2
    out = x * cos
    out[..., :half].addcmul_(x[..., half:], sin[..., :half], value=-1)
    out[..., half:].addcmul_(x[..., :half], sin[..., half:])
    return out


def rotate_half_textbook(x, cos, sin):
    """x * cos + rotate_half(x) * sin as Hugging Face's Llama writes it, with the plain sin table."""
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-second, first), dim=-1) * sin


class RotaryMultiHeadAttention(nn.Module):
    def __init__(self, d_model: int, num_heads: int = 1, base: float = 10000.0, bias: bool = True):
        super().__init__()
        head_dim = d_model // num_heads
        if head_dim % 2:
            raise ValueError(f"rotary needs an even per-head width, got d_model={d_model} / num_heads={num_heads} "
                             f"= {head_dim}")
        if isinstance(base, bool) or not isinstance(base, (int, float)) or base <= 1:
            raise ValueError(f"base must be a number above 1, got {base!r}")
        self.d_model, self.num_heads, self.base = d_model, num_heads, float(base)
        self.in_proj = nn.Linear(d_model, 3 * d_model, bias=bias)  # query, key and value weights packed, as in
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)       # nn.MultiheadAttention: no per-call concatenation
        self.register_buffer("inv_freq", base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim),
                             persistent=False)
        self._tables: dict = {}  # (device, dtype) -> cos, sin tables from position 0 (see tables)

    def angles(self, length: int, like: torch.Tensor, start: int = 0):
        """cos and sin of every (position, feature) angle for positions start.., (length, head_dim), in ``like``'s
        dtype."""
        positions = torch.arange(start, start + length, device=like.device, dtype=torch.float64)
        angles = torch.outer(positions, self.inv_freq.to(like.device, torch.float64)).repeat(1, 2)
        return angles.cos().to(like.dtype), angles.sin().to(like.dtype)

    def tables(self, length: int, like: torch.Tensor):
        """:meth:`angles` from position 0, computed once per device and dtype for the longest length asked so far
        and sliced: a forward does not recompute them (in float64) for its queries and again for its keys."""
        key = (like.device, like.dtype)
        cached = self._tables.get(key)
        if cached is None or cached[0].shape[0] < length:
            cached = self._tables[key] = self.angles(length, like)
        return cached[0][:length], cached[1][:length]

    def projections(self, query, key, value):
        """Queries, keys and values split into heads, (batch, heads, seq, head_dim) each, not yet rotated."""
        if query is key and key is value:
            q, k, v = self.in_proj(query).chunk(3, dim=-1)
        else:
            biases = (None,) * 3 if self.in_proj.bias is None else self.in_proj.bias.chunk(3)
            q, k, v = (F.linear(x, w, b) for x, w, b in zip((query, key, value), self.in_proj.weight.chunk(3), biases))
        return tuple(split_heads(x, self.num_heads) for x in (q, k, v))

    def forward(self, query, key, value, attn_mask=None, is_causal=False):
        if query is key and key is value and not torch.is_grad_enabled():  # queries and keys rotated as one tensor
            batch, length, _ = query.shape
            qkv = self.in_proj(query).view(batch, length, 3, self.num_heads, -1)
            cos, sin = (table[:, None, None] for table in self.tables(length, qkv))
            q, k = rotate(qkv[:, :, :2], cos, sin).unbind(2)
            q, k, v = (x.transpose(1, 2) for x in (q, k, qkv[:, :, 2]))
        else:
            q, k, v = self.projections(query, key, value)
            q, k = (rotate(x, *self.tables(x.shape[-2], x)) for x in (q, k))
        return self.out_proj(merge_heads(masked_sdpa(q, k, v, attn_mask, is_causal)))


def _layers(module):
    """The query, key and value projections as (weight, bias) pairs sliced from the packed one."""
    biases = (None,) * 3 if module.in_proj.bias is None else module.in_proj.bias.chunk(3)
    return [SimpleNamespace(weight=w, bias=b) for w, b in zip(module.in_proj.weight.chunk(3), biases)]


def reference(module, query, key, value, attn_mask=None, is_causal=False):
    """Each position's features multiplied by its block-diagonal rotation matrix, in float64."""
    def rotation_matrices(length, width):
        half = width // 2
        matrices = torch.zeros(length, width, width, dtype=torch.float64)
        for p in range(length):
            for i in range(half):
                theta = p * module.base ** (-2.0 * i / width)
                c, s = torch.cos(torch.tensor(theta, dtype=torch.float64)), torch.sin(torch.tensor(theta, dtype=torch.float64))
                # (x_i, x_{i+half}) -> (x_i c - x_{i+half} s, x_i s + x_{i+half} c), as a row-vector product
                matrices[p, i, i], matrices[p, i + half, i] = c, -s
                matrices[p, i, i + half], matrices[p, i + half, i + half] = s, c
        return matrices

    h = module.num_heads
    q, k, v = (linear(x, layer).unflatten(-1, (h, -1)).transpose(1, 2)
               for x, layer in zip((query, key, value), _layers(module)))
    width = q.shape[-1]
    q = torch.einsum("bhpi,pij->bhpj", q, rotation_matrices(q.shape[2], width))
    k = torch.einsum("bhpi,pij->bhpj", k, rotation_matrices(k.shape[2], width))
    mask = reference_mask(attn_mask, is_causal, query.shape[1], key.shape[1])
    return linear(softmax_attention(q, k, v, mask).transpose(1, 2).flatten(2), module.out_proj)


def decode(module, state, query, key, value, key_mask=None):
    """The next positions rotated by their absolute positions, which continue from the cache's length; their
    keys cached rotated, so a step rotates one query and one key."""
    q, k, v = module.projections(query, key, value)
    cos, sin = module.angles(q.shape[-2], q, start=state["k"].shape[-2] if "k" in state else 0)
    out, state = cached_attention(state, rotate(q, cos, sin), rotate(k, cos, sin), v, key_mask)
    return module.out_proj(merge_heads(out)), state


def cache_bytes(batch, context, d_model, num_heads, itemsize, **options):
    return 2 * batch * context * d_model * itemsize  # every rotated key and projected value


def complex_rotation(module):
    """A baseline: RoPE as Meta's Llama reference code writes it (pairs as complex numbers times
    ``torch.polar`` phases), then SDPA, with the same weights."""

    def run(query, key, value, attn_mask=None, is_causal=False):
        q, k, v = module.projections(query, key, value)

        def rotated(x):
            real = x if x.dtype in (torch.float32, torch.float64) else x.float()  # complex halves do not exist
            half, length = x.shape[-1] // 2, x.shape[-2]
            positions = torch.arange(length, device=x.device, dtype=real.dtype)
            phases = torch.polar(torch.ones(length, half, device=x.device, dtype=real.dtype),
                                 torch.outer(positions, module.inv_freq.to(x.device, real.dtype)))
            pairs = torch.view_as_complex(torch.stack((real[..., :half], real[..., half:]), dim=-1).contiguous())
            turned = torch.view_as_real(pairs * phases)
            return torch.cat((turned[..., 0], turned[..., 1]), dim=-1).to(x.dtype)

        return module.out_proj(merge_heads(masked_sdpa(rotated(q), rotated(k), v, attn_mask, is_causal)))

    return run


def cached_tables(module):
    """Hugging Face's Llama form with the usual speed-ups: one packed projection for self-attention (the module's
    own), cos and sin tables computed once per length and reused, the textbook rotate-half product on queries and
    keys apart, then SDPA."""
    tables = {}

    def angles(length, like):
        key = (length, like.device, like.dtype)
        if key not in tables:
            tables[key] = module.angles(length, like)
        return tables[key]

    def run(query, key, value, attn_mask=None, is_causal=False):
        q, k, v = module.projections(query, key, value)
        q, k = (rotate_half_textbook(x, *angles(x.shape[-2], x)) for x in (q, k))
        return module.out_proj(merge_heads(masked_sdpa(q, k, v, attn_mask, is_causal)))

    return run


def flops(batch, q_len, k_len, d_model, num_heads, **options):
    projections = 2.0 * batch * d_model * d_model * (2 * q_len + 2 * k_len)  # q, out; k, v
    return projections + 4.0 * batch * q_len * k_len * d_model  # the rotations are elementwise: not counted


@zoo.hookimpl
def zoo_register_variants(register):
    register(zoo.Variant(
        name="rotary",
        summary="Multi-head attention with rotary position embeddings on queries and keys (RoPE), on SDPA.",
        family="softmax",
        citation="Su et al. 2021, RoFormer: Enhanced Transformer with Rotary Position Embedding",
        departures=(
            zoo.Departure("convention",
                          "rotates pairs (x_i, x_{i+d/2}) (\"rotate half\": GPT-NeoX, Llama), not the paper's (x_2i, x_2i+1): weights need permuting"),
            zoo.Departure("extension",
                          "queries and keys of different lengths both count positions from 0 (rotary cross attention, not in the paper)"),
            zoo.Departure("extension", "biases on the query, key, value and output projections, always on"),
            zoo.Departure("omission",
                          "RoPE inside linear attention (the paper's rotated feature maps) is not offered: softmax only"),
        ),
        factory=RotaryMultiHeadAttention,
        reference=reference,
        tags=zoo.Tags(has_parameters=True, key_order_invariant=False),
        complexity=zoo.Complexity(time=2, memory=1),
        options={"base": 10000.0},
        baselines={"complex-rope": complex_rotation, "cached-tables": cached_tables},
        best_known="cached-tables",
        flops=flops,
        decoder=zoo.Decoder(prefill=lambda module, *inputs: decode(module, {}, *inputs), step=decode, growth="token",
                            state_bytes=cache_bytes),
        targets=(
            zoo.Target("time-ratio", versus="torch-mha-layer", at_most=1.05, phase="fwd",
                       note="rotations nearly free: within 1.05x of nn.MultiheadAttention (no positions) forward"),
            zoo.Target("time-ratio", versus="complex-rope", at_most=1.0, phase="fwd+bwd",
                       note="no slower than RoPE written with complex numbers (Llama's reference code)"),
        ),
    ))
