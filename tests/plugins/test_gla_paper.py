"""An independent check of the "gla" variant (Gated Linear Attention, Yang, Wang, Shen, Panda & Kim, ICML 2024: the
attention core and its per-head output norm, without the output gate), written from the paper's equations and the
calling contract only, not from the fast path (the output norm, in ``_finish``, was added after the first author
added it to the variant).

With H heads of d = d_model / H features (head h = features [h d, (h + 1) d)):

    q_t = query_t Wq^T      k_t = key_t Wk^T      v_t = value_t Wv^T                      (d_model each)
    log alpha_t = logsigmoid(gate_up(gate_down(key_t))) / tau      (per key feature; tau = module.normalizer)
    S_0 = 0,   S_t = diag(alpha_t,h) S_{t-1} + k_t,h^T v_t,h      (d x d, per head)
    o_t,h = RMSNorm(q_t,h S_t / sqrt(d)),     heads concatenated in order,     output = o Wo^T

Two float64 forms of that are written here, independently of each other: the token-by-token recurrence (a Python
loop over t) and the parallel form

    o_t,h = sum_{s<=t} sum_f q_t,h,f k_s,h,f exp(sum_{l=s+1..t} log alpha_l,h,f) v_s,h / sqrt(d)

whose decay is built from explicit sums over l (an indicator tensor), not from cumsum differences. They are checked
against each other (and the recurrence against plain-Python scalar loops), then the module's forward and the
registered reference against them, and the module's gradients against autograd through the recurrence; then
properties that follow from the math: alpha -> 1 gives plain causal linear attention, the chunk size changes
nothing, the output is causal, and a strong decay (segment sums below -709) still gives finite outputs and
gradients equal to the recurrence.
"""

import math

import pytest
import torch

import zoo

from paper_checks import make_inputs, close as _close, grads as _grads


NAME = "gla"
D_MODEL = {1: 5, 2: 8, 3: 9}  # heads -> d_model: head sizes 5, 4 and 3
FORMS_TOL = 1e-12    # the two paper forms against each other (relative to the output scale)
FORWARD_TOL = 1e-11  # the module / the registered reference against the paper forms (relative)
GRAD_TOL = 1e-10     # gradients (relative to each gradient's scale)


# --------------------------------------------------------------------------------------------------------------
# The independent float64 forms
# --------------------------------------------------------------------------------------------------------------

def _linear(x, layer):
    """x W^T (+ b), written out."""
    y = x @ layer.weight.transpose(0, 1)
    return y if layer.bias is None else y + layer.bias


def _logsigmoid(z):
    """log sigmoid(z) = -log(1 + exp(-z)), in a form that neither overflows nor loses the tail for large z."""
    return z.clamp_max(0) - torch.log1p(torch.exp(-z.abs()))


