"""An independent check of the "mla" variant (Multi-head Latent Attention, DeepSeek-V2, 2024; without query
compression, as DeepSeek-V2-Lite; no norm on the latent), written from the paper's equations and the calling
contract only, not from the fast path.

H heads of size d = d_model / H, a rotary part of size r (module.rope_dim, even), a latent of size c
(module.kv_rank). For the tokens t of the query and key inputs (the value input is never read):

    [q_nope_t,h (d), q_rope_t,h (r)] = head h of q_proj(query_t)         (heads laid out one after another)
    c_t       = kv_down(key_t)                                           (the latent: all that keys/values are made of)
    k_nope_t,h = head h of k_up(c_t),   v_t,h = head h of v_up(c_t)      (d features each)
    k_rope_t  = k_rope(key_t)                                            (one rotary key, shared by every head)
    score_ij,h = (q_nope_i,h . k_nope_j,h + RoPE(q_rope_i,h, i) . RoPE(k_rope_j, j)) / sqrt(d + r)
    o_i,h = sum_{j allowed} softmax_j(score_ij,h) v_j,h   (0 for a row with no allowed key); out_proj(heads concatenated)

RoPE is "rotate half" (feature i pairs with feature i + r/2, theta_i = base^(-2i/r), angle p * theta_i). The
reference below writes it as an explicit block rotation matrix R(p) per position (built from cos/sin, in float64)
applied by a matrix product; a second, complex-number form (x1 + i x2) * e^{i angle} and the formula itself
(scalar loops) check that matrix. The module's forward and the variant's registered reference are compared with
the reference, the module's gradients with autograd through it, the decoder with its causal form and its cache
size with the latent plus one rotary key per token; then properties that follow from the math.
"""

import copy
import math

import pytest
import torch

import zoo


NAME = "mla"
FORWARD_TOL = 1e-12
GRAD_TOL = 1e-10

# heads -> (d_model, kv_rank, rope_dim): head sizes 6, 4, 3 (d + r = 10, 6, 7: 1/sqrt(d + r) is not exact)
CONFIGS = {1: (6, 3, 4), 2: (8, 3, 2), 3: (9, 5, 4)}
PARAMETERS = {"q_proj.weight", "kv_down.weight", "k_up.weight", "v_up.weight", "k_rope.weight", "out_proj.weight"}


# --------------------------------------------------------------------------------------------------------------
# Rotary position embedding, three ways
# --------------------------------------------------------------------------------------------------------------

