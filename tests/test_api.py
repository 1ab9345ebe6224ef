"""The Python API: building variants as layers, options by name, and clear input errors."""

import pytest
import torch

import zoo
from zoo.contract import OptionError, VariantInputError


def test_create_returns_a_module_with_the_contract_shape(registry):
    module = zoo.create("multi-head", d_model=32, num_heads=4, registry=registry)
    x = torch.randn(2, 7, 32)
    assert module(x, x, x).shape == (2, 7, 32)


def test_unknown_option_is_rejected_by_name(registry):
    with pytest.raises(OptionError, match="has no option 'windw'.*window"):
        zoo.create("windowed", d_model=16, registry=registry, windw=4)


@pytest.mark.parametrize("d_model, heads, message", [
    (10, 3, "not divisible"), (0, 1, "d_model must be a positive integer"), (8, -1, "num_heads must be"),
])
def test_bad_sizes_are_rejected(registry, d_model, heads, message):
    with pytest.raises(OptionError, match=message):
        zoo.create("dot-product", d_model=d_model, num_heads=heads, registry=registry)


def test_bad_option_value_names_variant_and_option(registry):
    with pytest.raises(OptionError, match="windowed.*window must be a positive integer"):
        zoo.create("windowed", d_model=16, registry=registry, window=0)


def test_unsupported_capability_names_variant_and_capability(registry):
    module = zoo.create("windowed", d_model=16, registry=registry)
    q, k = torch.randn(1, 5, 16), torch.randn(1, 7, 16)
    with pytest.raises(VariantInputError, match="'windowed'.*allows_different_lengths"):
        module(q, k, k)


def test_kv_dims_need_the_capability(registry):
    module = zoo.create("multi-head", d_model=16, registry=registry)
    q, k = torch.randn(1, 5, 16), torch.randn(1, 5, 12)
    with pytest.raises(VariantInputError, match="allows_kv_dims is False"):
        module(q, k, k)


def test_mask_must_be_boolean_and_broadcastable(registry):
    module = zoo.create("dot-product", d_model=16, num_heads=2, registry=registry)
    x = torch.randn(2, 5, 16)
    with pytest.raises(VariantInputError, match="boolean"):
        module(x, x, x, attn_mask=torch.zeros(5, 5))
    with pytest.raises(VariantInputError, match="does not broadcast"):
        module(x, x, x, attn_mask=torch.ones(3, 5, 5, dtype=torch.bool))


def test_cross_takes_context_of_other_width_and_length(registry):
    module = zoo.create("cross", d_model=16, num_heads=4, kdim=24, vdim=8, registry=registry)
    out = module(torch.randn(2, 3, 16), torch.randn(2, 11, 24), torch.randn(2, 11, 8))
    assert out.shape == (2, 3, 16)
