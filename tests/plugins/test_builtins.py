"""Each built-in variant against its float64 reference and, where named, against the torch module,
on random shapes (hypothesis) including q_len != k_len, masks and causal mode."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import zoo
from zoo.cases import relative_error
from zoo.measure import peak_memory
from conftest import BUILTINS

SMALL_OPTIONS = {"windowed": {"window": 3, "block": 4}, "linear": {"chunk": 4}, "additive": {"chunk_rows": 3},
                 "performer": {"features": 16, "chunk": 4}, "retention": {"chunk": 4},
                 "block-sparse": {"block": 2, "random_blocks": 1},
                 "linformer": {"proj_len": 4, "max_len": 32}, "native-sparse": {"block": 3, "selected": 2, "window": 2}}


@st.composite
def calls(draw, variant):
    tags = variant.tags
    heads = draw(st.sampled_from([1, 2, 4]))
    d_model = heads * draw(st.sampled_from([2, 4, 8]))
    q_len = draw(st.integers(1, 19))
    k_len = draw(st.integers(1, 19)) if tags.allows_different_lengths else q_len
    causal = draw(st.sampled_from([mode == "causal" for mode in tags.modes]))  # the modes it computes
    mask_kind = draw(st.sampled_from([None, "full", "padding"])) if tags.accepts_attn_mask else None
    batch = draw(st.integers(1, 3))
    seed = draw(st.integers(0, 2 ** 16))
    return batch, q_len, k_len, d_model, heads, causal, mask_kind, seed


def _inputs(batch, q_len, k_len, d_model, mask_kind, seed, dtype):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, n, d_model, generator=g, dtype=torch.float64).to(dtype) for n in (q_len, k_len, k_len))
    mask = None
    if mask_kind == "full":
        mask = torch.rand(batch, 1, q_len, k_len, generator=g) > 0.3
    elif mask_kind == "padding":
        mask = torch.rand(batch, 1, 1, k_len, generator=g) > 0.3
    return q, k, v, mask


def _plain_error(variant, module, plain, exact, out, inputs):
    """The error of plain torch in the working precision: the reference on the rounded inputs and weights and,
    where the variant's output still errs more than twice that, its most accurate baseline computed in the
    precision (an output of cancelling terms, e.g. un-normalised linear attention, loses digits in any float32)."""
    error = relative_error(plain, exact)
    if relative_error(out, exact) <= 2 * error or not variant.baselines:
        return error
    q, k, v, mask, causal = inputs
    with torch.no_grad():
        errors = [relative_error(build(module)(q, k, v, attn_mask=mask, is_causal=causal), exact)
                  for build in variant.baselines.values()]
    return max(error, min(errors))


@pytest.mark.parametrize("name", BUILTINS)
def test_matches_float64_reference_on_random_shapes(registry, name):
    variant = registry.variant(name)

    @settings(max_examples=25, deadline=None)
    @given(calls(variant))
    def check(call):
        batch, q_len, k_len, d_model, heads, causal, mask_kind, seed = call
        torch.manual_seed(seed)
        module = zoo.create(name, d_model=d_model, num_heads=heads, registry=registry, **SMALL_OPTIONS.get(name, {}))
        exact = None
        for dtype in (torch.float64, torch.float32):
            module = module.to(dtype)
            q, k, v, mask = _inputs(batch, q_len, k_len, d_model, mask_kind, seed, dtype)
            with torch.no_grad():
                out = module(q, k, v, attn_mask=mask, is_causal=causal)
                plain = variant.reference(module, q, k, v, attn_mask=mask, is_causal=causal)
            assert out.shape == (batch, q_len, d_model) and out.dtype == dtype
            if exact is None:
                exact = plain
                assert relative_error(out, exact) <= 1e-10, (dtype, call)
            else:  # FlashAttention's rule: at most twice the error of plain torch in the same precision (or 1e-5)
                assert relative_error(out, exact) <= max(1e-5, 2 * _plain_error(variant, module, plain, exact, out,
                                                                               (q, k, v, mask, causal))), (dtype, call)

    check()


def _copy_into_torch_mha(module, kdim=None, vdim=None):
    mha = torch.nn.MultiheadAttention(module.d_model, module.num_heads, batch_first=True, kdim=kdim, vdim=vdim).double()
    state = module.state_dict()
    if mha._qkv_same_embed_dim and "q_proj_weight" in state:
        state["in_proj_weight"] = torch.cat([state.pop(f"{x}_proj_weight") for x in "qkv"])
    mha.load_state_dict(state)
    return mha


@pytest.mark.parametrize("causal", [False, True])
def test_multi_head_equals_torch_multihead_attention(registry, causal):
    torch.manual_seed(0)
    module = zoo.create("multi-head", d_model=24, num_heads=3, registry=registry).double()
    mha = _copy_into_torch_mha(module)
    q, k = torch.randn(2, 9, 24, dtype=torch.float64), torch.randn(2, 9, 24, dtype=torch.float64)
    blocked = ~torch.ones(9, 9, dtype=torch.bool).tril() if causal else None  # torch: True = may NOT attend
    expected = mha(q, k, k, attn_mask=blocked, need_weights=False)[0]
    assert torch.allclose(module(q, k, k, is_causal=causal), expected, atol=1e-12, rtol=0)


def test_multi_head_loads_torch_weights_directly(registry):
    mha = torch.nn.MultiheadAttention(16, 4, batch_first=True).double()
    module = zoo.create("multi-head", d_model=16, num_heads=4, registry=registry).double()
    module.load_state_dict(mha.state_dict())
    x = torch.randn(1, 6, 16, dtype=torch.float64)
    assert torch.allclose(module(x, x, x), mha(x, x, x, need_weights=False)[0], atol=1e-12, rtol=0)


@pytest.mark.parametrize("kdim, vdim", [(24, 8), (None, None)])
def test_cross_equals_torch_multihead_attention_with_kdim_vdim(registry, kdim, vdim):
    torch.manual_seed(1)
    module = zoo.create("cross", d_model=16, num_heads=4, kdim=kdim, vdim=vdim, registry=registry).double()
    mha = _copy_into_torch_mha(module, kdim, vdim)
    q = torch.randn(2, 5, 16, dtype=torch.float64)
    k = torch.randn(2, 13, kdim or 16, dtype=torch.float64)
    v = torch.randn(2, 13, vdim or 16, dtype=torch.float64)
    padding = torch.rand(2, 13) > 0.3
    padding[:, 0] = True
    expected = mha(q, k, v, key_padding_mask=~padding, need_weights=False)[0]
    out = module(q, k, v, attn_mask=padding[:, None, None, :])
    assert torch.allclose(out, expected, atol=1e-12, rtol=0)


@pytest.mark.parametrize("causal", [False, True])
def test_windowed_equals_dense_sdpa_with_band_mask(registry, causal):
    module = zoo.create("windowed", d_model=16, num_heads=2, window=5, block=8, registry=registry).double()
    n = 37
    x = torch.randn(1, n, 16, dtype=torch.float64)
    i, j = torch.arange(n).view(-1, 1), torch.arange(n).view(1, -1)
    band = (j - i >= -5) & (j - i <= (0 if causal else 5))
    heads = x.view(1, n, 2, 8).transpose(1, 2)
    expected = F.scaled_dot_product_attention(heads, heads, heads, attn_mask=band).transpose(1, 2).reshape(1, n, 16)
    assert torch.allclose(module(x, x, x, is_causal=causal), expected, atol=1e-12, rtol=0)


@pytest.mark.parametrize("name, causal", [("windowed", False), ("windowed", True), ("linear", True), ("linear", False),
                                         ("retention", True), ("retention", False)])
def test_subquadratic_variants_never_hold_an_n_by_n_tensor(registry, name, causal):
    module = zoo.create(name, d_model=64, num_heads=1, registry=registry)
    peaks = {}
    for n in (2048, 8192):
        x = torch.randn(1, n, 64, requires_grad=True)
        peaks[n] = peak_memory(lambda: module(x, x, x, is_causal=causal).sum().backward())
    assert peaks[8192] < 8192 * 8192  # an n x n boolean mask alone would take n^2 bytes
    assert peaks[8192] / peaks[2048] < 6  # 4x the length: linear growth gives 4x, quadratic 16x


def test_additive_memory_is_bounded_like_the_score_matrix(registry):
    n, variant = 512, registry.variant("additive")
    module = zoo.create("additive", d_model=64, num_heads=1, registry=registry)
    naive = variant.baselines["naive-broadcast"](module)
    x = torch.randn(1, n, 64, requires_grad=True)
    with torch.no_grad():
        ours_fwd, naive_fwd = peak_memory(lambda: module(x, x, x)), peak_memory(lambda: naive(x, x, x))
    ours_train = peak_memory(lambda: module(x, x, x).sum().backward())
    naive_train = peak_memory(lambda: naive(x, x, x).sum().backward())
    assert ours_fwd <= naive_fwd / 8 and ours_train <= naive_train / 4


def test_linear_equals_quadratic_form_of_its_kernel(registry):
    module = zoo.create("linear", d_model=8, num_heads=2, chunk=3, registry=registry).double()
    x = torch.randn(2, 10, 8, dtype=torch.float64)
    phi = F.elu(x.view(2, 10, 2, 4).transpose(1, 2)) + 1
    v = x.view(2, 10, 2, 4).transpose(1, 2)
    similarity = (phi @ phi.transpose(-1, -2)).tril()
    expected = ((similarity @ v) / similarity.sum(-1, keepdim=True)).transpose(1, 2).reshape(2, 10, 8)
    assert torch.allclose(module(x, x, x, is_causal=True), expected, atol=1e-12, rtol=0)


def test_causal_linear_backward_is_its_own_and_gradcheck_clean():
    """The chunk states' exclusive prefix has a backward written for it (no flips, as autograd's cumsum
    backward makes); gradients agree with float64 finite differences."""
    from zoo.functional import ExclusivePrefixSum, kernel_attention

    x = torch.randn(2, 3, 5, 4, dtype=torch.float64, requires_grad=True)
    assert torch.equal(ExclusivePrefixSum.apply(x, 2), x.cumsum(2) - x)
    assert torch.autograd.gradcheck(lambda t: ExclusivePrefixSum.apply(t, 2), (x,))
    fq, fk = (torch.rand(2, 2, 11, 4, dtype=torch.float64, requires_grad=True) for _ in range(2))
    v = torch.randn(2, 2, 11, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b, c: kernel_attention(a, b, c, is_causal=True, chunk=4), (fq, fk, v))
    with torch.autograd.profiler.profile() as run:
        kernel_attention(fq, fk, v, is_causal=True, chunk=4).sum().backward()
    assert not any(event.name == "aten::flip" for event in run.function_events)


@pytest.mark.parametrize("name", BUILTINS)
def test_builtins_keep_every_tensor_on_their_inputs_device(registry, name):
    """Checked on the meta device, the CI's stand-in for a GPU: not skipped, passed in every case."""
    from zoo.profiles import get_profile
    from zoo.suites.correctness import check_device_placement

    results = list(check_device_placement(registry.variant(name), get_profile("quick")))
    assert results and all(r.status == "passed" for r in results), [r for r in results if r.status != "passed"]


