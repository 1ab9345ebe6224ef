"""Every branch of the contract's validation and of the zoo's input and output checks rejects what it
should, with a message naming the variant and the culprit."""

import pytest
import torch
from torch import nn

import zoo
from conftest import minimal_variant
from twins import ReturnsFloat64
from zoo.api import build
from zoo.contract import RegistrationError, VariantInputError, VariantOutputError




@pytest.mark.parametrize("changes, message", [
    ({"name": "Bad Name"}, "does not match"),
    ({"name": 3}, "does not match"),
    ({"summary": "two\nlines"}, "summary must be one non-empty line"),
    ({"family": " "}, "family must be one non-empty line"),
    ({"citation": None}, "citation must be one non-empty line"),
    ({"factory": "not callable"}, "factory must be callable"),
    ({"reference": None}, "reference must be callable"),
    ({"tags": {"exact": True}}, "tags must be a zoo.Tags"),
    ({"complexity": (2, 1)}, "complexity must be a zoo.Complexity"),
    ({"options": {"d_model": 3}}, "options may not be named ['d_model']: the harness passes these beside the "
                                  "options (d_model to factory, flops and decoder.state_bytes)"),
    ({"options": {"k_len": 3, "batch": 2}}, "options may not be named ['batch', 'k_len']: the harness passes "
                                            "these beside the options (batch to flops and decoder.state_bytes; "
                                            "k_len to flops)"),
    ({"options": {"itemsize": 4}}, "options may not be named ['itemsize']"),
    ({"options": {"variant": "a"}}, "options may not be named ['variant']: the harness passes these beside the "
                                    "options (variant to zoo.build and the quality suite's models)"),
    ({"targets": ("fast",)}, "targets must be zoo.Target"),
    ({"tags": zoo.Tags(causal_only=True, supports_causal=False, key_order_invariant=False)},
     "causal_only needs tags.supports_causal=True"),
    ({"tags": zoo.Tags(causal_only=True)}, "causal_only needs tags.key_order_invariant=False"),
    ({"options": {"window": 4}, "check_options": {"chunk": 2}}, "check_options ['chunk'] are not among its options"),
    ({"options": {"window": 4}, "quality_options": {"chunk": 2}}, "quality_options ['chunk'] are not among its options"),
    ({"options": {"max_len": 64}, "quality_options": {"max_len": 16}}, "quality_options ['max_len'] are arguments of "
                                                                      "the quality suite's own models"),
    ({"baselines": {"other": 3}}, "baseline 'other' must be callable"),
    ({"floors": {"bare-op": None}}, "floor 'bare-op' must be callable"),
    ({"baselines": {"same": lambda m: m}, "floors": {"same": lambda m: m}}, "['same'] named both a baseline and a floor"),
    ({"peers": {"flex": None}}, "peer 'flex' must be callable"),
    ({"baselines": {"as-class": torch.nn.MultiheadAttention}}, "baseline 'as-class' is the class MultiheadAttention; "
                                                                "a baseline is make(module) -> fn(query, key, value"),
    ({"floors": {"no-module": lambda: None}}, "floor 'no-module' has the signature (), but a floor is called with "
                                              "the variant's module alone"),
    ({"peers": {"two": lambda module, q: q}}, "peer 'two' has the signature (module, q)"),
    ({"flops": 4.0}, "flops must be callable: flops(batch=, q_len=, k_len=, d_model=, num_heads=, **options)"),
    ({"flops": lambda b, q, k, d, h: 1.0}, "flops has the signature (b, q, k, d, h), but it is called as flops(batch="),
    ({"options": {"window": 4}, "flops": lambda batch, q_len, k_len, d_model, num_heads: 1.0},
     "unexpected keyword argument 'window'"),
    ({"error_sweeps": {"features": (16,)}}, "error_sweeps needs approximates="),
    ({"approximates": "softmax", "error_sweeps": {"features": (16,)}}, "error_sweeps option 'features' is not among"),
    ({"approximates": "softmax", "options": {"features": 8}, "error_sweeps": {"features": ()}}, "must be a non-empty tuple"),
    ({"state_dials": {"window": (2,)}}, "state_dials option 'window' is not among its options"),
    ({"options": {"window": 4}, "state_dials": {"window": ()}}, "state_dials['window'] must be a non-empty tuple"),
    ({"options": {"window": 4}, "state_dials": {"window": (2,)}}, "state_dials needs a decoder with state_bytes"),
    ({"baselines": {"same": lambda m: m}, "peers": {"same": lambda m: m}}, "['same'] named both a baseline and a peer"),
    ({"best_known": "fastest"}, "best_known 'fastest' is neither one of its baselines [] nor 'torch-sdpa'"),
    ({"peers": {"flex": lambda m: m}, "best_known": "flex"}, "best_known 'flex' is neither one of its baselines"),
    ({"best_known": "torch-mha-layer"}, "nor 'torch-sdpa', the op a core is compared with"),
    ({"approximates": "Soft Max"}, "approximates must be None, 'softmax' or a variant name"),
    ({"approximates": True}, "approximates must be None"),
    ({"approximates": "good"}, "approximates names the variant itself"),
    ({"departures": ["a list of text"]}, "departures must be a tuple of zoo.Departure"),
    ({"departures": ("plain text",)}, "departures must be a tuple of zoo.Departure"),
    ({"random_features": lambda module, x: x}, "random_features must be a zoo.RandomFeatures"),
    ({"random_features": zoo.RandomFeatures(features=None)}, "random_features.features must be callable"),
    ({"random_features": zoo.RandomFeatures(features=abs, directions="rows")}, "random_features.directions must be"),
])
def test_each_invalid_variant_field_is_refused_by_name(changes, message):
    with pytest.raises(RegistrationError, match=None) as caught:
        minimal_variant(**changes).validate()
    assert message in str(caught.value)