def paper_inputs(module, query, key, value):
    """q, k, v (b, n, H, d) and log alpha (b, n, H, d), per the paper's projections and gate."""
    for t in (query, key, value):
        assert t.dtype == torch.float64
    heads = module.num_heads
    tau = float(module.normalizer)

    def split(x):  # head h: features [h d, (h + 1) d)
        return x.reshape(x.shape[0], x.shape[1], heads, x.shape[2] // heads)

    q = split(_linear(query, module.q_proj))
    k = split(_linear(key, module.k_proj))
    v = split(_linear(value, module.v_proj))
    log_alpha = split(_logsigmoid(_linear(_linear(key, module.gate_down), module.gate_up)) / tau)
    return q, k, v, log_alpha


def _finish(module, o):
    """Normalise each head's output by its root mean square (the paper's norm after attention, RMSNorm without
    affine with the module's eps), concatenate the heads in order (b, n, H, d) -> (b, n, d_model) and apply the
    output projection."""
    batch, n, heads, d = o.shape
    o = o / torch.sqrt((o * o).sum(-1, keepdim=True) / d + module.eps)
    return _linear(o.reshape(batch, n, heads * d), module.out_proj)


def recurrence_form(module, query, key, value):
    """The token-by-token recurrence: S_t = diag(alpha_t) S_{t-1} + k_t^T v_t, o_t = q_t S_t / sqrt(d)."""
    q, k, v, log_alpha = paper_inputs(module, query, key, value)
    batch, n, heads, d = q.shape
    S = torch.zeros(batch, heads, d, d, dtype=torch.float64)                              # S_0 = 0 (key f, value e)
    outs = []
    for t in range(n):
        alpha = torch.exp(log_alpha[:, t])                                                  # (b, H, d): per key feature
        outer = k[:, t, :, :, None] * v[:, t, :, None, :]                                   # (b, H, d, d): k^T v
        S = alpha[:, :, :, None] * S + outer                                                # diag(alpha) S + k^T v
        outs.append((q[:, t, :, :, None] * S).sum(2) / math.sqrt(d))                        # q S: sum over f
    o = torch.stack(outs, 1) if outs else q.new_zeros(batch, 0, heads, d)
    return _finish(module, o)


def parallel_form(module, query, key, value):
    """o_t = sum_{s<=t} sum_f q_t,f k_s,f exp(sum_{s<l<=t} log alpha_l,f) v_s / sqrt(d), with the segment sums
    taken over an explicit indicator [s < l <= t] (no cumsum differences)."""
    q, k, v, log_alpha = paper_inputs(module, query, key, value)
    batch, n, heads, d = q.shape
    t_ = torch.arange(n).view(n, 1, 1)
    s_ = torch.arange(n).view(1, n, 1)
    l_ = torch.arange(n).view(1, 1, n)
    between = ((s_ < l_) & (l_ <= t_)).to(torch.float64)                                    # (t, s, l)
    # segment[b, t, s, h, f] = sum_l [s < l <= t] log alpha[b, l, h, f]
    segment = (between[None, :, :, :, None, None] * log_alpha[:, None, None, :, :, :]).sum(3)
    lower = (s_[..., 0] <= t_[..., 0])[None, :, :, None, None]                             # (1, t, s, 1, 1)
    decay = torch.where(lower, torch.exp(segment), torch.zeros((), dtype=torch.float64))   # 0 where s > t
    # weights[b, t, s, h] = sum_f q[b, t, h, f] k[b, s, h, f] decay[b, t, s, h, f]
    weights = (q[:, :, None, :, :] * k[:, None, :, :, :] * decay).sum(-1)
    o = (weights[..., None] * v[:, None, :, :, :]).sum(2) / math.sqrt(d)                    # (b, t, h, d)
    return _finish(module, o)


def causal_linear_attention(module, query, key, value):
    """With alpha = 1: o_t,h = sum_{s<=t} (q_t,h . k_s,h) v_s,h / sqrt(d), an explicit causal sum over s for each t."""
    q, k, v, _ = paper_inputs(module, query, key, value)
    batch, n, heads, d = q.shape
    rows = []
    for t in range(n):
        scores = (q[:, t, None, :, :] * k[:, :t + 1]).sum(-1)                              # (b, s, H): q_t . k_s
        rows.append((scores[..., None] * v[:, :t + 1]).sum(1) / math.sqrt(d))               # (b, H, d)
    o = torch.stack(rows, 1) if rows else q.new_zeros(batch, 0, heads, d)
    return _finish(module, o)


# --------------------------------------------------------------------------------------------------------------
# Setup
# --------------------------------------------------------------------------------------------------------------

def make_module(registry, heads, seed, chunk=None, rank=None, normalizer=None, bias=(0.0, 2.0), d_model=None):
    """A float64 gla module with every parameter drawn from a seeded generator: weights of scale 1/sqrt(fan_in),
    gate_up.bias ~ normal(bias)."""
    torch.manual_seed(seed)
    d_model = d_model or D_MODEL[heads]
    options = {"chunk": chunk, "gate_rank": rank, "normalizer": normalizer}
    options = {key: value for key, value in options.items() if value is not None}
    module = zoo.create(NAME, d_model=d_model, num_heads=heads, registry=registry, **options).double()
    if normalizer is not None:
        assert float(module.normalizer) == normalizer
    g = torch.Generator().manual_seed(10_000 + seed)
    with torch.no_grad():
        for layer in (module.q_proj, module.k_proj, module.v_proj, module.out_proj, module.gate_down, module.gate_up):
            layer.weight.copy_(torch.randn(layer.weight.shape, generator=g, dtype=torch.float64)
                               / math.sqrt(layer.in_features))
        module.gate_up.bias.copy_(bias[0] + bias[1] * torch.randn(d_model, generator=g, dtype=torch.float64))
    return module


# --------------------------------------------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------------------------------------------

def test_recurrence_and_parallel_forms_equal_scalar_loops():
    """Both forms, against plain-Python scalar loops over every index straight from the equations (batch 2,
    2 heads of 3, n = 5, rank 2, tau = 2), with no zoo module involved."""
    class Holder(torch.nn.Module):
        def __init__(self, heads, d_model, rank, tau):
            super().__init__()
            self.num_heads, self.d_model, self.normalizer, self.eps = heads, d_model, tau, 1e-5
            self.q_proj = torch.nn.Linear(d_model, d_model, bias=False).double()
            self.k_proj = torch.nn.Linear(d_model, d_model, bias=False).double()
            self.v_proj = torch.nn.Linear(d_model, d_model, bias=False).double()
            self.gate_down = torch.nn.Linear(d_model, rank, bias=False).double()
            self.gate_up = torch.nn.Linear(rank, d_model, bias=True).double()
            self.out_proj = torch.nn.Linear(d_model, d_model, bias=False).double()

    g = torch.Generator().manual_seed(3)
    heads, d, rank, tau = 2, 3, 2, 2.0
    d_model = heads * d
    m = Holder(heads, d_model, rank, tau)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(0.8 * torch.randn(p.shape, generator=g, dtype=torch.float64))
    batch, n = 2, 5
    q, k, v = (torch.randn(batch, n, d_model, generator=g, dtype=torch.float64) for _ in range(3))
    with torch.no_grad():
        rec = recurrence_form(m, q, k, v)
        par = parallel_form(m, q, k, v)

    w = lambda layer, f, c: layer.weight[f, c].item()
    proj = lambda x, layer, f: sum(x[c] * w(layer, f, c) for c in range(layer.in_features))
    row = lambda x, b, t: [x[b, t, c].item() for c in range(d_model)]
    for b in range(batch):
        S = [[[0.0] * d for _ in range(d)] for _ in range(heads)]  # S[h][f][e]: key feature f, value feature e
        for t in range(n):
            qt = [proj(row(q, b, t), m.q_proj, f) for f in range(d_model)]
            kt = [proj(row(k, b, t), m.k_proj, f) for f in range(d_model)]
            vt = [proj(row(v, b, t), m.v_proj, f) for f in range(d_model)]
            low = [proj(row(k, b, t), m.gate_down, r) for r in range(rank)]
            z = [proj(low, m.gate_up, f) + m.gate_up.bias[f].item() for f in range(d_model)]
            alpha = [(1.0 / (1.0 + math.exp(-zf))) ** (1.0 / tau) for zf in z]
            o = [0.0] * d_model
            for h in range(heads):
                for f in range(d):
                    for e in range(d):
                        S[h][f][e] = alpha[h * d + f] * S[h][f][e] + kt[h * d + f] * vt[h * d + e]
                for e in range(d):
                    o[h * d + e] = sum(qt[h * d + f] * S[h][f][e] for f in range(d)) / math.sqrt(d)
                rms = math.sqrt(sum(o[h * d + e] ** 2 for e in range(d)) / d + m.eps)
                for e in range(d):
                    o[h * d + e] /= rms
            for f in range(d_model):
                expected = sum(o[c] * w(m.out_proj, f, c) for c in range(d_model))
                assert abs(rec[b, t, f].item() - expected) <= 1e-12, (b, t, f, rec[b, t, f].item(), expected)
                assert abs(par[b, t, f].item() - expected) <= 1e-12, (b, t, f, par[b, t, f].item(), expected)


def test_module_has_the_contract_parameters(registry):
    heads, d_model, rank = 3, 9, 4
    module = zoo.create(NAME, d_model=d_model, num_heads=heads, gate_rank=rank, registry=registry)
    assert module.num_heads == heads
    shapes = {"q_proj": (d_model, d_model, False), "k_proj": (d_model, d_model, False),
              "v_proj": (d_model, d_model, False), "out_proj": (d_model, d_model, False),
              "gate_down": (rank, d_model, False), "gate_up": (d_model, rank, True)}
    for name, (out_features, in_features, bias) in shapes.items():
        layer = getattr(module, name)
        assert isinstance(layer, torch.nn.Linear), name
        assert (layer.out_features, layer.in_features, layer.bias is not None) == (out_features, in_features, bias), name
    expected = {f"{n}.weight" for n in shapes} | {"gate_up.bias"}
    assert {name for name, _ in module.named_parameters()} == expected  # nothing the paper's core lacks
    default = zoo.create(NAME, d_model=8, num_heads=2, registry=registry)
    assert default.gate_down.out_features == 16 and default.gate_up.in_features == 16  # gate_rank defaults to 16
    assert float(default.normalizer) == 16.0


FORM_CASES = [(batch, heads, n, tau, same)
              for batch in (1, 2) for heads in (1, 2, 3) for n in (0, 1, 5, 7, 13) for tau in (1.0, 16.0)
              for same in (False, True)]


@pytest.mark.parametrize("batch, heads, n, tau, same", FORM_CASES)
def test_recurrence_and_parallel_forms_agree(registry, batch, heads, n, tau, same):
    seed = FORM_CASES.index((batch, heads, n, tau, same))
    module = make_module(registry, heads, seed, rank=3, normalizer=tau)
    query, key, value = make_inputs(batch, n, D_MODEL[heads], seed, same)
    with torch.no_grad():
        rec = recurrence_form(module, query, key, value)
        par = parallel_form(module, query, key, value)
    _close(par, rec, FORMS_TOL, f"parallel vs recurrence {(batch, heads, n, tau, same)}")
    if n > 1 and batch:  # the decay is real: alpha inside (0, 1), well below 1 on average (far below for tau = 1)
        _, _, _, log_alpha = paper_inputs(module, query, key, value)
        alpha = torch.exp(log_alpha)
        assert alpha.max() < 1 and alpha.min() > 0
        assert alpha.mean() < (0.85 if tau == 1.0 else 0.98)
        assert alpha.min() < (0.5 if tau == 1.0 else 0.95)


CASES = [(batch, heads, n, chunk)
         for batch in (0, 1, 2)
         for heads in (1, 2, 3)
         for n in (0, 1, 5, 7, 13)
         for chunk in (2, 3, 4, None)]
NORMALIZERS = (1.0, 2.0, 16.0, None)  # None: the default (16)
RANKS = (3, 1, None, 5)               # None: the default (16)


@pytest.mark.parametrize("batch, heads, n, chunk", CASES)
def test_forward_reference_and_gradients_match_the_paper(registry, batch, heads, n, chunk):
    seed = CASES.index((batch, heads, n, chunk))
    tau, rank = NORMALIZERS[seed % 4], RANKS[(seed // 4) % 4]
    module = make_module(registry, heads, seed, chunk=chunk, rank=rank, normalizer=tau)
    d_model = D_MODEL[heads]
    same = seed % 3 == 0  # self-attention (one tensor) in a third of the cases
    query, key, value = make_inputs(batch, n, d_model, seed, same)
    case = dict(batch=batch, heads=heads, n=n, chunk=chunk, normalizer=tau, gate_rank=rank, same=same, seed=seed)

    with torch.no_grad():
        rec = recurrence_form(module, query, key, value)
        par = parallel_form(module, query, key, value)
        out = module(query, key, value, attn_mask=None, is_causal=True)
        registered = registry.variant(NAME).reference(module, query, key, value, attn_mask=None, is_causal=True)
    _close(par, rec, FORMS_TOL, f"parallel vs recurrence {case}")
    assert out.shape == (batch, n, d_model), case
    _close(out, rec, FORWARD_TOL, f"module forward vs recurrence {case}")
    _close(out, par, FORWARD_TOL, f"module forward vs parallel form {case}")
    _close(registered.double(), rec, FORWARD_TOL, f"registered reference vs recurrence {case}")
    _close(registered.double(), par, FORWARD_TOL, f"registered reference vs parallel form {case}")

    # gradients: query, key, value, gate_up.bias, gate_down.weight, q_proj.weight and every other parameter
    g = torch.Generator().manual_seed(40_000 + seed)
    cotangent = torch.randn(batch, n, d_model, generator=g, dtype=torch.float64)
    if same:
        x = query.clone().requires_grad_(True)
        inputs, labels = [x], ["x (query = key = value)"]
        call = (x, x, x)
    else:
        inputs = [t.clone().requires_grad_(True) for t in (query, key, value)]
        labels, call = ["query", "key", "value"], inputs
    params = dict(module.named_parameters())
    first = ["gate_up.bias", "gate_down.weight", "q_proj.weight"]
    names = first + sorted(set(params) - set(first))
    tensors = inputs + [params[p] for p in names]
    got = _grads(module(*call, attn_mask=None, is_causal=True), cotangent, tensors)
    want = _grads(recurrence_form(module, *call), cotangent, tensors)
    for label, a, b in zip(labels + names, got, want):
        _close(a, b, GRAD_TOL, f"gradient wrt {label} {case}")


@pytest.mark.parametrize("batch, heads, n, chunk", [(2, 1, 13, 3), (2, 2, 7, 2), (1, 3, 5, 4), (2, 2, 13, None),
                                                    (0, 2, 5, 2), (1, 1, 0, 3), (1, 2, 1, 2), (2, 3, 13, 4)])
def test_no_decay_is_causal_linear_attention(registry, batch, heads, n, chunk):
    """gate_up.bias = +50: log alpha = logsigmoid(~50) / tau ~ -2e-22, so alpha = 1 to float64 precision and the
    layer is plain causal linear attention (each head then normalised) sum_{s<=t} (q_t . k_s) v_s / sqrt(d) per head."""
    seed = 500 + batch * 100 + heads * 10 + n
    module = make_module(registry, heads, seed, chunk=chunk, rank=3, normalizer=1.0)
    with torch.no_grad():
        module.gate_up.bias.fill_(50.0)
    query, key, value = make_inputs(batch, n, D_MODEL[heads], seed)
    case = (batch, heads, n, chunk)
    with torch.no_grad():
        linear = causal_linear_attention(module, query, key, value)
        out = module(query, key, value, attn_mask=None, is_causal=True)
        rec = recurrence_form(module, query, key, value)
    _close(rec, linear, FORWARD_TOL, f"recurrence vs causal linear attention {case}")
    _close(out, linear, FORWARD_TOL, f"module vs causal linear attention {case}")
    with torch.no_grad():  # and with a real decay the same inputs do not give linear attention
        module.gate_up.bias.fill_(0.0)
        decayed = module(query, key, value, attn_mask=None, is_causal=True)
    if batch and n > 1:
        assert (decayed - linear).abs().max() > 1e-3


@pytest.mark.parametrize("heads", [1, 2, 3])
def test_chunk_size_changes_nothing(registry, heads):
    """The chunk is a schedule, not the math: every chunk size gives the same output (n = 13, a partial chunk
    for 2, 3, 4, 5 and 8; one chunk for 13 and 16)."""
    n, batch = 13, 2
    outs = {}
    for chunk in (1, 2, 3, 4, 5, 8, 13, 16):
        module = make_module(registry, heads, 7, chunk=chunk, rank=3, normalizer=2.0)  # the same parameters
        query, key, value = make_inputs(batch, n, D_MODEL[heads], 7)
        with torch.no_grad():
            outs[chunk] = module(query, key, value, attn_mask=None, is_causal=True)
    with torch.no_grad():
        rec = recurrence_form(module, query, key, value)
    for chunk, out in outs.items():
        _close(out, rec, FORWARD_TOL, f"chunk={chunk} vs recurrence (heads={heads})")


@pytest.mark.parametrize("chunk", [2, 3, None])
def test_output_is_causal(registry, chunk):
    """Changing query, key and value from token t on leaves the outputs before t exactly as they were."""
    heads, batch, n = 2, 2, 11
    module = make_module(registry, heads, 11, chunk=chunk, rank=3, normalizer=2.0)
    query, key, value = make_inputs(batch, n, D_MODEL[heads], 11)
    g = torch.Generator().manual_seed(99)
    with torch.no_grad():
        base = module(query, key, value, attn_mask=None, is_causal=True)
        for t in (0, 1, 4, 6, 10):
            moved = [x.clone() for x in (query, key, value)]
            for x in moved:
                x[:, t:] += torch.randn(x[:, t:].shape, generator=g, dtype=torch.float64)
            out = module(*moved, attn_mask=None, is_causal=True)
            _close(out[:, :t], base[:, :t], 1e-13, f"outputs before t={t} after changing tokens >= t")
            assert (out[:, t] - base[:, t]).abs().max() > 1e-6  # and token t itself does move


@pytest.mark.parametrize("heads, n, chunk", [(2, 13, 4), (3, 13, 2), (1, 9, 3), (2, 13, None), (1, 13, 13)])
def test_strong_decay_stays_finite_and_exact(registry, heads, n, chunk):
    """gate_up.bias ~ -100 on every other key feature, tau = 1: log alpha ~ -100 per token there, so segment sums
    reach below -709 within the sequence (exp of their negatives overflows float64), while the other features
    decay slowly. The math is finite (every decay factor is <= 1); the module's output and gradients must be
    too, and equal the recurrence."""
    batch = 2
    seed = 3000 + heads * 100 + n
    module = make_module(registry, heads, seed, chunk=chunk, rank=3, normalizer=1.0)
    with torch.no_grad():  # every other key feature forgets at once; the rest keep their normal(0, 2) bias
        module.gate_up.bias[::2] -= 100.0
    query, key, value = make_inputs(batch, n, D_MODEL[heads], seed)
    _, _, _, log_alpha = paper_inputs(module, query, key, value)
    assert log_alpha.sum(1).min() < -math.log(torch.finfo(torch.float64).max)  # exp(-total) overflows
    assert log_alpha.sum(1).max() > -50  # and some features still carry memory across the sequence
    case = (heads, n, chunk)
    with torch.no_grad():
        rec = recurrence_form(module, query, key, value)
        par = parallel_form(module, query, key, value)
        out = module(query, key, value, attn_mask=None, is_causal=True)
    _close(par, rec, FORMS_TOL, f"parallel vs recurrence, strong decay {case}")
    _close(out, rec, FORWARD_TOL, f"module vs recurrence, strong decay {case}")

    g = torch.Generator().manual_seed(50_000 + seed)
    cotangent = torch.randn(batch, n, D_MODEL[heads], generator=g, dtype=torch.float64)
    inputs = [t.clone().requires_grad_(True) for t in (query, key, value)]
    names = ["gate_up.bias", "gate_down.weight", "q_proj.weight", "k_proj.weight", "v_proj.weight"]
    tensors = inputs + [dict(module.named_parameters())[p] for p in names]
    got = _grads(module(*inputs, attn_mask=None, is_causal=True), cotangent, tensors)
    want = _grads(recurrence_form(module, *inputs), cotangent, tensors)
    for label, a, b in zip(["query", "key", "value"] + names, got, want):
        _close(a, b, GRAD_TOL, f"gradient wrt {label}, strong decay {case}")


def test_decay_uses_the_key_input_and_the_normalizer(registry):
    """The normalizer divides the gate's log: tau = 1 and tau = 16 on the same parameters give different outputs,
    each the recurrence's; and the gate reads the KEY input: with query and key swapped the module still
    matches the recurrence (which takes the gate from whatever is passed as key)."""
    heads, batch, n = 2, 1, 6
    a = make_module(registry, heads, 21, chunk=2, rank=3, normalizer=1.0)
    b = make_module(registry, heads, 21, chunk=2, rank=3, normalizer=16.0)
    query, key, value = make_inputs(batch, n, D_MODEL[heads], 21)
    with torch.no_grad():
        out_a, out_b = (m(query, key, value, attn_mask=None, is_causal=True) for m in (a, b))
        _close(out_a, recurrence_form(a, query, key, value), FORWARD_TOL, "tau = 1")
        _close(out_b, recurrence_form(b, query, key, value), FORWARD_TOL, "tau = 16")
        assert (out_a - out_b).abs().max() > 1e-3
        # query and key swapped: the gate now comes from the tensor passed as key
        swapped = a(key, query, value, attn_mask=None, is_causal=True)
        _close(swapped, recurrence_form(a, key, query, value), FORWARD_TOL, "query and key swapped")
