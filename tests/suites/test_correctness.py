"""Every correctness check passes on the built-ins and fails on a variant broken in its own way."""

import dataclasses

import pytest
import torch
from torch import nn

import zoo
from zoo.checks import FAILED, PASSED
from zoo.functional import cached_attention, combine_masks, masked_sdpa, merge_heads
from zoo.profiles import get_profile
from conftest import BUILTINS
from twins import Attention, MeanOfValues, ReturnsFloat64, blended, mean_reference, reference

PROFILE = get_profile("quick")


class Scaled(Attention):
    def forward(self, *args, **kwargs):
        return super().forward(*args, **kwargs) * 1.001


class LowPrecisionInFloat32(Attention):
    def forward(self, query, key, value, attn_mask=None, is_causal=False):
        if query.dtype == torch.float64:
            return super().forward(query, key, value, attn_mask, is_causal)
        low = [x.to(torch.bfloat16) for x in (query, key, value)]
        return super().forward(*low, attn_mask, is_causal).to(query.dtype)


class DoubledGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return 2 * grad


class CoarseInLowPrecision(Attention):
    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        return (out * 8).round() / 8 if out.dtype in (torch.bfloat16, torch.float16) else out


class WrongBackward(Attention):
    def forward(self, *args, **kwargs):
        return DoubledGradient.apply(super().forward(*args, **kwargs))


class QueryPosition(Attention):
    def forward(self, query, *args, **kwargs):
        out = super().forward(query, *args, **kwargs)
        return out + torch.arange(out.shape[1], dtype=out.dtype).view(1, -1, 1) * 0.1


class KeyPosition(Attention):
    def forward(self, query, key, value, attn_mask=None, is_causal=False):
        key = key + torch.arange(key.shape[1], dtype=key.dtype).view(1, -1, 1) * 0.1
        return super().forward(query, key, value, attn_mask, is_causal)


class MixesBatch(Attention):
    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        return out + out.mean(dim=0, keepdim=True)


class IgnoresCausal(Attention):
    def forward(self, query, key, value, attn_mask=None, is_causal=False):
        return super().forward(query, key, value, attn_mask, False)


class IgnoresMask(Attention):
    def forward(self, query, key, value, attn_mask=None, is_causal=False):
        return super().forward(query, key, value, None, is_causal)


class EmptyRowsGiveOnes(Attention):
    def forward(self, query, key, value, attn_mask=None, is_causal=False):
        out = super().forward(query, key, value, attn_mask, is_causal)
        mask = combine_masks(attn_mask, is_causal, query.shape[1], key.shape[1])
        if mask is None:
            return out
        empty = ~mask.any(-1).expand(query.shape[0], self.num_heads, query.shape[1])[:, 0].unsqueeze(-1)
        return out.masked_fill(empty, 1.0)


class MakesCpuTensors(Attention):
    def forward(self, query, *args, **kwargs):
        out = super().forward(query, *args, **kwargs)
        return out + torch.zeros(out.shape[-1], dtype=out.dtype)  # on the CPU, whatever the inputs' device


class Noisy(Attention):
    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        return out + torch.rand_like(out) * 1e-3


class NaiveSoftmax(Attention):
    def forward(self, query, key, value, attn_mask=None, is_causal=False):
        q, k, v = self.heads(query, key, value)
        weights = torch.exp(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5)  # no max subtraction: overflows
        mask = combine_masks(attn_mask, is_causal, q.shape[-2], k.shape[-2])
        if mask is not None:
            weights = weights * mask
        return merge_heads((weights / weights.sum(-1, keepdim=True).clamp_min(1e-30)) @ v)


class ShiftsByRowMax(Attention):
    """Softmax shifted by each row's largest score: amax over no key at all raises."""

    def forward(self, query, key, value, attn_mask=None, is_causal=False):
        q, k, v = self.heads(query, key, value)
        scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
        mask = combine_masks(attn_mask, is_causal, q.shape[-2], k.shape[-2])
        if mask is not None:
            scores = scores.masked_fill(~mask, -torch.inf)
        weights = torch.exp(scores - scores.amax(dim=-1, keepdim=True).clamp_min(-1e30)).nan_to_num(0.0)
        return merge_heads((weights / weights.sum(-1, keepdim=True).clamp_min(1e-30)) @ v)