def rotary_angles(positions, r, base):
    """(len(positions), r/2) float64 angles p * base^(-2i/r)."""
    theta = torch.tensor([base ** (-(2.0 * i) / r) for i in range(r // 2)], dtype=torch.float64)
    return torch.as_tensor(positions, dtype=torch.float64).reshape(-1, 1) * theta.reshape(1, -1)


def rotation_matrices(positions, r, base):
    """(len(positions), r, r) float64: R(p), the block rotation that pairs feature i with feature i + r/2,
    so that RoPE(x, p) = R(p) @ x."""
    angles = rotary_angles(positions, r, base)
    half = r // 2
    R = torch.zeros(angles.shape[0], r, r, dtype=torch.float64)
    for i in range(half):
        c, s = torch.cos(angles[:, i]), torch.sin(angles[:, i])
        R[:, i, i] = c
        R[:, i, i + half] = -s
        R[:, i + half, i] = s
        R[:, i + half, i + half] = c
    return R


def rope_matrix(x, positions, base):
    """RoPE of x (..., len(positions), r) at the given positions, by the rotation matrices."""
    R = rotation_matrices(positions, x.shape[-1], base)            # (n, r, r)
    return torch.einsum("nab,...nb->...na", R, x)


def rope_complex(x, positions, base):
    """RoPE by complex numbers: z_i = x1[i] + i x2[i] times e^{i angle_i}; real parts first, imaginary after."""
    r = x.shape[-1]
    angles = rotary_angles(positions, r, base)
    z = torch.complex(x[..., : r // 2], x[..., r // 2:]) * torch.polar(torch.ones_like(angles), angles)
    return torch.cat([z.real, z.imag], dim=-1)


def rope_formula(x, p, base):
    """RoPE of one vector x (a list of floats) at position p, the paper's formula in plain Python floats."""
    r = len(x)
    half = r // 2
    out = [0.0] * r
    for i in range(half):
        angle = p * base ** (-(2.0 * i) / r)
        out[i] = x[i] * math.cos(angle) - x[i + half] * math.sin(angle)
        out[i + half] = x[i] * math.sin(angle) + x[i + half] * math.cos(angle)
    return out


# --------------------------------------------------------------------------------------------------------------
# The independent float64 reference
# --------------------------------------------------------------------------------------------------------------

def allowed_pairs(attn_mask, is_causal, batch, heads, n):
    """(batch, heads, n, n) booleans: query i may attend key j. ``attn_mask`` broadcasts as in torch SDPA
    (True = may attend); causal: j <= i; the two combine by AND."""
    allowed = torch.ones(batch, heads, n, n, dtype=torch.bool)
    if attn_mask is not None:
        allowed = allowed & attn_mask
    if is_causal:
        allowed = allowed & (torch.arange(n).view(1, n) <= torch.arange(n).view(n, 1))
    return allowed


def _apply(x, linear):
    """x W^T, written out (every layer of MLA is bias-free)."""
    return x @ linear.weight.transpose(0, 1)


def paper_mla(module, query, key, value, attn_mask=None, is_causal=False):
    """The layer's output per the paper, in float64, one head at a time (differentiable in the inputs and the
    module's parameters; ``value`` is deliberately never used)."""
    for x in (query, key, value):
        assert x.dtype == torch.float64
    heads, d_model, r = module.num_heads, query.shape[-1], module.rope_dim
    d = d_model // heads
    base = float(module.rope_base)
    batch, n = query.shape[0], query.shape[1]
    positions = list(range(n))

    q = _apply(query, module.q_proj)                                    # (batch, n, H*(d+r))
    latent = _apply(key, module.kv_down)                                # (batch, n, c)
    k_nope_all, v_all = _apply(latent, module.k_up), _apply(latent, module.v_up)   # (batch, n, H*d)
    k_rot = rope_matrix(_apply(key, module.k_rope), positions, base)    # (batch, n, r): shared by all heads
    allowed = allowed_pairs(attn_mask, is_causal, batch, heads, n)
    minus_inf = torch.tensor(float("-inf"), dtype=torch.float64)

    outputs = []
    for h in range(heads):
        q_h = q[..., h * (d + r):(h + 1) * (d + r)]
        q_nope, q_rot = q_h[..., :d], rope_matrix(q_h[..., d:], positions, base)
        k_nope, v_h = k_nope_all[..., h * d:(h + 1) * d], v_all[..., h * d:(h + 1) * d]
        nope = (q_nope[:, :, None, :] * k_nope[:, None, :, :]).sum(-1)      # (batch, n_q, n_k)
        rope = (q_rot[:, :, None, :] * k_rot[:, None, :, :]).sum(-1)
        score = (nope + rope) / math.sqrt(d + r)
        ok = allowed[:, h]
        if n:
            shift = torch.where(ok, score, minus_inf).amax(-1).detach()
            shift = torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift))
        else:
            shift = score.new_zeros(batch, n)
        numerator = torch.exp(torch.where(ok, score - shift[..., None], minus_inf))   # exactly 0 where not allowed
        denominator = numerator.sum(-1, keepdim=True)
        weights = numerator / torch.where(denominator > 0, denominator, torch.ones_like(denominator))
        outputs.append((weights[..., None] * v_h[:, None, :, :]).sum(-2))            # o_i = sum_j w_ij v_j
    return _apply(torch.cat(outputs, dim=-1), module.out_proj)


# --------------------------------------------------------------------------------------------------------------
# Setup
# --------------------------------------------------------------------------------------------------------------

def make_module(registry, heads, seed, **options):
    """A float64 MLA module of the head count's config, every parameter drawn from a seeded generator."""
    d_model, kv_rank, rope_dim = CONFIGS[heads]
    torch.manual_seed(seed)
    module = zoo.create(NAME, d_model=d_model, num_heads=heads, kv_rank=kv_rank, rope_dim=rope_dim,
                        registry=registry, **options).double()
    g = torch.Generator().manual_seed(10_000 + seed)
    with torch.no_grad():
        for _, p in sorted(module.named_parameters()):
            fan_in = p.shape[-1] if p.dim() > 1 else 1
            p.copy_(1.5 * torch.randn(p.shape, generator=g, dtype=torch.float64) / math.sqrt(fan_in))
    return module


def make_inputs(batch, n, d_model, seed, scale=1.5):
    g = torch.Generator().manual_seed(20_000 + seed)
    return tuple(scale * torch.randn(batch, n, d_model, generator=g, dtype=torch.float64) for _ in range(3))


MASK_SHAPES = {
    None: None,
    "nn": lambda b, h, n: (n, n),
    "b1nn": lambda b, h, n: (b, 1, n, n),
    "1hnn": lambda b, h, n: (1, h, n, n),
    "b11n": lambda b, h, n: (b, 1, 1, n),  # key padding
}


def make_mask(kind, batch, heads, n, seed):
    """A random boolean mask of the named shape (True = may attend), with rows entirely False: query row 1 of
    query-indexed masks, head 0 of per-head masks at row 0, and for key padding the whole of batch row 0 (so
    every query of that sequence has no key)."""
    if kind is None:
        return None
    shape = MASK_SHAPES[kind](batch, heads, n)
    g = torch.Generator().manual_seed(30_000 + seed)
    mask = torch.rand(shape, generator=g) > 0.35
    if kind == "b11n":
        if batch:
            mask[0] = False
    else:
        if n > 1:
            mask[..., 1, :] = False
        if kind == "1hnn" and n:
            mask[:, 0, 0, :] = False
    return mask


def _grads(output, cotangent, tensors):
    grads = torch.autograd.grad(output, tensors, grad_outputs=cotangent, allow_unused=True)
    return [torch.zeros_like(t) if g is None else g for t, g in zip(tensors, grads)]


def _close(got, expected, tol, what):
    assert got.shape == expected.shape, (what, got.shape, expected.shape)
    assert torch.isfinite(got).all(), (what, "non-finite values", got)
    error = (got - expected).abs().max().item() if got.numel() else 0.0
    assert error <= tol, f"{what}: max |got - expected| = {error:.3e} > {tol:.0e}\ngot={got}\nexpected={expected}"


# --------------------------------------------------------------------------------------------------------------
# The reference's own pieces, checked first
# --------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("r, base", [(2, 10000.0), (4, 10000.0), (8, 10000.0), (6, 500.0)])
def test_rotation_matrix_equals_complex_form_and_formula(r, base):
    g = torch.Generator().manual_seed(r)
    positions = [0, 1, 2, 5, 9, 37, 1000]
    x = torch.randn(3, len(positions), r, generator=g, dtype=torch.float64)
    by_matrix, by_complex = rope_matrix(x, positions, base), rope_complex(x, positions, base)
    _close(by_matrix, by_complex, 1e-13, "matrix vs complex RoPE")
    for b in range(3):
        for t, p in enumerate(positions):
            expected = torch.tensor(rope_formula(x[b, t].tolist(), p, base), dtype=torch.float64)
            _close(by_matrix[b, t], expected, 1e-13, f"matrix vs formula at p={p}")
    R = rotation_matrices(positions, r, base)
    _close(R[0], torch.eye(r, dtype=torch.float64), 0.0, "R(0) = I")
    _close(R.transpose(1, 2) @ R, torch.eye(r, dtype=torch.float64).expand_as(R), 1e-14, "R(p) is orthogonal")
    _close(by_matrix.norm(dim=-1), x.norm(dim=-1), 1e-13, "RoPE keeps norms")


@pytest.mark.parametrize("r", [2, 4, 6])
def test_rotary_scores_depend_only_on_relative_position(r):
    """RoPE(q, i) . RoPE(k, j) = RoPE(q, i + s) . RoPE(k, j + s), and R(i)^T R(j) = R(j - i)."""
    g = torch.Generator().manual_seed(100 + r)
    base = 10000.0
    for i, j, s in [(0, 0, 3), (4, 1, 7), (1, 4, 2), (8, 0, 100), (3, 3, 1000), (0, 8, 41)]:
        q, k = torch.randn(r, generator=g, dtype=torch.float64), torch.randn(r, generator=g, dtype=torch.float64)
        rotate = lambda x, p: rope_matrix(x.view(1, r), [p], base).view(r)
        here = rotate(q, i) @ rotate(k, j)
        shifted = rotate(q, i + s) @ rotate(k, j + s)
        assert abs(here.item() - shifted.item()) <= 1e-12, (i, j, s, here.item(), shifted.item())
        Ri, Rj = rotation_matrices([i, j], r, base)
        _close(Ri.T @ Rj, rotation_matrices([j - i], r, base)[0], 1e-13, f"R({i})^T R({j}) = R({j - i})")
        # and the complex form agrees: Re(conj(zq e^{i a_i}) zk e^{i a_j}) is the same dot product
        zq, zk = rope_complex(q.view(1, r), [i], base).view(r), rope_complex(k.view(1, r), [j], base).view(r)
        assert abs((zq @ zk).item() - here.item()) <= 1e-12
    # not translation-invariant in absolute terms: a single rotated vector does move
    q = torch.randn(1, r, generator=g, dtype=torch.float64)
    assert (rope_matrix(q, [1], base) - q).abs().max() > 1e-3


def test_reference_equals_a_loop_over_every_query_and_key():
    """The reference itself, against scalar loops over batch, head, query and key straight from the equations
    (RoPE by its formula, no shift, plain Python floats), with a mask, causal and an empty row."""
    class Holder(torch.nn.Module):
        def __init__(self, heads, d_model, kv_rank, rope_dim):
            super().__init__()
            self.num_heads, self.d_model, self.kv_rank, self.rope_dim, self.rope_base = heads, d_model, kv_rank, rope_dim, 10000.0
            d = d_model // heads
            L = lambda i, o: torch.nn.Linear(i, o, bias=False).double()
            self.q_proj, self.kv_down, self.k_rope = L(d_model, heads * (d + rope_dim)), L(d_model, kv_rank), L(d_model, rope_dim)
            self.k_up, self.v_up, self.out_proj = L(kv_rank, d_model), L(kv_rank, d_model), L(d_model, d_model)

    g = torch.Generator().manual_seed(7)
    heads, d, c, r = 2, 3, 2, 4
    d_model = heads * d
    module = Holder(heads, d_model, c, r)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64))
    batch, n = 2, 5
    query, key, value = (torch.randn(batch, n, d_model, generator=g, dtype=torch.float64) for _ in range(3))
    mask = torch.rand(batch, 1, n, n, generator=g) > 0.3
    mask[1, 0, 2, :] = False
    out = paper_mla(module, query, key, value, attn_mask=mask, is_causal=True).detach()

    def lin(vec, layer, f):
        return sum(vec[a] * layer.weight[f, a].item() for a in range(len(vec)))

    for b in range(batch):
        o = [[0.0] * d_model for _ in range(n)]
        qs = [[lin(query[b, t].tolist(), module.q_proj, f) for f in range(heads * (d + r))] for t in range(n)]
        cs = [[lin(key[b, t].tolist(), module.kv_down, f) for f in range(c)] for t in range(n)]
        kr = [rope_formula([lin(key[b, t].tolist(), module.k_rope, f) for f in range(r)], t, 10000.0) for t in range(n)]
        for h in range(heads):
            for i in range(n):
                qn = qs[i][h * (d + r): h * (d + r) + d]
                qr = rope_formula(qs[i][h * (d + r) + d: (h + 1) * (d + r)], i, 10000.0)
                keys = [j for j in range(n) if mask[b, 0, i, j] and j <= i]
                e = {}
                for j in keys:
                    kn = [lin(cs[j], module.k_up, h * d + a) for a in range(d)]
                    s = (sum(x * y for x, y in zip(qn, kn)) + sum(x * y for x, y in zip(qr, kr[j]))) / math.sqrt(d + r)
                    e[j] = math.exp(s)
                z = sum(e.values())
                for a in range(d):
                    o[i][h * d + a] = sum(e[j] / z * lin(cs[j], module.v_up, h * d + a) for j in keys)
        for i in range(n):
            for f in range(d_model):
                expected = lin(o[i], module.out_proj, f)
                assert abs(out[b, i, f].item() - expected) <= 1e-12, (b, i, f, out[b, i, f].item(), expected)
    assert (out[1, 2] == 0).all()  # the empty row


# --------------------------------------------------------------------------------------------------------------
# The module
# --------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("heads", [1, 2, 3])
def test_module_has_the_contract_parameters(registry, heads):
    d_model, kv_rank, rope_dim = CONFIGS[heads]
    d = d_model // heads
    module = zoo.create(NAME, d_model=d_model, num_heads=heads, kv_rank=kv_rank, rope_dim=rope_dim, registry=registry)
    assert module.num_heads == heads and module.kv_rank == kv_rank and module.rope_dim == rope_dim
    assert float(module.rope_base) == 10000.0
    shapes = {"q_proj": (d_model, heads * (d + rope_dim)), "kv_down": (d_model, kv_rank), "k_up": (kv_rank, d_model),
              "v_up": (kv_rank, d_model), "k_rope": (d_model, rope_dim), "out_proj": (d_model, d_model)}
    for name, (inputs, outputs) in shapes.items():
        linear = getattr(module, name)
        assert isinstance(linear, torch.nn.Linear) and linear.bias is None, name
        assert (linear.in_features, linear.out_features) == (inputs, outputs), name
    assert {name for name, _ in module.named_parameters()} == PARAMETERS  # nothing the paper's layer lacks (no norm)


CASES = [(batch, heads, n, causal, mask)
         for batch in (0, 1, 2)
         for heads in (1, 2, 3)
         for n in (0, 1, 5, 9)
         for causal in (False, True)
         for mask in MASK_SHAPES
         if not (batch == 0 and n == 9) and not (n <= 1 and mask in ("nn", "1hnn"))]


@pytest.mark.parametrize("batch, heads, n, causal, mask_kind", CASES)
def test_forward_reference_and_gradients_match_the_paper(registry, batch, heads, n, causal, mask_kind):
    seed = CASES.index((batch, heads, n, causal, mask_kind))
    module = make_module(registry, heads, seed)
    query, key, value = make_inputs(batch, n, module.q_proj.in_features, seed)
    mask = make_mask(mask_kind, batch, heads, n, seed)
    case = dict(batch=batch, heads=heads, n=n, causal=causal, mask=mask_kind, seed=seed)

    with torch.no_grad():
        expected = paper_mla(module, query, key, value, attn_mask=mask, is_causal=causal)
        out = module(query, key, value, attn_mask=mask, is_causal=causal)
        registered = registry.variant(NAME).reference(module, query, key, value, attn_mask=mask, is_causal=causal)
    assert out.dtype == torch.float64 and out.shape == (batch, n, query.shape[-1]), case
    _close(out, expected, FORWARD_TOL, f"module forward {case}")
    _close(registered.double(), expected, FORWARD_TOL, f"registered reference {case}")

    # a row that no head may attend from gets o_i = 0, and out_proj has no bias: the output row is 0
    allowed = allowed_pairs(mask, causal, batch, heads, n)
    empty = ~allowed.any(-1).any(1)  # (batch, n)
    if empty.any():
        _close(out[empty], torch.zeros_like(out[empty]), FORWARD_TOL, f"empty rows give 0 {case}")

    # gradients: query, key, value (zero: it is not read) and every parameter, for a random cotangent
    g = torch.Generator().manual_seed(40_000 + seed)
    cotangent = torch.randn(batch, n, query.shape[-1], generator=g, dtype=torch.float64)
    inputs = [x.clone().requires_grad_(True) for x in (query, key, value)]
    names = ["query", "key", "value"] + sorted(PARAMETERS)
    params = dict(module.named_parameters())
    tensors = inputs + [params[name] for name in names[3:]]
    got = _grads(module(*inputs, attn_mask=mask, is_causal=causal), cotangent, tensors)
    want = _grads(paper_mla(module, *inputs, attn_mask=mask, is_causal=causal), cotangent, tensors)
    for name, a, b in zip(names, got, want):
        _close(a, b, GRAD_TOL, f"gradient wrt {name} {case}")
    _close(got[2], torch.zeros_like(got[2]), 0.0, f"gradient wrt value is zero {case}")


def test_non_default_rope_base(registry):
    """Where the variant offers rope_base as an option, a base other than 10000 is honoured."""
    if "rope_base" not in registry.variant(NAME).options:
        pytest.skip("the variant takes no rope_base option (the module's default, 10000, is checked elsewhere)")
    module = make_module(registry, 2, 5, rope_base=37.0)
    assert float(module.rope_base) == 37.0
    query, key, value = make_inputs(2, 9, module.q_proj.in_features, 5)
    with torch.no_grad():
        _close(module(query, key, value, is_causal=True), paper_mla(module, query, key, value, is_causal=True),
               FORWARD_TOL, "rope_base=37 forward")


# --------------------------------------------------------------------------------------------------------------
# Decoding: the cache holds the latent and the one shared rotary key, nothing more
# --------------------------------------------------------------------------------------------------------------

def _state_numel(state):
    assert isinstance(state, dict)
    return sum(value.numel() for value in state.values() if isinstance(value, torch.Tensor))


@pytest.mark.parametrize("batch, heads, n, prefill", [(1, 1, 9, 0), (2, 2, 9, 1), (2, 3, 9, 4), (1, 3, 5, 5),
                                                      (2, 2, 1, 0), (0, 2, 5, 2), (2, 1, 9, 9)])
def test_decoder_matches_causal_reference_and_caches_only_the_latent(registry, batch, heads, n, prefill):
    seed = 500 + batch * 100 + heads * 10 + prefill
    module = make_module(registry, heads, seed)
    query, key, value = make_inputs(batch, n, module.q_proj.in_features, seed)
    dec = registry.variant(NAME).decoder
    assert dec is not None
    per_token = module.kv_rank + module.rope_dim
    case = dict(batch=batch, heads=heads, n=n, prefill=prefill)
    with torch.no_grad():
        expected = paper_mla(module, query, key, value, is_causal=True)
        out, state = dec.prefill(module, query[:, :prefill].clone(), key[:, :prefill].clone(), value[:, :prefill].clone())
        assert out.shape == (batch, prefill, query.shape[-1]), case
        assert _state_numel(state) == batch * prefill * per_token, (case, "after prefill",
                                                                    {k: tuple(v.shape) for k, v in state.items()
                                                                     if isinstance(v, torch.Tensor)})
        outputs = [out]
        for t in range(prefill, n):
            token = slice(t, t + 1)
            out_t, state = dec.step(module, state, query[:, token].clone(), key[:, token].clone(), value[:, token].clone())
            assert out_t.shape == (batch, 1, query.shape[-1]), (case, t)
            assert _state_numel(state) == batch * (t + 1) * per_token, (case, f"after step {t}",
                                                                        {k: tuple(v.shape) for k, v in state.items()
                                                                         if isinstance(v, torch.Tensor)})
            outputs.append(out_t)
    _close(torch.cat(outputs, dim=1), expected, FORWARD_TOL, f"decoded vs causal reference {case}")


def test_decoder_ignores_the_value_input(registry):
    module = make_module(registry, 3, 77)
    query, key, value = make_inputs(2, 6, module.q_proj.in_features, 77)
    dec = registry.variant(NAME).decoder
    with torch.no_grad():
        a, sa = dec.prefill(module, query[:, :2].clone(), key[:, :2].clone(), value[:, :2].clone())
        b, sb = dec.prefill(module, query[:, :2].clone(), key[:, :2].clone(), (-3 * value[:, :2]).clone())
        outs_a, outs_b = [a], [b]
        for t in range(2, 6):
            token = slice(t, t + 1)
            a, sa = dec.step(module, sa, query[:, token].clone(), key[:, token].clone(), value[:, token].clone())
            b, sb = dec.step(module, sb, query[:, token].clone(), key[:, token].clone(), torch.randn_like(value[:, token]))
            outs_a.append(a)
            outs_b.append(b)
    _close(torch.cat(outs_b, 1), torch.cat(outs_a, 1), 0.0, "decode with another value input")


# --------------------------------------------------------------------------------------------------------------
# Properties from the math
# --------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("heads, causal, mask_kind", [(1, False, None), (2, True, "b1nn"), (3, False, "b11n"),
                                                      (3, True, "1hnn")])