def _step(module, state, query, key, value, key_mask=None):
    return query, state


def _decoder(**fields):
    return zoo.Decoder(**{"prefill": lambda module, *inputs: _step(module, {}, *inputs), "step": _step,
                          "growth": "token", **fields})


@pytest.mark.parametrize("baselines, message", [
    ([_decoder()], "decoder.baselines must be a dict of label -> Decoder, got list"),
    ({"": _decoder()}, "decoder.baselines label '' must be a non-empty string"),
    ({"explicit": _step}, "decoder.baselines['explicit'] must be a zoo.Decoder without baselines of its own"),
    ({"nested": _decoder(baselines={"inner": _decoder()})}, "without baselines of its own"),
    ({"context": _decoder(context=True)}, "must decode as the variant's decoder does (context=False)"),
    ({"broken": _decoder(growth="sometimes")}, "decoder.growth must be one of"),
    ({"mha-kv-cache": _decoder()}, "decoder.baselines label 'mha-kv-cache' is taken"),
    ({"good": _decoder()}, "decoder.baselines label 'good' is taken"),
])
def test_a_decoder_baseline_is_a_plain_decoder_of_the_same_kind_or_refused_by_name(baselines, message):
    with pytest.raises(RegistrationError) as caught:
        minimal_variant(decoder=_decoder(baselines=baselines)).validate()
    assert message in str(caught.value) and "variant 'good'" in str(caught.value)


@pytest.mark.parametrize("kind, text, message", [
    ("misread", "a line", "departure kind 'misread' is not one of convention, omission, substitution, extension"),
    ("omission", "two\nlines", "departure text must be one non-empty line"),
    ("omission", " ", "departure text must be one non-empty line"),
])
def test_a_departure_has_a_known_kind_and_one_line(kind, text, message):
    with pytest.raises(RegistrationError) as caught:
        zoo.Departure(kind, text)
    assert message in str(caught.value)


def test_every_builtin_states_how_it_departs_from_its_paper(registry):
    """Each built-in's reference is written beside its fast path; what it changes from the paper is stated."""
    for name in registry.list_variants():
        departures = registry.variant(name).departures
        assert departures and all(isinstance(d, zoo.Departure) for d in departures), name
        assert registry.variant(name).card()["departures"][0] == {"kind": departures[0].kind, "text": departures[0].text}


def test_the_deprecated_exact_tag_still_works_and_says_what_to_write_instead():
    with pytest.warns(DeprecationWarning, match="approximates='softmax'"):
        tags = zoo.Tags(exact=False)
    assert minimal_variant(tags=tags).approximates == "softmax" and "exact" not in tags.describe()
    with pytest.warns(DeprecationWarning, match="leave it out"):
        assert minimal_variant(tags=zoo.Tags(exact=True)).approximates is None


@pytest.mark.parametrize("bounds, message", [
    ({}, "give at_most, at_least or both"),
    ({"at_most": "3"}, "at_most must be a finite number, got '3'"),
    ({"at_least": True}, "at_least must be a finite number"),
    ({"at_most": float("nan")}, "at_most must be a finite number"),
    ({"at_least": 2, "at_most": 1}, "at_least 2 is above at_most 1"),
])
def test_a_target_needs_a_finite_bound_and_names_the_check(bounds, message):
    with pytest.raises(RegistrationError) as caught:
        zoo.Target("peak-fraction", **bounds)
    assert message in str(caught.value) and "'peak-fraction'" in str(caught.value)


def test_a_target_is_met_inside_its_bounds_only():
    ceiling, floor, band = zoo.Target("x", 3), zoo.Target("x", at_least=0.4), zoo.Target("x", 2, at_least=1)
    assert ceiling.met_by(3) and not ceiling.met_by(3.01) and ceiling.bound() == "at most 3"
    assert floor.met_by(0.4) and not floor.met_by(0.39) and floor.bound() == "at least 0.4"
    assert band.met_by(1.5) and not band.met_by(0.9) and not band.met_by(2.1) and band.bound() == "1 to 2"


@pytest.mark.parametrize("time, memory", [(0, 1), (5, 1), (2, -1), ("2", 1)])
def test_complexity_claims_must_be_exponents_in_range(time, memory):
    with pytest.raises(RegistrationError, match="complexity"):
        zoo.Complexity(time, memory)