def test_rotary_scores_depend_on_offsets_only(registry):
    """Prepending tokens no one attends to shifts every position alike, so RoPE leaves the outputs unchanged
    (absolute position embeddings would change them), while a plain reordering of the keys changes them."""
    torch.manual_seed(2)
    module = zoo.create("rotary", d_model=16, num_heads=2, registry=registry).double()
    x = torch.randn(1, 7, 16, dtype=torch.float64)
    shifted = torch.cat((torch.randn(1, 5, 16, dtype=torch.float64), x), dim=1)
    visible = torch.arange(12) >= 5
    with torch.no_grad():
        plain = module(x, x, x, is_causal=True)
        moved = module(shifted, shifted, shifted, attn_mask=visible, is_causal=True)[:, 5:]
        reversed_keys = module(x, x.flip(1), x.flip(1))
    assert torch.allclose(moved, plain, atol=1e-12, rtol=0)
    assert not torch.allclose(reversed_keys, module(x, x, x), atol=1e-6)


def test_rotary_equals_llama_style_complex_rotation(registry):
    module = zoo.create("rotary", d_model=32, num_heads=4, registry=registry).double()
    complex_rope = registry.variant("rotary").baselines["complex-rope"](module)
    q, k = torch.randn(2, 9, 32, dtype=torch.float64), torch.randn(2, 11, 32, dtype=torch.float64)
    with torch.no_grad():
        assert torch.allclose(module(q, k, k), complex_rope(q, k, k), atol=1e-12, rtol=0)