def test_output_does_not_read_the_value_input(registry, heads, causal, mask_kind):
    module = make_module(registry, heads, 900 + heads)
    query, key, value = make_inputs(2, 7, module.q_proj.in_features, 900 + heads)
    mask = make_mask(mask_kind, 2, heads, 7, 900 + heads)
    with torch.no_grad():
        a = module(query, key, value, attn_mask=mask, is_causal=causal)
        b = module(query, key, 100 * torch.randn_like(value), attn_mask=mask, is_causal=causal)
        c = module(query, key, torch.zeros_like(value), attn_mask=mask, is_causal=causal)
    _close(b, a, 0.0, "another value input")
    _close(c, a, 0.0, "a zero value input")
    _close(a, paper_mla(module, query, key, value, attn_mask=mask, is_causal=causal).detach(), FORWARD_TOL, "forward")


def _zero_rotary(module):
    """k_rope zeroed, and the rotary rows of every head of q_proj."""
    module = copy.deepcopy(module)
    d, r = module.q_proj.in_features // module.num_heads, module.rope_dim
    with torch.no_grad():
        module.k_rope.weight.zero_()
        for h in range(module.num_heads):
            module.q_proj.weight[h * (d + r) + d:(h + 1) * (d + r)] = 0
    return module


def _zero_nope(module):
    """The content rows (q_nope) of every head of q_proj zeroed: scores are rotary only."""
    module = copy.deepcopy(module)
    d, r = module.q_proj.in_features // module.num_heads, module.rope_dim
    with torch.no_grad():
        for h in range(module.num_heads):
            module.q_proj.weight[h * (d + r):h * (d + r) + d] = 0
    return module