class SharedShift(Attention):
    """Softmax stabilised by one shift over every score, masked and future ones too (the fault Performer had):
    exact in float64, but in float32 a hidden key with a large score flushes the visible ones to zero."""

    def forward(self, query, key, value, attn_mask=None, is_causal=False):
        q, k, v = self.heads(query, key, value)
        scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
        weights = torch.exp(scores - scores.detach().amax(dim=(-2, -1), keepdim=True))
        mask = combine_masks(attn_mask, is_causal, q.shape[-2], k.shape[-2])
        if mask is not None:
            weights = weights * mask
        total = weights.sum(-1, keepdim=True)
        return merge_heads((weights @ v) / total.masked_fill(total == 0, 1.0))


class FirstKeysOnly(Attention):
    """Right up to 256 keys, then ignores the rest: only a sequence past the default sizes shows it."""

    def forward(self, query, key, value, attn_mask=None, is_causal=False):
        return super().forward(query, key[:, :256], value[:, :256], None if attn_mask is None else attn_mask[..., :256],
                               is_causal)


def haar(width):
    q, r = torch.linalg.qr(torch.randn(width, width))
    return q * torch.sgn(torch.diagonal(r))


class RandomFeatureSoftmax(Attention):
    """Exact softmax in its forward, with FAVOR+'s random projection as a buffer: what random_features checks."""

    draw = staticmethod(haar)

    def __init__(self, d_model, num_heads=1, features=16):
        super().__init__(d_model, num_heads)
        width = d_model // num_heads
        rows = [torch.cat([self.draw(width).T for _ in range(-(-features // width))])[:features] for _ in range(num_heads)]
        self.register_buffer("projection", torch.stack(rows) * torch.randn(num_heads, features, width).norm(dim=-1, keepdim=True))


class UnsignedQrFeatures(RandomFeatureSoftmax):
    """Q of torch.linalg.qr as it comes, without the sign fix by R's diagonal: not isotropic, a biased estimate."""

    draw = staticmethod(lambda width: torch.linalg.qr(torch.randn(width, width))[0])


def favor_features(module, x):
    x = x * x.shape[-1] ** -0.25
    w = module.projection.double()
    return torch.exp(torch.einsum("bhnd,hmd->bhnm", x, w) - (x * x).sum(-1, keepdim=True) / 2) / w.shape[1] ** 0.5


RANDOM_FEATURES = {"random_features": zoo.RandomFeatures(features=favor_features, directions=lambda m: m.projection),
                   "options": {"features": 16}}


def doubled_baseline(module):
    return lambda q, k, v, attn_mask=None, is_causal=False: 2 * module(q, k, v, attn_mask, is_causal)


def make_variant(module_class, **fields):
    fields = {"reference": reference, **fields}
    return zoo.Variant(name="broken", summary="A deliberately broken variant.", family="test", citation="none",
                       factory=module_class, complexity=zoo.Complexity(2, 1), **fields)


def run(registry, check_name, variant):
    [check] = [c for c in registry.checks_for("correctness") if c.name == check_name]
    assert check.applies(variant.tags) is None
    return list(check.run(variant, PROFILE))


def sdpa_step(module, state, query, key, value, key_mask=None):
    """The test attention's decode over a KV cache (the dot-product plugin's)."""
    out, state = cached_attention(state, *module.heads(query, key, value), key_mask)
    return merge_heads(out), state


def cache_bytes(batch, context, d_model, num_heads, itemsize, **options):
    return 2 * batch * context * d_model * itemsize


def decoder(step, growth="token", state_bytes=cache_bytes):
    return zoo.Decoder(prefill=lambda module, *inputs: step(module, {}, *inputs), step=step, growth=growth,
                       state_bytes=state_bytes)


def drops_oldest(module, state, query, key, value, key_mask=None):
    """A cache that keeps only the last four tokens, as a cache with a bug in its eviction would."""
    out, state = sdpa_step(module, state, query, key, value, key_mask)
    return out, {name: cached[:, :, -4:] if cached.dim() == 4 else cached[:, -4:] for name, cached in state.items()}


def shared_by_rows(module, state, query, key, value, key_mask=None):
    """Every batch row's cache holds the first row's keys and values: a state shared between sequences."""
    return sdpa_step(module, state, query, key[:1].expand_as(key), value[:1].expand_as(value), key_mask)


def on_the_module(module, state, query, key, value, key_mask=None):
    """The cache kept on the module instead of in the state: one decode at a time works, two side by side mix."""
    if not state:
        module.cache = {}
    out, module.cache = sdpa_step(module, module.cache, query, key, value, key_mask)
    return out, {"position": 0}


def concatenated(module, state, query, key, value, key_mask=None):
    """A cache grown by torch.cat: right outputs and bytes, but the whole cache copied at every token."""
    q, k, v = module.heads(query, key, value)
    if state:
        k, v = torch.cat([state["k"], k], 2), torch.cat([state["v"], v], 2)
    mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).tril(k.shape[2] - q.shape[2])
    return merge_heads(masked_sdpa(q, k, v, mask)), {"k": k, "v": v}


def nan_when_nothing_to_see(module, state, query, key, value, key_mask=None):
    """A hand-written masked softmax: NaN for a query all of whose keys so far are padding."""
    q, k, v = module.heads(query, key, value)
    out, state = cached_attention(state, q, k, v, key_mask)
    if "key_mask" in state:
        seen = state["key_mask"].any(dim=1)  # (batch,)
        out = out.masked_fill(~seen[:, None, None, None], float("nan"))
    return merge_heads(out), state


def rotate(x, positions):
    """Rotate-half rotary embedding of (batch, heads, seq, d) at the given absolute positions."""
    half = x.shape[-1] // 2
    angles = positions.to(x.dtype)[:, None] / 100.0 ** (torch.arange(half, dtype=x.dtype) / half)
    cos, sin = angles.cos(), angles.sin()
    return torch.cat([x[..., :half] * cos - x[..., half:] * sin, x[..., half:] * cos + x[..., :half] * sin], dim=-1)


class Rotary(Attention):
    """Softmax attention with rotary positions on queries and keys."""

    def forward(self, query, key, value, attn_mask=None, is_causal=False):
        q, k, v = self.heads(query, key, value)
        q, k = rotate(q, torch.arange(q.shape[2])), rotate(k, torch.arange(k.shape[2]))
        return merge_heads(masked_sdpa(q, k, v, attn_mask, is_causal))


def rotary_step(offset: int):
    """Rotary's decode: a token at position p rotated by p (+ ``offset``: the classic bug is a step that forgets
    the prompt's length or counts it off by one)."""

    def step(module, state, query, key, value, key_mask=None):
        position = state.get("position", 0)
        shift = offset if state else 0  # the prefill counts from 0; the steps are off by ``offset``
        positions = torch.arange(position, position + query.shape[1]) + shift
        q, k, v = module.heads(query, key, value)
        out, state = cached_attention(state, rotate(q, positions), rotate(k, positions), v, key_mask)
        return merge_heads(out), {**state, "position": position + query.shape[1]}

    return step


BROKEN = [
    ("reference-float64", Scaled, {}),
    ("reference-float32", LowPrecisionInFloat32, {}),
    ("reference-low-precision", CoarseInLowPrecision, {}),
    ("baselines", Attention, {"baselines": {"doubled": doubled_baseline}}),
    ("gradcheck", WrongBackward, {}),
    ("query-permutation", QueryPosition, {}),
    ("key-permutation", KeyPosition, {}),
    ("batch-independence", MixesBatch, {}),
    ("causal-leak", IgnoresCausal, {}),
    ("masked-keys", IgnoresMask, {}),
    ("empty-rows", EmptyRowsGiveOnes, {}),
    ("dtype-device", ReturnsFloat64, {}),
    ("device-placement", MakesCpuTensors, {}),
    ("deterministic", Noisy, {}),
    ("large-magnitude", NaiveSoftmax, {}),
    ("empty-sequences", ShiftsByRowMax, {}),
    ("outlier-keys", SharedShift, {}),
    ("long-sequences", FirstKeysOnly, {}),
    ("random-features", UnsignedQrFeatures, RANDOM_FEATURES),
    ("approximation", MeanOfValues, {"approximates": "softmax", "reference": mean_reference}),
    ("decoding", Rotary, {"decoder": decoder(rotary_step(offset=1))}),
    ("decoding-state", Attention, {"decoder": decoder(sdpa_step, growth="fixed")}),
    ("decoding-isolation", Attention, {"decoder": decoder(on_the_module, state_bytes=None)}),
]


@pytest.mark.parametrize("check_name, module_class, fields", BROKEN, ids=[b[0] for b in BROKEN])
def test_check_fails_on_a_variant_broken_for_it(registry, check_name, module_class, fields):
    results = run(registry, check_name, make_variant(module_class, **fields))
    assert any(r.status == FAILED for r in results), results
    assert all(r.detail for r in results if r.status == FAILED)


@pytest.mark.parametrize("check_name", [b[0] for b in BROKEN])
def test_check_passes_on_the_correct_variant(registry, check_name):
    fields = {"baselines": {"baselines": {"sdpa": lambda m: m}}, "random-features": RANDOM_FEATURES,
              "approximation": {"approximates": "softmax"}}.get(check_name, {"decoder": decoder(sdpa_step)})  # exact softmax approximates it best
    module_class = RandomFeatureSoftmax if check_name == "random-features" else Attention
    results = run(registry, check_name, make_variant(module_class, **fields))
    assert results and all(r.status == PASSED for r in results), [r for r in results if r.status != PASSED]


def test_every_registered_correctness_check_has_a_broken_variant(registry):
    assert {c.name for c in registry.checks_for("correctness")} == {b[0] for b in BROKEN}


class GradientOnlyCausalLeak(Attention):
    """Causal in value, but gradients flow to the future: out = causal + (full - full.detach())."""

    def forward(self, query, key, value, attn_mask=None, is_causal=False):
        out = super().forward(query, key, value, attn_mask, is_causal)
        if not is_causal:
            return out
        full = super().forward(query, key, value, attn_mask, False)
        return out + (full - full.detach())


class GradientOnlyMaskLeak(Attention):
    def forward(self, query, key, value, attn_mask=None, is_causal=False):
        out = super().forward(query, key, value, attn_mask, is_causal)
        unmasked = super().forward(query, key, value, None, is_causal)
        return out + (unmasked - unmasked.detach())


class DoubledParameterGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, out, weight):
        ctx.save_for_backward(out, weight)
        return out * weight

    @staticmethod
    def backward(ctx, grad):
        out, weight = ctx.saved_tensors
        return grad * weight, 2 * (grad * out).sum().reshape(weight.shape)  # the weight's gradient is doubled


class WrongParameterGradient(Attention):
    def __init__(self, d_model, num_heads=1):
        super().__init__(d_model, num_heads)
        self.weight = nn.Parameter(torch.ones(1))

    def forward(self, *args, **kwargs):
        return DoubledParameterGradient.apply(super().forward(*args, **kwargs), self.weight.to(args[0].dtype))


def scaled_reference(module, *args, **kwargs):
    return reference(module, *args, **kwargs) * module.weight.double()


class NearlyZeroEmptyRows(EmptyRowsGiveOnes):
    """Fully masked rows give 1e-7, not 0: small, but not the zeros the convention promises."""

    def forward(self, *args, **kwargs):
        out = Attention.forward(self, *args, **kwargs)
        return out + (super().forward(*args, **kwargs) - out) * 1e-7


def scaled_by(factor: float, dtype=None):
    """A variant whose output is off by ``factor`` (only in ``dtype`` when given)."""

    class Off(Attention):
        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            return out * factor if dtype is None or out.dtype == dtype else out

    return Off


def off_in_low_precision(epsilons: int):
    """A variant off by ``epsilons`` machine epsilons in bfloat16 and float16 only: the low-precision check allows 4."""

    class Off(Attention):
        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            if out.dtype not in (torch.bfloat16, torch.float16):
                return out
            return out * (1 + epsilons * torch.finfo(out.dtype).eps)  # exactly representable in both

    return Off


class DetachedAcrossChunks(nn.Module):
    """Each position's running mean of the values, in chunks whose carried sum is detached: the forward is right,
    the backward wrong only across chunks (a chunked kernel's classic bug)."""

    def __init__(self, d_model, num_heads=1, chunk=64):
        super().__init__()
        self.chunk = chunk

    def forward(self, query, key, value, attn_mask=None, is_causal=False):
        pieces, carry = [], value.new_zeros(value.shape[0], 1, value.shape[2])
        for start in range(0, value.shape[1], self.chunk):
            running = carry + value[:, start:start + self.chunk].cumsum(1)
            pieces.append(running)
            carry = running[:, -1:].detach()
        return torch.cat(pieces, 1) / torch.arange(1, value.shape[1] + 1, dtype=value.dtype).view(1, -1, 1)


def running_mean_reference(module, query, key, value, attn_mask=None, is_causal=False):
    return value.double().cumsum(1) / torch.arange(1, value.shape[1] + 1, dtype=torch.float64).view(1, -1, 1)


FINELY_BROKEN = [
    ("reference-low-precision", off_in_low_precision(8), {}),  # 4 epsilons allowed: twice over
    ("gradcheck", DetachedAcrossChunks, {"reference": running_mean_reference, "options": {"chunk": 64},
                                         "check_options": {"chunk": 4}, "tags": zoo.Tags(
                                             accepts_attn_mask=False, supports_causal=False,
                                             allows_different_lengths=False)}),
    ("causal-leak", GradientOnlyCausalLeak, {}),
    ("masked-keys", GradientOnlyMaskLeak, {}),
    ("gradcheck", WrongParameterGradient, {"reference": scaled_reference, "tags": zoo.Tags(has_parameters=True)}),
    ("empty-rows", NearlyZeroEmptyRows, {}),
    ("reference-float64", scaled_by(1 + 1e-9), {}),  # tolerance 1e-10: ten times over
    ("reference-float32", scaled_by(1 + 1e-4, torch.float32), {}),  # tolerance 1e-5: ten times over
    ("approximation", blended(0.01), {"approximates": "softmax", "reference": mean_reference}),  # error 0.99 >= 0.98
    ("decoding", Attention, {"decoder": decoder(drops_oldest, state_bytes=None)}),
    ("decoding", Attention, {"decoder": decoder(shared_by_rows)}),
    ("decoding-state", Attention, {"decoder": decoder(sdpa_step, state_bytes=lambda batch, context, d_model, *_, **__:
                                                      batch * context * d_model * 8)}),  # the keys only: half
    ("decoding-state", Attention, {"decoder": decoder(sdpa_step, state_bytes=lambda batch, context, d_model, *_, **__:
                                                      2 * batch * context * d_model * 8)}),  # right in float64 only
    ("decoding-state", Attention, {"decoder": decoder(concatenated)}),
    ("decoding", Attention, {"decoder": decoder(nan_when_nothing_to_see)}),
]


@pytest.mark.parametrize("check_name, module_class, fields", FINELY_BROKEN,
                         ids=[f"{b[0]}-{b[1].__name__}-{i}" for i, b in enumerate(FINELY_BROKEN)])
def test_check_catches_a_fault_just_past_what_it_allows(registry, check_name, module_class, fields):
    fields = dict(fields)
    variant = zoo.Variant(name="broken", summary="A finely broken variant.", family="test", citation="none",
                          factory=module_class, reference=fields.pop("reference", reference),
                          complexity=zoo.Complexity(2, 1), **fields)
    results = run(registry, check_name, variant)
    assert any(r.status == FAILED for r in results), results


@pytest.mark.parametrize("check_name, factor, dtype", [
    ("reference-float64", 1 + 1e-11, None),  # ten times under the tolerance
    ("reference-float32", 1 + 1e-6, torch.float32),
])
def test_reference_checks_pass_just_under_their_tolerance(registry, check_name, factor, dtype):
    results = run(registry, check_name, make_variant(scaled_by(factor, dtype)))
    assert results and all(r.status == PASSED for r in results), [r for r in results if r.status != PASSED]


class Cancelling(Attention):
    """Softmax attention plus 256 minus 256 on the values: exact in float64, but in bfloat16 (spacing 2 at 256)
    and float16 (1/4) it rounds the values off, as plain torch in that precision does too."""

    def forward(self, query, key, value, attn_mask=None, is_causal=False):
        return super().forward(query, key, (value + 256) - 256, attn_mask, is_causal)


def cancelling_reference(module, query, key, value, attn_mask=None, is_causal=False):
    return reference(module, query, key, (value.double() + 256) - 256, attn_mask, is_causal)


def test_low_precision_allows_twice_plain_torchs_error_in_that_precision_and_no_more(registry):
    """FlashAttention's rule: math that rounds badly in bf16 is judged against the same math in plain torch there,
    not against 4 epsilons; the same math made twice as wrong again fails."""
    same = run(registry, "reference-low-precision", make_variant(Cancelling, reference=cancelling_reference))
    assert same and all(r.status == PASSED for r in same), [r for r in same if r.status != PASSED]
    assert max(r.value for r in same) > 4 * torch.finfo(torch.bfloat16).eps  # the 4-epsilon floor alone would fail
    assert all("plain torch's" in r.detail for r in same)

    class Worse(Cancelling):
        def forward(self, query, key, value, attn_mask=None, is_causal=False):
            out = super().forward(query, key, value, attn_mask, is_causal)
            return out + (out - super(Cancelling, self).forward(query, key, value, attn_mask, is_causal)) * 2

    worse = run(registry, "reference-low-precision", make_variant(Worse, reference=cancelling_reference))
    assert any(r.status == FAILED for r in worse), worse


def test_plain_precision_turns_a_references_upcasts_into_the_given_dtype():
    from zoo.reference import plain_precision

    x = torch.ones(3, dtype=torch.bfloat16)
    with plain_precision(torch.float16):
        made = [x.double(), x.float(), x.to(torch.float64), x.to(dtype=torch.float32), torch.zeros(2, dtype=torch.float64),
                x.new_ones(2, dtype=torch.float64), torch.arange(3).double()]
    assert [t.dtype for t in made] == [torch.float16] * len(made)
    assert x.double().dtype == torch.float64  # only inside


def test_an_approximation_a_little_better_than_the_mean_of_the_values_passes(registry):
    results = run(registry, "approximation", make_variant(blended(0.05), approximates="softmax", reference=mean_reference))
    assert results and all(r.status == PASSED for r in results), results  # error 0.95 < 0.98
    assert all(0.9 < r.value < 0.98 for r in results), [r.value for r in results]


def test_a_variant_exact_for_its_own_function_is_not_measured_against_anything(registry):
    [row] = run(registry, "approximation", make_variant(Attention))
    assert row.status == "skipped" and "approximates=None" in row.detail


@pytest.mark.parametrize("name", BUILTINS)
def test_builtins_pass_every_applicable_check(registry, name):
    variant = registry.variant(name)
    for check in registry.checks_for("correctness"):
        if check.applies(variant.tags) is None:
            results = list(check.run(variant, PROFILE))
            assert all(r.status in (PASSED, "skipped") for r in results), [r for r in results if r.status != PASSED]


@pytest.mark.parametrize("offset", [1, -1])
def test_a_rotary_decoder_whose_steps_are_off_by_one_position_is_caught_and_the_right_one_passes(registry, offset):
    wrong = run(registry, "decoding", make_variant(Rotary, decoder=decoder(rotary_step(offset))))
    assert [r.params["prefill"] for r in wrong if r.status == FAILED] and all(
        r.status == PASSED for r in wrong if r.params["prefill"] == 0)  # all steps shifted alike: invisible to rotary
    right = run(registry, "decoding", make_variant(Rotary, decoder=decoder(rotary_step(0))))
    assert right and all(r.status == PASSED for r in right), [r for r in right if r.status != PASSED]


def test_a_decoder_baseline_is_checked_like_the_decoder_and_a_wrong_one_fails_under_its_label(registry):
    right = decoder(sdpa_step)
    good = run(registry, "decoding", make_variant(Attention, decoder=zoo.Decoder(
        right.prefill, right.step, "token", cache_bytes, baselines={"same-again": decoder(sdpa_step)})))
    assert {r.versus for r in good} == {"", "same-again"} and all(r.status == PASSED for r in good)
    bad = run(registry, "decoding", make_variant(Attention, decoder=zoo.Decoder(
        right.prefill, right.step, "token", cache_bytes, baselines={"evicting": decoder(drops_oldest)})))
    failed = [r for r in bad if r.status == FAILED]
    assert failed and {r.versus for r in failed} == {"evicting"}
    assert all("decoder baseline 'evicting'" in r.detail and "first wrong position" in r.detail for r in failed)
    assert all(r.status == PASSED for r in bad if not r.versus)


@pytest.mark.parametrize("name", ["drops_oldest", "shared_by_rows"])
def test_a_wrong_cache_is_caught_by_the_decode_check_naming_where(registry, name):
    step = {"drops_oldest": drops_oldest, "shared_by_rows": shared_by_rows}[name]
    failed = [r for r in run(registry, "decoding", make_variant(Attention, decoder=decoder(step, state_bytes=None)))
              if r.status == FAILED]
    assert failed and all("first wrong position" in r.detail for r in failed), failed


def test_token_growth_allows_blocks_but_not_a_state_that_stops_growing():
    from zoo.suites.correctness import _growth_problem

    kv_cache = [100 * t for t in range(21)]
    blocks = [100 * t + 40 * (t // 4) - 30 * (t % 4) for t in range(21)]  # raw tokens compressed every 4
    stops = [100 * min(t, 8) for t in range(21)]  # a window's cache, declared as a growing one
    assert _growth_problem("token", kv_cache) is None
    assert _growth_problem("token", blocks) is None
    assert "added no bytes" in _growth_problem("token", stops)
    assert _growth_problem("token", [0] * 21) is not None


@pytest.mark.parametrize("name", ["windowed", "block-sparse", "native-sparse"])
def test_the_long_sequence_check_also_compares_a_sparse_built_ins_blocked_path_where_its_dense_shortcut_ran(
        registry, name, monkeypatch):
    """At the default sizes and the check's length, the sparse built-ins hand the sequence to one dense call; the
    check runs each such case again with the shortcut off, and there the blocked path is what it compares (a fault
    only in the blocked path then fails it)."""
    from zoo.functional import dense_shortcuts
    from zoo.suites.correctness import check_long_sequences

    variant = registry.variant(name)
    rows = list(check_long_sequences(variant, PROFILE))
    blocked = [r for r in rows if r.setting.endswith("blocked path (dense shortcut off)")]
    assert blocked and len(blocked) == len(rows) - len(blocked) and all(r.status == PASSED for r in rows), rows
    with dense_shortcuts(allowed=False) as watch:
        module = zoo.create(name, d_model=16, num_heads=2, registry=registry)
        x = torch.randn(1, 300, 16)
        module(x, x, x, is_causal=variant.tags.modes == ("causal",))
    assert watch.taken == 0

    wrong = variant.reference  # a twin whose output and reference part only with the shortcut off
    sparse = dataclasses.replace(variant, reference=lambda module, q, k, v, attn_mask=None, is_causal=False:
                                 wrong(module, q, k, v, attn_mask, is_causal) * (1.0 if _dense_now() else 1.001))
    assert [r.status for r in check_long_sequences(sparse, PROFILE)].count(FAILED) == len(blocked)


def _dense_now() -> bool:
    from zoo.functional import _SHORTCUTS

    watch = _SHORTCUTS.get()
    return watch is None or watch.allowed
