"""Building blocks whose attention is any registered variant: positional encoding, a pre-norm
Transformer block, a small sequence model and a small Vision-Transformer-style classifier.

The blocks know no variant by name; what they need they read from its tags (a variant without
parameters gets query/key/value/output projections around it, as in any Transformer layer).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .api import build
from .contract import Variant, VariantInputError


class SinusoidalPositionalEncoding(nn.Module):
    """The fixed sin/cos encoding of Vaswani et al. 2017, added to (batch, seq, d_model) inputs."""

    def __init__(self, d_model: int, max_len: int = 4096):
        super().__init__()
        position = torch.arange(max_len).unsqueeze(1)
        frequency = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
        table = torch.zeros(max_len, d_model)
        table[:, 0::2] = torch.sin(position * frequency)
        table[:, 1::2] = torch.cos(position * frequency[: d_model // 2])
        self.register_buffer("table", table, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] > self.table.shape[0]:
            raise ValueError(f"sequence length {x.shape[1]} exceeds the encoding's max_len {self.table.shape[0]}")
        return x + self.table[: x.shape[1]]


class ProjectedAttention(nn.Module):
    """Query/key/value/output projections around a variant that has no parameters of its own."""

    def __init__(self, attention: nn.Module, d_model: int):
        super().__init__()
        self.attention = attention
        self.q, self.k, self.v, self.out = (nn.Linear(d_model, d_model) for _ in range(4))

    def forward(self, query, key, value, attn_mask=None, is_causal=False):
        return self.out(self.attention(self.q(query), self.k(key), self.v(value), attn_mask=attn_mask, is_causal=is_causal))


def attention_layer(variant: Variant, d_model: int, num_heads: int, **options) -> nn.Module:
    """A variant as a model's attention layer: a layer as it is, a core between projections."""
    module = build(variant, d_model=d_model, num_heads=num_heads, **options)
    return module if variant.tags.has_parameters else ProjectedAttention(module, d_model)


class TransformerBlock(nn.Module):
    """Pre-norm block: x + attention(norm(x)) [+ cross-attention over a context] + feed-forward."""

    def __init__(self, variant: Variant, d_model: int, num_heads: int, ff_mult: int = 4, cross: bool = False, **options):
        super().__init__()
        self.variant = variant
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.attention = attention_layer(variant, d_model, num_heads, **options)
        self.cross = None
        if cross:
            if not variant.tags.allows_different_lengths:
                raise VariantInputError(f"variant {variant.name!r} cannot attend over a context of another length "
                                        "(capability allows_different_lengths is False)")
            self.cross_norm = nn.LayerNorm(d_model)
            self.cross = attention_layer(variant, d_model, num_heads, **options)
        self.feed_forward = nn.Sequential(nn.Linear(d_model, ff_mult * d_model), nn.GELU(), nn.Linear(ff_mult * d_model, d_model))

    def forward(self, x, context=None, attn_mask=None, is_causal=False):
        h = self.norm1(x)
        x = x + self.attention(h, h, h, attn_mask=attn_mask, is_causal=is_causal)
        if self.cross is not None:
            if context is None:
                raise ValueError("this block was built with cross=True: pass a context")
            x = x + self.cross(self.cross_norm(x), context, context)
        return x + self.feed_forward(self.norm2(x))


class SequenceModel(nn.Module):
    """Token embedding + positional encoding + blocks + a per-position classifier."""

    def __init__(self, variant: Variant, vocab: int, classes: int, d_model: int = 64, num_heads: int = 4,
                 layers: int = 2, max_len: int = 1024, causal: bool = False, **options):
        super().__init__()
        self.causal = causal
        self.embed = nn.Embedding(vocab, d_model)
        self.position = SinusoidalPositionalEncoding(d_model, max_len)
        self.blocks = nn.ModuleList(TransformerBlock(variant, d_model, num_heads, **options) for _ in range(layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.position(self.embed(tokens))
        for block in self.blocks:
            x = block(x, is_causal=self.causal)
        return self.head(self.norm(x))


class VisionTransformer(nn.Module):
    """Patch embedding, a class token, positional encoding, blocks, and a classifier on the class token."""

    def __init__(self, variant: Variant, image_size: int, patch_size: int, channels: int, classes: int,
                 d_model: int = 64, num_heads: int = 4, layers: int = 2, causal: bool = False, **options):
        super().__init__()
        self.causal = causal  # causal: the class token comes last, so it sees every patch
        if image_size % patch_size:
            raise ValueError(f"image_size {image_size} is not a multiple of patch_size {patch_size}")
        self.patches = nn.Conv2d(channels, d_model, kernel_size=patch_size, stride=patch_size)
        self.class_token = nn.Parameter(torch.zeros(1, 1, d_model))
        self.position = SinusoidalPositionalEncoding(d_model, (image_size // patch_size) ** 2 + 1)
        self.blocks = nn.ModuleList(TransformerBlock(variant, d_model, num_heads, **options) for _ in range(layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patches(images).flatten(2).transpose(1, 2)  # (batch, patches, d_model)
        token = self.class_token.expand(x.shape[0], -1, -1)
        x = self.position(torch.cat([x, token] if self.causal else [token, x], dim=1))
        for block in self.blocks:
            x = block(x, is_causal=self.causal)
        return self.head(self.norm(x[:, -1 if self.causal else 0]))