@pytest.mark.parametrize("heads, mask_kind", [(1, None), (2, "nn"), (3, "b1nn"), (2, "1hnn"), (3, "b11n")])
def test_without_rotary_part_keys_are_a_set(registry, heads, mask_kind):
    """No rotary part: nothing knows a key's position, so permuting the key sequence (and the mask's key axis)
    leaves the non-causal output unchanged; with the rotary part it does change the output."""
    seed = 1100 + heads * 10 + len(str(mask_kind))
    full = make_module(registry, heads, seed)
    module = _zero_rotary(full)
    n = 9
    query, key, value = make_inputs(2, n, module.q_proj.in_features, seed)
    mask = make_mask(mask_kind, 2, heads, n, seed)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    moved_mask = None if mask is None else mask[..., perm]
    with torch.no_grad():
        a = module(query, key, value, attn_mask=mask)
        b = module(query, key[:, perm], value[:, perm], attn_mask=moved_mask)
        _close(b, a, FORWARD_TOL, "permuted keys, no rotary part")
        _close(a, paper_mla(module, query, key, value, attn_mask=mask), FORWARD_TOL, "no rotary part vs reference")
        c = full(query, key, value, attn_mask=mask)
        e = full(query, key[:, perm], value[:, perm], attn_mask=moved_mask)
    assert (c - e).abs().max() > 1e-6  # the rotary part does see positions
    assert (c - a).abs().max() > 1e-6  # and contributes