class Plain(nn.Module):
    def __init__(self, d_model, num_heads=1):
        super().__init__()

    def forward(self, query, key, value, attn_mask=None, is_causal=False):
        return query.clone()


def _module(tags=zoo.Tags(), factory=Plain):
    return build(minimal_variant(factory=factory, tags=tags), d_model=8, num_heads=2)


X = torch.randn(2, 5, 8)


@pytest.mark.parametrize("tags, call, message", [
    (zoo.Tags(), lambda m: m(X[0], X, X), "query must be a (batch, seq, dim) tensor"),
    (zoo.Tags(), lambda m: m(X, X[:1], X[:1]), "batch sizes differ"),
    (zoo.Tags(), lambda m: m(X, X, X[:, :4]), "key and value lengths differ"),
    (zoo.Tags(), lambda m: m(torch.randn(2, 5, 6), X, X), "query feature size 6 != d_model 8"),
    (zoo.Tags(), lambda m: m(X, torch.randn(2, 5, 6), torch.randn(2, 5, 6)), "allows_kv_dims is False"),
    (zoo.Tags(allows_different_lengths=False), lambda m: m(X, X[:, :3], X[:, :3]), "allows_different_lengths is False"),
    (zoo.Tags(supports_causal=False), lambda m: m(X, X, X, is_causal=True), "supports_causal is False"),
    (zoo.Tags(accepts_attn_mask=False), lambda m: m(X, X, X, attn_mask=torch.ones(5, 5, dtype=torch.bool)),
     "accepts_attn_mask is False"),
    (zoo.Tags(), lambda m: m(X, X, X, attn_mask=torch.ones(5, 5)), "must be a boolean tensor"),
    (zoo.Tags(), lambda m: m(X, X, X, attn_mask=torch.ones(3, 5, 5, dtype=torch.bool)), "does not broadcast"),
    (zoo.Tags(), lambda m: m(X, X, X, attn_mask=torch.ones(1, 1, 1, 1, 5, dtype=torch.bool)), "does not broadcast"),
    (zoo.Tags(), lambda m: m(X, X, X, dropout=0.1), "unexpected argument 'dropout'"),
    (zoo.Tags(), lambda m: m(X, X), "missing value"),
])
def test_each_input_check_names_the_variant_and_the_problem(tags, call, message):
    with pytest.raises(VariantInputError) as caught:
        call(_module(tags))
    assert "variant 'good'" in str(caught.value) and message in str(caught.value)


class ReturnsWrongShape(Plain):
    def forward(self, query, *args, **kwargs):
        return query[:, :1]


class ReturnsTuple(Plain):
    def forward(self, query, *args, **kwargs):
        return query, None


@pytest.mark.parametrize("factory, message", [
    (ReturnsWrongShape, "returned shape (2, 1, 8)"),
    (ReturnsFloat64, "dtype and device must be preserved"),
    (ReturnsTuple, "returned tuple, not a tensor"),
])
def test_each_output_check_names_the_variant_and_the_problem(factory, message):
    with pytest.raises(VariantOutputError) as caught:
        _module(factory=factory)(X, X, X)
    assert "variant 'good'" in str(caught.value) and message in str(caught.value)


def test_a_runs_option_wins_over_the_plugins_quality_options():
    variant = minimal_variant(options={"window": 128, "block": 128}, quality_options={"window": 16, "block": 16})
    assert variant.card()["quality_options"] == {"window": "16", "block": "16"}
    run = variant.with_defaults({"window": 7})
    assert run.options == {"window": 7, "block": 128} and run.quality_options == {"block": 16}


def test_every_builtin_whose_structure_the_quality_tasks_would_not_reach_trains_with_smaller_options(registry):
    """A window, blocks or a projection at least as long as the longest quality task (144 tokens) would make the
    variant dense attention there: those plugins give quality options under it."""
    from zoo.tasks import default_tasks

    longest = max(task.length for task in default_tasks())
    for name, key in (("windowed", "window"), ("block-sparse", "block"), ("linformer", "proj_len")):
        variant = registry.variant(name)
        assert variant.quality_options[key] < min(longest, variant.options[key]), name


def test_a_causal_only_variant_is_refused_a_non_causal_call_and_names_its_one_mode():
    class First(nn.Module):
        def forward(self, query, key, value, attn_mask=None, is_causal=False):
            return query

    variant = minimal_variant(tags=zoo.Tags(causal_only=True, key_order_invariant=False),
                              factory=lambda d_model, num_heads=1: First())
    assert variant.tags.modes == ("causal",) and variant.tags.primary_mode == "causal"
    assert zoo.Tags().modes == ("full", "causal") and zoo.Tags(supports_causal=False).modes == ("full",)
    module = build(variant, d_model=8, num_heads=2)
    x = torch.randn(1, 5, 8)
    assert module(x, x, x, is_causal=True).shape == (1, 5, 8)
    with pytest.raises(VariantInputError, match="is_causal=False is not supported .*causal_only"):
        module(x, x, x)