@pytest.mark.parametrize("causal", [False, True])
def test_retention_parallel_chunked_and_recurrent_forms_agree(registry, causal):
    """The fast path (chunked, chunk 5 over 23 tokens), the parallel baseline and the recurrent reference."""
    module = zoo.create("retention", d_model=24, num_heads=3, chunk=5, registry=registry).double()
    q, k, v = (torch.randn(2, 23, 24, dtype=torch.float64) for _ in range(3))
    parallel = registry.variant("retention").baselines["parallel"](module)
    recurrent = registry.variant("retention").reference(module, q, k, v, is_causal=causal)
    assert torch.allclose(module(q, k, v, is_causal=causal), recurrent, atol=1e-10, rtol=0)
    assert torch.allclose(parallel(q, k, v, is_causal=causal), recurrent, atol=1e-10, rtol=0)


@pytest.mark.parametrize("causal", [False, True])
def test_retention_sums_the_chunk_states_by_matrix_up_to_its_limit_and_by_loop_beyond(registry, causal):
    """Both ways of finding the states entering the chunks match the recurrent reference, with gradients: up to
    matrix_chunks chunks the (chunks x chunks) product, past it the loop; a bad limit is one clear error."""
    for chunks in (4, 5, 7):
        module = zoo.create("retention", d_model=4, num_heads=2, chunk=1, matrix_chunks=4, registry=registry).double()
        q, k, v = (torch.randn(1, chunks, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
        expected = registry.variant("retention").reference(module, q, k, v, is_causal=causal)
        assert torch.allclose(module(q, k, v, is_causal=causal), expected, atol=1e-10, rtol=0), chunks
        assert torch.autograd.gradcheck(lambda *x: module(*x, is_causal=causal), (q, k, v)), chunks
    with pytest.raises(ValueError, match="matrix_chunks must be an integer >= 0, got -1"):
        zoo.create("retention", d_model=4, num_heads=2, matrix_chunks=-1, registry=registry)


@pytest.mark.parametrize("causal", [False, True])
def test_retention_is_softmax_free_decayed_attention(registry, causal):
    """One head, d = 1, no decay-free shortcut: o_n is the RMS-normalised sum_m gamma^|n-m| q_n k_m v_m."""
    module = zoo.create("retention", d_model=1, num_heads=1, chunk=2, registry=registry).double()
    q, k, v = (torch.tensor([[[a], [b], [c]]], dtype=torch.float64) for a, b, c in ((1, 2, 3), (1, -1, 2), (3, 1, -2)))
    gamma = 1 - 2 ** -5
    raw = [sum(gamma ** abs(i - j) * q[0, i, 0] * k[0, j, 0] * v[0, j, 0] for j in range(3) if j <= i or not causal)
           for i in range(3)]
    expected = torch.tensor([[[r / (r * r + module.eps) ** 0.5] for r in raw]], dtype=torch.float64)
    assert torch.allclose(module(q, k, v, is_causal=causal), expected, atol=1e-12, rtol=0)


def test_retention_decays_are_retnets_for_every_head(registry):
    """Head h decays by gamma_h = 1 - 2^(-5 - h) (RetNet, Sun et al. 2023), not a spread of exponents over 5-12:
    three heads of width 1, each checked with its own gamma as in the one-head test above."""
    module = zoo.create("retention", d_model=3, num_heads=3, chunk=2, registry=registry).double()
    torch.manual_seed(4)
    q, k, v = (torch.randn(1, 5, 3, dtype=torch.float64) for _ in range(3))
    out = module(q, k, v, is_causal=True)
    for h in range(3):
        gamma = 1 - 2.0 ** (-5 - h)
        raw = [sum(gamma ** (i - j) * q[0, i, h] * k[0, j, h] * v[0, j, h] for j in range(i + 1)) for i in range(5)]
        expected = torch.tensor([r / (r * r + module.eps) ** 0.5 for r in raw], dtype=torch.float64)
        assert torch.allclose(out[0, :, h], expected, atol=1e-12, rtol=0), h


def test_retention_still_decays_in_half_precision(registry):
    """gamma = 1 - 2^-12 is 1 in float16: the decays must be raised to their powers in float32."""
    torch.manual_seed(3)
    module = zoo.create("retention", d_model=64, num_heads=8, registry=registry)
    q, k, v = (torch.randn(1, 300, 64, dtype=torch.float64) for _ in range(3))
    expected = registry.variant("retention").reference(module, q, k, v, is_causal=True)
    out = module.half()(q.half(), k.half(), v.half(), is_causal=True)
    assert relative_error(out, expected) < 4 * torch.finfo(torch.float16).eps


@pytest.mark.parametrize("causal", [False, True])
def test_block_sparse_reads_the_bigbird_pattern(registry, causal):
    """Each non-global query block away from the edges reads its window, the global blocks and its random
    draws: 3 + 1 + 2 blocks with the defaults (2 + 1 + 2 when causal), and the dense pattern has exactly those."""
    from zoo_builtins.block_sparse import layout_mask

    module = zoo.create("block-sparse", d_model=16, num_heads=1, registry=registry)
    blocks = 4096 // module.block
    rows = module.key_blocks(blocks, causal)
    assert rows[0] == ([0] if causal else list(range(blocks)))  # the global block's queries see every key
    assert all(len(row) == (5 if causal else 6) for row in rows[8:-1])
    pattern = layout_mask(module, 4096, causal)[::module.block, ::module.block]  # one token per block pair
    for i in (9, 40, blocks - 1):
        assert pattern[i].nonzero().flatten().tolist() == rows[i]
    assert pattern[module.global_blocks:].float().mean() < 0.1


@pytest.mark.parametrize("causal", [False, True])
def test_block_sparse_memory_grows_linearly_and_stays_below_the_dense_pattern(registry, causal):
    module = zoo.create("block-sparse", d_model=64, num_heads=1, registry=registry)
    dense = registry.variant("block-sparse").baselines["dense-sdpa-layout"](module)
    peaks = {}
    for n in (2048, 8192):
        x = torch.randn(1, n, 64, requires_grad=True)
        peaks[n] = peak_memory(lambda: module(x, x, x, is_causal=causal).sum().backward())
    assert peaks[8192] / peaks[2048] < 6  # 4x the length: linear growth gives 4x, quadratic 16x
    x = torch.randn(1, 8192, 64, requires_grad=True)
    assert peaks[8192] < peak_memory(lambda: dense(x, x, x, is_causal=causal).sum().backward()) / 4


@pytest.mark.parametrize("name, sparse_path", [("windowed", {"dense_fraction": None}),
                                               ("block-sparse", {"dense_fraction": None}),
                                               ("native-sparse", {"dense_fraction": None}),
                                               ("based", {"form": "chunked"})])
def test_a_short_sequence_takes_the_dense_form_and_gets_the_same_output(registry, name, sparse_path):
    """At n=256 the defaults hand the call to the cheaper dense (or quadratic) form: other ops run, and the output
    and gradients are those of the sparse path to float64 rounding, with a user mask if it takes one."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class OpNames(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(str(func))
            return func(*args, **(kwargs or {}))

    variant = registry.variant(name)
    torch.manual_seed(0)
    default = zoo.create(name, d_model=32, num_heads=2, registry=registry).double()
    forced = zoo.create(name, d_model=32, num_heads=2, registry=registry, **sparse_path).double()
    forced.load_state_dict(default.state_dict())
    n = 256
    x = torch.randn(1, n, 32, dtype=torch.float64, requires_grad=True)
    mask = None
    if variant.tags.accepts_attn_mask:
        mask = torch.rand(1, 1, n, n, generator=torch.Generator().manual_seed(1)) > 0.5
        mask[..., 7, :] = False  # a row with no key: zeros either way
    outputs, gradients, ops = [], [], []
    for module in (default, forced):
        with OpNames() as recorder:
            out = module(x, x, x, attn_mask=mask, is_causal=variant.tags.causal_only)
        outputs.append(out)
        gradients.append(torch.autograd.grad(out.square().sum(), x)[0])
        ops.append(recorder.names)
    assert ops[0] != ops[1]
    assert relative_error(outputs[0], outputs[1]) < 1e-12
    assert relative_error(gradients[0], gradients[1]) < 1e-12


def test_linformer_names_its_max_len_when_the_keys_exceed_it(registry):
    module = zoo.create("linformer", d_model=8, num_heads=2, proj_len=4, max_len=16, registry=registry)
    x = torch.randn(1, 17, 8)
    with pytest.raises(ValueError, match="linformer: 17 keys, more than its max_len=16"):
        module(x, x, x)


def test_linformer_attends_to_proj_len_mixtures_whatever_the_length(registry):
    """With E and F one-hot on the first proj_len positions, Linformer is softmax attention over those keys."""
    module = zoo.create("linformer", d_model=8, num_heads=2, proj_len=3, max_len=16, registry=registry).double()
    with torch.no_grad():
        module.length_proj.zero_()
        module.length_proj[:, torch.arange(3), torch.arange(3)] = 1.0
    exact = zoo.create("multi-head", d_model=8, num_heads=2, registry=registry).double()
    with torch.no_grad():
        exact.in_proj_weight.copy_(torch.cat([module.q_proj.weight, module.k_proj.weight, module.v_proj.weight]))
        exact.in_proj_bias.copy_(torch.cat([module.q_proj.bias, module.k_proj.bias, module.v_proj.bias]))
        exact.out_proj.load_state_dict(module.out_proj.state_dict())
    q, k = torch.randn(2, 7, 8, dtype=torch.float64), torch.randn(2, 11, 8, dtype=torch.float64)
    with torch.no_grad():
        assert torch.allclose(module(q, k, k), exact(q, k[:, :3], k[:, :3]), atol=1e-12, rtol=0)


def _performer_module(registry):
    import sys

    return sys.modules[registry.variant("performer").factory.__module__]


def test_a_performer_with_unsigned_qr_directions_fails_both_statistical_checks(registry, monkeypatch):
    """Q of a QR as torch returns it, without the sign fix by R's diagonal (what Performer drew before): its rows
    are not isotropic and its kernel estimate is biased; the shipped draw passes (test_correctness)."""
    from zoo.profiles import get_profile
    from zoo.suites.correctness import check_random_features

    monkeypatch.setattr(_performer_module(registry), "haar_orthogonal",
                        lambda width: torch.linalg.qr(torch.randn(width, width))[0])
    rows = list(check_random_features(registry.variant("performer"), get_profile("quick")))
    assert [r.params["test"] for r in rows] == ["unbiased", "isotropic"]
    assert all(r.status == "failed" for r in rows), rows
    assert "biased" in rows[0].detail and "not isotropic" in rows[1].detail


def test_a_performer_with_one_key_shift_over_all_keys_fails_the_outlier_check(registry, monkeypatch):
    """One stabiliser shift over every key, masked and future ones included (what Performer took before): a hidden
    key with large logits flushes the visible keys' features to zero in float32."""
    from zoo.functional import kernel_attention
    from zoo.profiles import get_profile
    from zoo.suites.correctness import check_outlier_keys

    def shared_shift(fq, key_logits, v, attn_mask=None, is_causal=False, chunk=64):
        fk = torch.exp(key_logits - key_logits.detach().amax(dim=(-2, -1), keepdim=True))
        return kernel_attention(fq, fk, v, attn_mask, is_causal, chunk)

    monkeypatch.setattr(_performer_module(registry), "exp_kernel_attention", shared_shift)
    rows = list(check_outlier_keys(registry.variant("performer"), get_profile("quick")))
    failed = {r.params["hidden"] for r in rows if r.status == "failed"}
    assert failed == {"masked", "future"}, rows


@pytest.mark.parametrize("mode", ["full", "causal", "padding", "causal-padding", "query-mask", "causal-cross"])
def test_exp_kernel_attention_is_kernel_attention_of_the_exponentials(mode):
    """On ordinary logits it equals the unstabilised kernel attention of exp(logits), whatever the mask, and
    gradcheck passes through its shifts and its chunk loop."""
    from zoo.functional import exp_kernel_attention, kernel_attention

    g = torch.Generator().manual_seed(3)
    q_len, k_len = (7, 11) if mode == "causal-cross" else (11, 11)
    fq = torch.rand(2, 2, q_len, 5, generator=g, dtype=torch.float64, requires_grad=True)
    logits = torch.randn(2, 2, k_len, 5, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 2, k_len, 3, generator=g, dtype=torch.float64, requires_grad=True)
    mask = {"padding": torch.rand(2, 1, 1, k_len, generator=g) > 0.3, "causal-padding": torch.rand(2, 1, 1, k_len, generator=g) > 0.3,
            "query-mask": torch.rand(2, 1, q_len, k_len, generator=g) > 0.3}.get(mode)
    causal = mode.startswith("causal")
    out = exp_kernel_attention(fq, logits, v, mask, causal, chunk=4)
    assert torch.allclose(out, kernel_attention(fq, logits.exp(), v, mask, causal, chunk=4), atol=1e-12, rtol=0)
    assert torch.autograd.gradcheck(lambda a, b, c: exp_kernel_attention(a, b, c, mask, causal, chunk=4), (fq, logits, v))


def test_exp_kernel_attention_keeps_earlier_outputs_when_a_future_key_has_huge_logits():
    """In float32, a key at position 6 whose logits are 300 above the others' changes no earlier output."""
    from zoo.functional import exp_kernel_attention

    g = torch.Generator().manual_seed(4)
    fq, logits = torch.rand(1, 1, 12, 4, generator=g), torch.randn(1, 1, 12, 4, generator=g)
    v = torch.randn(1, 1, 12, 3, generator=g)
    before = exp_kernel_attention(fq, logits, v, is_causal=True, chunk=4)
    logits[..., 6, :] += 300.0
    after = exp_kernel_attention(fq, logits, v, is_causal=True, chunk=4)
    assert torch.isfinite(after).all() and torch.equal(after[..., :6, :], before[..., :6, :])
    assert not torch.allclose(after[..., 6:, :], before[..., 6:, :])


def test_continue_exp_kernel_piece_by_piece_is_the_causal_forward_and_leaves_the_decoders_state():
    """A sequence taken in pieces of every size (an empty one, one key, padding only, a piece whose key raises the
    shift by 300), each from the state the earlier ones left, gives the causal forward's outputs, and the state at
    the end is sum exp(logits - shift) [v, 1] over the allowed keys at their largest logit."""
    from zoo.functional import continue_exp_kernel, exp_kernel_attention

    g = torch.Generator().manual_seed(5)
    fq = torch.rand(2, 2, 15, 5, generator=g, dtype=torch.float64)
    logits = torch.randn(2, 2, 15, 5, generator=g, dtype=torch.float64)
    logits[:, :, 9] += 300.0
    v = torch.randn(2, 2, 15, 3, generator=g, dtype=torch.float64)
    keep = torch.ones(2, 15, dtype=torch.bool)
    keep[0, 3:6] = keep[1, 0] = False
    allowed = logits.masked_fill(~keep[:, None, :, None], -torch.inf)
    state, shift, pieces = fq.new_zeros(2, 2, 5, 4), fq.new_full((2, 2), -torch.inf), []
    for begin, end in ((0, 0), (0, 3), (3, 6), (6, 7), (7, 15)):
        out, state, shift = continue_exp_kernel(fq[:, :, begin:end], allowed[:, :, begin:end], v[:, :, begin:end],
                                                state, shift, chunk=2)
        pieces.append(out)
    whole = exp_kernel_attention(fq, logits, v, keep[:, None, None, :], True, chunk=4)
    assert torch.allclose(torch.cat(pieces, dim=2), whole, atol=1e-12, rtol=0)
    largest = allowed.amax(dim=(-2, -1))
    expected = torch.exp(allowed - largest[..., None, None]).transpose(-2, -1) @ torch.nn.functional.pad(v, (0, 1), value=1.0)
    assert torch.equal(shift, largest) and torch.allclose(state, expected, atol=1e-12, rtol=0)


def test_performer_prefill_in_pieces_passes_the_decode_checks(registry, monkeypatch):
    """A prompt longer than a prefill piece (here 8 tokens, two chunks of the check options) is taken piece by
    piece: every decode check of the correctness suite still passes, key padding included."""
    from zoo.profiles import get_profile
    from zoo.suites.correctness import check_decoding, check_decoding_isolation, check_decoding_state

    monkeypatch.setattr(_performer_module(registry), "PREFILL_PIECE", 8)
    variant, profile = registry.variant("performer"), get_profile("quick")
    rows = [r for check in (check_decoding, check_decoding_state, check_decoding_isolation) for r in check(variant, profile)]
    assert rows and all(r.status == "passed" for r in rows), [r for r in rows if r.status != "passed"]
    assert any(r.params.get("prefill", 0) > 8 for r in rows if r.params), "no prompt spans two pieces"


@pytest.mark.parametrize("name", BUILTINS)
def test_every_builtin_names_the_best_known_implementation_of_its_math(registry, name):
    """The board shows each variant's ratio to the fastest known form of its math; a built-in without one would
    leave a reader no way to see whether it trails it."""
    variant = registry.variant(name)
    assert variant.best_known in {*variant.baselines, zoo.contract.COMPARATORS[variant.kind]}


def test_rotary_tables_computed_once_serve_shorter_and_longer_sequences(registry):
    torch.manual_seed(0)
    module = zoo.create("rotary", d_model=16, num_heads=2, registry=registry)
    reference = registry.variant("rotary").reference
    for n in (8, 3, 12, 5):  # sliced from the longest so far, recomputed when a longer one comes
        x = torch.randn(2, n, 16)
        assert relative_error(module(x, x, x, is_causal=True), reference(module, x, x, x, is_causal=True)) < 1e-5
    assert [cos.shape[0] for cos, _ in module._tables.values()] == [12]


def test_forgetting_reference_is_the_papers_product_of_gates(registry):
    """FoX's attention weight of key j for query i is exp(q_i k_j / sqrt(d)) times the product of the forget gates
    f_{j+1} .. f_i, normalised over j <= i: written here as that product, token by token, against the reference
    (which sums log gates) and the fast path (cumulative sums as two extra head features)."""
    module = zoo.create("forgetting", d_model=6, num_heads=2, registry=registry).double()
    x = torch.randn(1, 7, 6, dtype=torch.float64)
    h, d = 2, 3
    q, k, v = (layer(x)[0].view(7, h, d) for layer in (module.q_proj, module.k_proj, module.v_proj))
    gates = torch.sigmoid(module.forget_proj(x)[0])  # (7, heads)
    heads = []
    for head in range(h):
        rows = []
        for i in range(7):
            weights = []
            for j in range(i + 1):
                product = torch.ones((), dtype=torch.float64)
                for gate in gates[j + 1:i + 1, head]:
                    product = product * gate
                weights.append(torch.exp(q[i, head] @ k[j, head] / d ** 0.5) * product)
            weights = torch.stack(weights)
            rows.append((weights[:, None] * v[:i + 1, head]).sum(0) / weights.sum())
        heads.append(torch.stack(rows))
    expected = module.out_proj(torch.cat(heads, dim=-1))[None]
    with torch.no_grad():
        reference = registry.variant("forgetting").reference(module, x, x, x, is_causal=True)
        assert torch.allclose(reference, expected, atol=1e-12, rtol=0)
        assert torch.allclose(module(x, x, x, is_causal=True), expected, atol=1e-12, rtol=0)


def test_forgetting_with_gates_fixed_open_is_causal_multi_head_attention(registry):
    """f = 1 everywhere (a gate logit of +inf in the limit; here a bias of 60) removes the bias: plain causal
    softmax attention with the same projections."""
    module = zoo.create("forgetting", d_model=8, num_heads=2, registry=registry).double()
    with torch.no_grad():
        module.forget_proj.weight.zero_()
        module.forget_proj.bias.fill_(60.0)
        x = torch.randn(2, 9, 8, dtype=torch.float64)
        q, k, v = (layer(x).view(2, 9, 2, 4).transpose(1, 2) for layer in (module.q_proj, module.k_proj, module.v_proj))
        plain = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        expected = module.out_proj(plain.transpose(1, 2).reshape(2, 9, 8))
        assert torch.allclose(module(x, x, x, is_causal=True), expected, atol=1e-12, rtol=0)


def test_native_sparse_chooses_the_exact_blocks_in_bfloat16_at_the_full_profiles_seeds(registry):
    """Its top blocks are ranked in float32 whatever the input dtype: ranked in bfloat16, a near-tie at one of the
    full profile's seeds chose another block than the float64 reference (relative error 0.29 against 0.031)."""
    from zoo.profiles import get_profile
    from zoo.suites.correctness import check_low_precision

    results = list(check_low_precision(registry.variant("native-sparse"), get_profile("full")))
    assert results and all(r.status == "passed" for r in results), [r for r in results if r.status != "passed"]


@pytest.mark.parametrize("name", ["grouped-query", "multi-query"])
def test_grouped_heads_give_one_output_and_one_gradient_through_sdpas_gqa_and_the_repeated_heads(registry, name):
    """Without a gradient the shared key/value heads go to SDPA's enable_gqa; with one they are repeated per query
    head first: both paths (and the fused self-attention projection against separate keys and values) must
    agree; the repeated path's gradient must be the float64 reference's for the input, and reach the shared
    projections' weights as the repeat_interleave baseline's does."""
    torch.manual_seed(0)
    module = zoo.create(name, d_model=16, num_heads=4, registry=registry).double()
    x = torch.randn(2, 9, 16, dtype=torch.float64, requires_grad=True)
    with torch.no_grad():
        inference = module(x, x, x, is_causal=True)
    training = module(x, x, x, is_causal=True)
    separate = module(x, x.clone(), x.clone(), is_causal=True)  # not one tensor: three projections
    expected = registry.variant(name).reference(module, x, x, x, is_causal=True)
    assert relative_error(inference, expected) < 1e-12 and relative_error(training, expected) < 1e-12
    assert relative_error(separate, expected) < 1e-12
    grad = torch.randn_like(training)
    weights = (module.k_proj.weight, module.v_proj.weight)
    ours = torch.autograd.grad(training, (x, *weights), grad)
    assert relative_error(ours[0], torch.autograd.grad(expected, x, grad)[0]) < 1e-10
    baseline = registry.variant(name).baselines["repeated-kv"](module)(x, x, x, is_causal=True)
    assert all(relative_error(a, b) < 1e-10 for a, b in zip(ours[1:], torch.autograd.grad(baseline, weights, grad)))