@pytest.mark.parametrize("heads, causal, content", [(1, False, True), (2, True, True), (3, False, False),
                                                    (3, True, False), (2, False, True)])
@pytest.mark.parametrize("shift", [1, 4])
def test_scores_depend_on_relative_position(registry, heads, causal, content, shift):
    """Positions always start at 0, but only i - j is seen: prepend ``shift`` junk tokens, masked out as keys
    (key padding), and the queries' outputs at positions shift.. are the original outputs (causal too: j <= i
    becomes j + shift <= i + shift). Checked on the whole layer and with the content part of q_proj zeroed
    (rotary scores only)."""
    seed = 1300 + heads * 10 + shift
    module = make_module(registry, heads, seed)
    if not content:
        module = _zero_nope(module)
    n, batch, d_model = 7, 2, module.q_proj.in_features
    query, key, value = make_inputs(batch, n, d_model, seed)
    junk = make_inputs(batch, shift, d_model, seed + 1, scale=3.0)
    padded = [torch.cat([j, x], dim=1) for j, x in zip(junk, (query, key, value))]
    mask = torch.ones(batch, 1, 1, n + shift, dtype=torch.bool)
    mask[..., :shift] = False
    with torch.no_grad():
        original = module(query, key, value, is_causal=causal)
        shifted = module(*padded, attn_mask=mask, is_causal=causal)
        _close(original, paper_mla(module, query, key, value, is_causal=causal), FORWARD_TOL, "original vs reference")
        _close(shifted[:, shift:], original, FORWARD_TOL, f"shifted by {shift} vs original")
        # control: the junk keys, when allowed, do change the result
        unmasked = module(*padded, is_causal=causal)
    assert (unmasked[:, shift:] - original).abs().max() > 1e-6
