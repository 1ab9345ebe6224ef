"""Correctness suite: each variant against its float64 reference, its baselines, and properties
that must hold for any attention with its declared capabilities.

Every check here is shown to fail on a deliberately broken variant in tests/suites/test_correctness.py.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import statistics

import torch
from torch.autograd.gradcheck import GradcheckError
from torch.func import functional_call

import zoo
from zoo import approximation, checks, decoding, reference
from zoo.cases import Case, cases_for, relative_error
from zoo.checks import BAD, ERROR, FAILED, PASSED, SKIPPED, Check, Result, requires
from zoo.contract import VariantOutputError
from zoo.functional import dense_shortcuts
from zoo.suite import legacy_names

SUITE = "correctness"
FLOAT64_TOLERANCE = 1e-10
FLOAT32_TOLERANCE = 1e-5
EXACT = 1e-12  # "unchanged" for properties computed in float64
GRADCHECK_LENGTH = 9  # a variant's check_options should make its chunks or blocks repeat within this length


def _seeds(profile, salt: int):
    return [profile.seed * 1000 + salt * 37 + i for i in range(profile.of(SUITE).cases)]


def _setup(variant, case: Case, seed: int, dtype=torch.float64, scale: float = 1.0, device: str = "cpu"):
    """The case's module and inputs; a causal-only variant's case is made causal here, so every check calls it in
    the one mode it computes (the case's row then says 'causal')."""
    if variant.tags.causal_only:
        case.causal = True
    torch.manual_seed(seed)
    module = case.build(variant, dtype=dtype, device=device)
    return module, case.inputs(seed, dtype=dtype, scale=scale, device=device)


def _call(module, case: Case, query, key, value, mask):
    """One call on finite inputs; non-finite outputs make the check an error, with the case named."""
    out = module(query, key, value, attn_mask=mask, is_causal=case.causal)
    if not torch.isfinite(out).all():
        bad = int((~torch.isfinite(out)).sum())
        raise VariantOutputError(f"{bad} non-finite (NaN/inf) output values on finite inputs [{case.describe()}]")
    return out


def _verdict(check: str, case: Case, errors: list[tuple[float, int]], tolerance: float, what: str,
             versus: str = "") -> Result:
    worst, seed = max(errors)
    ok = worst <= tolerance
    detail = "" if ok else f"{what} {worst:.3g} > {tolerance:g} at seed {seed}"
    return Result(check, PASSED if ok else FAILED, case.describe(), worst, "rel. error", detail, versus=versus,
                  params=case.params())


def _reference_errors(variant, case: Case, seeds, dtype, device: str = "cpu", require_finite: bool = True,
                      plain: dict | None = None):
    """(relative error vs the float64 reference, seed) per seed; the reference runs on a CPU copy. Given ``plain``,
    it gets each seed's error of the reference's own code run as plain torch in ``dtype`` and, where that could
    not run there or was not finite, None and why."""
    errors = []
    for seed in seeds:
        module, (q, k, v, mask) = _setup(variant, case, seed, dtype, device=device)
        with torch.no_grad():
            if require_finite:
                out = _call(module, case, q, k, v, mask)
            else:
                out = module(q, k, v, attn_mask=mask, is_causal=case.causal)
            module, q, k, v = copy.deepcopy(module).cpu(), q.cpu(), k.cpu(), v.cpu()  # a CPU copy, whatever the device
            mask = None if mask is None else mask.cpu()
            expected = variant.reference(module, q, k, v, attn_mask=mask, is_causal=case.causal)
            if plain is not None:
                plain_out, why = _plain_reference(variant, module, case, q, k, v, mask)
                plain[seed] = (None, why) if plain_out is None else (relative_error(plain_out, expected), "")
        errors.append((relative_error(out.cpu(), expected), seed))
    return errors


def _plain_reference(variant, module, case: Case, q, k, v, mask):
    """The reference computed as plain torch in the inputs' precision, or why it cannot be (an op torch lacks in
    that dtype, non-finite values): ``(output, "")`` or ``(None, reason)``. The check then holds the variant to the
    epsilon floor alone, the stricter bound, so a reference that breaks here can only make the check harder."""
    try:
        with reference.plain_precision(q.dtype):
            out = variant.reference(module, q, k, v, attn_mask=mask, is_causal=case.causal)
    except (RuntimeError, NotImplementedError, TypeError) as error:
        return None, describe_exception(error)
    return (out, "") if torch.isfinite(out).all() else (None, "non-finite output")


def check_reference(dtype, tolerance):
    """A check against the float64 reference in ``dtype``, to ``tolerance``."""
    def run(variant, profile):
        name = f"reference-{str(dtype).removeprefix('torch.')}"
        for case in cases_for(variant):
            errors = _reference_errors(variant, case, _seeds(profile, 1), dtype)
            yield _verdict(name, case, errors, tolerance, "relative error vs float64 reference")

    return run


LOW_PRECISION = (torch.bfloat16, torch.float16)
LOW_PRECISION_EPSILONS = 4  # always allowed: 4 machine epsilons of the dtype (bf16 3.1e-2, fp16 3.9e-3)
PLAIN_TORCH_FACTOR = 2  # and FlashAttention's rule: at most twice the error of plain torch in the same precision


def check_low_precision(variant, profile):
    """bf16 and fp16 runs on the profile's device against the float64 reference of the same weights, each seed's
    error within 4 machine epsilons or twice that of the reference's own math run as plain torch in that dtype
    (FlashAttention's rule: a recurrence or a chain of normalisations in bf16 rounds more than one softmax)."""
    seeds = _seeds(profile, 13)
    for dtype in LOW_PRECISION:
        name, floor = str(dtype).removeprefix("torch."), LOW_PRECISION_EPSILONS * torch.finfo(dtype).eps
        for case in cases_for(variant):
            plain = {}
            errors = _reference_errors(variant, case, seeds, dtype, profile.device, require_finite=False, plain=plain)
            error_at = {seed: error for error, seed in errors}
            allowed = {seed: floor if plain[seed][0] is None else max(floor, PLAIN_TORCH_FACTOR * plain[seed][0])
                       for seed in seeds}
            seed = max(seeds, key=lambda s: _nan_as_worst(error_at[s]) / allowed[s])  # furthest past its own bound
            ok = error_at[seed] <= allowed[seed]  # False for NaN
            plain_error, why = plain[seed]
            plain_text = f"(could not run: {why})" if plain_error is None else f"{plain_error:.3g}"
            detail = (f"relative error vs float64 reference {error_at[seed]:.3g} {'<=' if ok else '>'} "
                      f"{allowed[seed]:.3g} (the larger of {LOW_PRECISION_EPSILONS} epsilons, {floor:g}, and "
                      f"{PLAIN_TORCH_FACTOR} x plain torch's {plain_text} in {name}) at seed {seed}")
            yield Result("reference-low-precision", PASSED if ok else FAILED,
                         f"{case.describe()} {name} on {profile.device}", max(error_at.values(), key=_nan_as_worst),
                         "rel. error", detail,
                         params={**case.params(), "dtype": name})


def _nan_as_worst(error: float) -> float:
    """A NaN error (non-finite output) is the worst error there is."""
    return math.inf if math.isnan(error) else error


def check_baselines(variant, profile):
    """The variant against each of its baselines, float64."""
    if not variant.baselines:
        yield Result("baselines", SKIPPED, detail="variant declares no baselines")
        return
    for label, make in variant.baselines.items():
        for case in cases_for(variant):
            if case.mask == "empty-rows":  # torch modules give NaN there; the zoo's contract says zeros
                continue
            errors = []
            for seed in _seeds(profile, 2):
                module, (q, k, v, mask) = _setup(variant, case, seed)
                with torch.no_grad():
                    errors.append((relative_error(_call(make(module), case, q, k, v, mask), _call(module, case, q, k, v, mask)), seed))
            yield _verdict("baselines", case, errors, FLOAT64_TOLERANCE, f"relative error vs {label}", versus=label)


def check_gradients(variant, profile):
    """torch.autograd.gradcheck on inputs and parameters, at lengths that span the check options' chunks."""
    tags = variant.tags
    k_len = 4 if tags.allows_different_lengths else 3
    cases = [Case(batch=1, q_len=3, k_len=k_len, d_model=4, num_heads=2)]
    if tags.supports_causal:
        cases.append(Case(batch=1, q_len=4, k_len=4, d_model=4, num_heads=2, causal=True))
    if tags.accepts_attn_mask:
        cases.append(Case(batch=1, q_len=3, k_len=k_len, d_model=4, num_heads=2, mask="random"))
    # long enough to span several chunks or blocks at the check options: a backward wrong only across chunks
    cases.append(Case(batch=1, q_len=GRADCHECK_LENGTH, k_len=GRADCHECK_LENGTH, d_model=4, num_heads=2,
                      causal=tags.supports_causal))
    for case in cases:
        case.options = dict(variant.check_options)
        seed = _seeds(profile, 3)[0]
        module, (q, k, v, mask) = _setup(variant, case, seed)
        names = [n for n, p in module.named_parameters() if p.requires_grad]
        params = [module.get_parameter(n).detach().clone().requires_grad_() for n in names]

        def fn(query, key, value, *weights):
            return functional_call(module, dict(zip(names, weights)), (query, key, value),
                                   {"attn_mask": mask, "is_causal": case.causal})

        inputs = tuple(x.detach().clone().requires_grad_() for x in (q, k, v)) + tuple(params)
        try:
            ok = torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-6, rtol=1e-4)
            detail = ""
        except GradcheckError as exc:
            ok, detail = False, str(exc).splitlines()[0]
        setting = f"{case.describe()} params={len(params)}"
        yield Result("gradcheck", PASSED if ok else FAILED, setting, detail=detail, params=case.params())


def _unchanged(check, case, before, after, what, tolerance=EXACT) -> Result:
    diff = float((before - after).abs().max()) if before.numel() else 0.0
    ok = diff <= tolerance * max(1.0, float(before.abs().max()) if before.numel() else 1.0)
    return Result(check, PASSED if ok else FAILED, case.describe(), diff, "max abs change",
                  "" if ok else f"{what} changed the output by {diff:.3g}", params=case.params())


def _no_influence(check, case, before, after, gradient: float, what: str) -> Result:
    """Passes when changing ``what`` left the outputs unchanged and they have no gradient w.r.t. it."""
    result = _unchanged(check, case, before, after, f"changing {what}")
    if result.status == PASSED and gradient > 0:
        return Result(check, FAILED, case.describe(), gradient, "max abs grad",
                      f"outputs have gradient {gradient:.3g} with respect to {what}", params=case.params())
    return result


def check_permutation(name: str, salt: int, what: str, permute_keys: bool):
    """Permuting the queries must permute the outputs the same way; permuting the key/value pairs
    together must leave them unchanged."""

    def run(variant, profile):
        case = Case(batch=2, q_len=8, k_len=8, options=dict(variant.check_options))
        for seed in _seeds(profile, salt):
            module, (q, k, v, _) = _setup(variant, case, seed)
            perm = torch.randperm(case.k_len if permute_keys else case.q_len, generator=torch.Generator().manual_seed(seed))
            with torch.no_grad():
                out = module(q, k, v)
                if permute_keys:
                    expected, permuted = out, module(q, k[:, perm], v[:, perm])
                else:
                    expected, permuted = out[:, perm], module(q[:, perm], k, v)
            yield _unchanged(name, case, expected, permuted, what)

    return run


def check_batch_independence(variant, profile):
    """Changing one batch element leaves the others' outputs as they were."""
    case = Case(batch=3, q_len=8, k_len=8, options=dict(variant.check_options))
    for seed in _seeds(profile, 6):
        module, (q, k, v, _) = _setup(variant, case, seed)
        with torch.no_grad():
            out = module(q, k, v, is_causal=case.causal)
            q2, k2, v2 = (x.clone() for x in (q, k, v))
            for x in (q2, k2, v2):
                x[1:] = torch.randn_like(x[1:]) * 3
            changed = module(q2, k2, v2, is_causal=case.causal)
        yield _unchanged("batch-independence", case, out[0], changed[0], "changing other batch elements")


def _grad(x: torch.Tensor) -> torch.Tensor:
    """x's gradient; zeros when the output does not depend on x (a variant may ignore its queries)."""
    return torch.zeros_like(x) if x.grad is None else x.grad


def check_causal_leak(variant, profile):
    """Future tokens change neither earlier outputs nor their gradients."""
    case = Case(batch=2, q_len=10, k_len=10, causal=True, options=dict(variant.check_options))
    cut = 6
    for seed in _seeds(profile, 7):
        module, (q, k, v, _) = _setup(variant, case, seed)
        inputs = [x.clone().requires_grad_() for x in (q, k, v)]
        out = module(*inputs, is_causal=True)
        out[:, :cut].sum().backward()
        leaked = max(float(_grad(x)[:, cut:].abs().max()) for x in inputs)
        with torch.no_grad():
            future = [x.clone() for x in (q, k, v)]
            for x in future:
                x[:, cut:] = torch.randn_like(x[:, cut:]) * 3
            changed = module(*future, is_causal=True)
        yield _no_influence("causal-leak", case, out[:, :cut].detach(), changed[:, :cut], leaked, "future tokens")


def check_masked_keys(variant, profile):
    """Masked keys change neither the outputs nor their gradients."""
    case = Case(batch=2, q_len=8, k_len=8, mask="padding", options=dict(variant.check_options))
    for seed in _seeds(profile, 8):
        module, (q, k, v, mask) = _setup(variant, case, seed)
        hidden = ~mask[:, 0, 0]  # (batch, k_len): keys nobody may attend to
        inputs = [x.clone().requires_grad_() for x in (q, k, v)]
        out = module(*inputs, attn_mask=mask, is_causal=case.causal)
        out.sum().backward()
        leaked = max(float(_grad(x)[hidden].abs().max()) if hidden.any() else 0.0 for x in inputs[1:])
        with torch.no_grad():
            k2, v2 = k.clone(), v.clone()
            k2[hidden] = torch.randn_like(k2[hidden]) * 3
            v2[hidden] = torch.randn_like(v2[hidden]) * 3
            changed = module(q, k2, v2, attn_mask=mask, is_causal=case.causal)
        yield _no_influence("masked-keys", case, out.detach(), changed, leaked, "masked-out keys/values")


def check_empty_rows(variant, profile):
    """A fully masked query row is finite, ignores the keys and (without parameters) is zero."""
    case = Case(batch=2, q_len=9, k_len=9, mask="empty-rows", options=dict(variant.check_options))
    for seed in _seeds(profile, 9):
        module, (q, k, v, mask) = _setup(variant, case, seed)
        empty = ~mask.any(dim=-1)[:, 0]  # (batch, q_len)
        inputs = [x.clone().requires_grad_() for x in (q, k, v)]
        out = module(*inputs, attn_mask=mask, is_causal=case.causal)
        out.sum().backward()
        if not torch.isfinite(out).all() or not all(torch.isfinite(_grad(x)).all() for x in inputs):
            yield Result("empty-rows", FAILED, case.describe(), detail="non-finite output or gradient for fully masked rows",
                         params=case.params())
            continue
        if not variant.tags.has_parameters:
            worst = float(out.detach()[empty].abs().max())
            ok = worst == 0.0
            yield Result("empty-rows", PASSED if ok else FAILED, case.describe(), worst, "max abs output",
                         "" if ok else f"fully masked rows give {worst:.3g}, not zeros", params=case.params())
            continue
        with torch.no_grad():  # with parameters (e.g. an output bias) the row need not be 0: it must ignore keys
            changed = module(q, torch.randn_like(k) * 3, torch.randn_like(v) * 3, attn_mask=mask,
                             is_causal=case.causal)
        yield _unchanged("empty-rows", case, out.detach()[empty], changed[empty], "keys/values of fully masked rows")


def check_dtype_device(variant, profile):
    """On the CPU and on the run's device (cuda in a GPU run)."""
    for device in dict.fromkeys(["cpu", profile.device]):
        for dtype in (torch.float32, torch.float64):
            for case in cases_for(variant):
                module, (q, k, v, mask) = _setup(variant, case, _seeds(profile, 10)[0], dtype, device=device)
                try:
                    with torch.no_grad():
                        module(q, k, v, attn_mask=mask, is_causal=case.causal)
                    problem = ""
                except VariantOutputError as exc:  # shape, dtype and device are checked on every call
                    problem = str(exc)
                setting = f"{case.describe()} {str(dtype).removeprefix('torch.')} on {device}"
                yield Result("dtype-device", FAILED if problem else PASSED, setting, detail=problem, params=case.params())


def _placement_problem(exc: Exception) -> bool:
    """Whether an error on the meta device is a tensor left on the CPU (and not an op meta cannot run)."""
    message = str(exc).lower()
    return "device" in message and "cpu" in message


def check_device_placement(variant, profile):
    """Runs the variant and its baselines on the meta device, which holds no data: any tensor made on
    the CPU instead of the inputs' device meets a meta tensor and fails, as it would on a GPU. So a
    plugin author without a GPU still learns whether the variant will run on one."""
    for case in cases_for(variant):
        module, (q, k, v, mask) = _setup(variant, case, _seeds(profile, 14)[0], torch.float32, device="meta")
        builders = {"": lambda: module, **{label: functools.partial(make, module)
                                           for label, make in variant.baselines.items()}}
        for label, build in builders.items():
            setting, where = case.describe() + (f" baseline {label}" if label else ""), dict(versus=label, params=case.params())
            try:
                with torch.no_grad():
                    build()(q, k, v, attn_mask=mask, is_causal=case.causal)
            except (RuntimeError, NotImplementedError) as exc:
                message = " ".join(str(exc).split())[:300]
                if _placement_problem(exc):
                    yield Result("device-placement", FAILED, setting, detail=f"a tensor stays on the CPU: {message}", **where)
                else:
                    yield Result("device-placement", SKIPPED, setting,
                                 detail=f"not checkable on the meta device (a value read back, or an op meta lacks): {message}",
                                 **where)
                continue
            yield Result("device-placement", PASSED, setting, **where)


def check_deterministic(variant, profile):
    """Two identical calls give identical outputs."""
    for case in cases_for(variant):
        module, (q, k, v, mask) = _setup(variant, case, _seeds(profile, 11)[0], torch.float32)
        with torch.no_grad():
            first, second = _call(module, case, q, k, v, mask), _call(module, case, q, k, v, mask)
        same = torch.equal(first, second)
        yield Result("deterministic", PASSED if same else FAILED, case.describe(),
                     detail="" if same else "two identical calls gave different outputs", params=case.params())


def check_large_magnitude(variant, profile):
    """Inputs scaled by 1e4 give finite outputs."""
    for case in cases_for(variant):
        module, (q, k, v, mask) = _setup(variant, case, _seeds(profile, 12)[0], torch.float32, scale=1e4)
        with torch.no_grad():
            out = module(q, k, v, attn_mask=mask, is_causal=case.causal)
        finite = bool(torch.isfinite(out).all())
        yield Result("large-magnitude", PASSED if finite else FAILED, f"{case.describe()} inputs x1e4",
                     detail="" if finite else "non-finite outputs (softmax overflow?)", params=case.params())


def _empty_cases(tags) -> list[Case]:
    """Sequences of length 0 (queries, keys or both) and a batch of 0, in every mode the variant takes."""
    shapes = [(2, 0, 0), (0, 5, 5)] + ([(2, 0, 5), (2, 5, 0)] if tags.allows_different_lengths else [])
    modes = [False] + ([True] if tags.supports_causal else [])
    return [Case(batch=b, q_len=q, k_len=k, causal=causal) for b, q, k in shapes for causal in modes]


def check_empty_sequences(variant, profile):
    """A length-0 sequence (queries, keys or both) or a batch of 0 gives an output of the right shape, equal to the
    float64 reference (queries with no key give what a fully masked row gives), and a backward that runs: a model
    meets them at the edges of a batch."""
    for case in _empty_cases(variant.tags):
        case.options = dict(variant.check_options)
        module, (q, k, v, mask) = _setup(variant, case, _seeds(profile, 15)[0])
        try:
            inputs = [x.clone().requires_grad_() for x in (q, k, v)]
            out = _call(module, case, *inputs, mask)
            out.sum().backward()
            with torch.no_grad():
                expected = variant.reference(module, q, k, v, attn_mask=mask, is_causal=case.causal)
            problem = "" if expected.shape == out.shape else f"reference gives shape {tuple(expected.shape)}"
            error = relative_error(out.detach(), expected) if out.numel() and not problem else 0.0
            if error > FLOAT64_TOLERANCE:
                problem = f"relative error vs float64 reference {error:.3g} > {FLOAT64_TOLERANCE:g}"
        except Exception as exc:  # a crash on an empty input is this check's finding, not an error of the run
            problem = f"raised {checks.describe_exception(exc)}"
        yield Result("empty-sequences", FAILED if problem else PASSED, case.describe(), detail=problem,
                     params=case.params())


OUTLIER_SCALE = 20.0  # the big keys' norm, in units of the others'; enough to push a shared float32 stabiliser
# (exp of a logit over all keys) past float32's range on the check's small heads
HARD_TOLERANCE = 1e-4  # float32 against float64 where the softmax is peaked by 20x keys (a float32 rounding of a
# logit of 100 moves its weight by about 1e-5)


def _outlier_cases(variant) -> list[tuple[Case, str]]:
    """(case, which keys are hidden): keys a query may not see, masked (padding) or in the future (causal)."""
    tags, cases = variant.tags, []
    if tags.accepts_attn_mask:
        cases.append((Case(batch=2, q_len=10, k_len=10, mask="padding"), "masked"))
    if tags.supports_causal:
        cases.append((Case(batch=2, q_len=11, k_len=11, causal=True), "future"))
    for case, _ in cases:
        case.options = dict(variant.check_options)
    return cases


def check_outlier_keys(variant, profile):
    """In float32, keys a query may not see (masked, or in its future) whose norm is far from the visible keys'
    (20x larger, or 20x smaller than theirs) leave its output equal to the float64 reference: a stabiliser taken
    over every key, as one shift for all of them, lets such a key zero (or overflow) what the query may see.
    Standard normal inputs never reach this regime."""
    cases = _outlier_cases(variant)
    if not cases:
        yield Result("outlier-keys", SKIPPED, detail="variant takes neither masks nor is_causal: every key is visible")
        return
    for case, hidden_by in cases:
        for seed in _seeds(profile, 16):
            module, (q, k, v, mask) = _setup(variant, case, seed, torch.float32)
            hidden = (~mask[:, 0, 0] if hidden_by == "masked" else
                      (torch.arange(case.k_len) >= case.k_len // 2).expand(case.batch, -1))
            for big in ("hidden", "visible"):
                keys = k.clone()
                scaled = hidden if big == "hidden" else ~hidden
                keys[scaled] *= OUTLIER_SCALE
                with torch.no_grad():
                    out = module(q, keys, v, attn_mask=mask, is_causal=case.causal)
                    double = copy.deepcopy(module).double()
                    expected = variant.reference(double, q.double(), keys.double(), v.double(), attn_mask=mask,
                                                 is_causal=case.causal)
                error = relative_error(out, expected) if torch.isfinite(out).all() else float("inf")
                ok = error <= HARD_TOLERANCE
                setting = f"{case.describe()} float32 {hidden_by} keys {'20x' if big == 'hidden' else '1/20x'} the visible"
                yield Result("outlier-keys", PASSED if ok else FAILED, setting, error, "rel. error",
                             "" if ok else f"relative error vs float64 reference {error:.3g} > {HARD_TOLERANCE:g} at seed "
                             f"{seed}: keys a query may not see change what it computes in float32",
                             params={**case.params(), "hidden": hidden_by, "big": big})


LONG_LENGTH = 300  # spans several chunks, blocks or windows at every built-in's default sizes (64, 128), not a
# multiple of them


def check_long_sequences(variant, profile):
    """At the variant's default options (not its small check options), a sequence spanning several of its chunks,
    blocks or windows equals the float64 reference: a fault that appears only past a default chunk is caught. Where
    the variant handed the sequence to one dense call instead (:func:`zoo.functional.dense_call_pays`: the blocks
    would hold most of the scores), the case runs again with that shortcut off, so the blocked path is checked too."""
    tags = variant.tags
    cases = [Case(batch=1, q_len=LONG_LENGTH, k_len=LONG_LENGTH)]
    if tags.supports_causal:
        cases.append(Case(batch=1, q_len=LONG_LENGTH, k_len=LONG_LENGTH, causal=True))
    if tags.accepts_attn_mask:
        cases.append(Case(batch=1, q_len=LONG_LENGTH, k_len=LONG_LENGTH, mask="padding", causal=tags.supports_causal))
    seeds = _seeds(profile, 17)[:1]
    for case in cases:
        with dense_shortcuts() as watch:
            errors = _reference_errors(variant, case, seeds, torch.float64)
        yield _verdict("long-sequences", case, errors, FLOAT64_TOLERANCE, "relative error vs float64 reference")
        if watch.taken:
            with dense_shortcuts(allowed=False):
                errors = _reference_errors(variant, case, seeds, torch.float64)
            verdict = _verdict("long-sequences", case, errors, FLOAT64_TOLERANCE, "relative error vs float64 "
                               "reference with its dense shortcut off (its blocked path)")
            yield dataclasses.replace(verdict, setting=f"{verdict.setting} blocked path (dense shortcut off)")


APPROXIMATION_LENGTH, APPROXIMATION_D_MODEL, APPROXIMATION_HEADS = 256, 64, 2


def check_approximation(variant, profile):
    """An approximation must beat the trivial answer on inputs with structure any approximation of its
    function should capture; its own reference cannot show that (a bug it shares passes everything)."""
    reason = approximation.not_measurable(variant)
    if reason:
        yield Result("approximation", SKIPPED, detail=reason)
        return
    for mode in variant.tags.modes:
        torch.manual_seed(profile.seed)
        module = zoo.build(variant, d_model=APPROXIMATION_D_MODEL, num_heads=APPROXIMATION_HEADS)
        errors = approximation.errors_by_input(variant, module, APPROXIMATION_LENGTH, APPROXIMATION_D_MODEL,
                                               APPROXIMATION_HEADS, mode == "causal", _seeds(profile, 13)[0])
        easy = [error for family, error in errors.items() if family.easy]
        mean = sum(easy) / len(easy)
        passed = mean < approximation.TRIVIAL_LEVEL
        yield Result("approximation", PASSED if passed else FAILED, f"{mode} n={APPROXIMATION_LENGTH} easy inputs",
                     mean, "normalised error",
                     f"mean normalised error on the easy inputs {mean:.3g} " + ("<" if passed else ">=")
                     + f" {approximation.TRIVIAL_LEVEL:g}" + ("" if passed else ": no better than each query's mean "
                                                              f"of the values as an approximation of {variant.approximates}")
                     + f" ({approximation.describe(errors)})", n=APPROXIMATION_LENGTH, mode=mode)


RANDOM_DRAWS = 400  # independently drawn modules the statistical checks average over
RANDOM_D_HEAD, RANDOM_HEADS = 8, 2
FAMILY_ALPHA = 1e-3  # the chance that a correct estimator fails a check's whole family of tests (Bonferroni)


def _critical_z(tests: int) -> float:
    """|z| beyond which one of ``tests`` two-sided tests rejects, at family-wise level FAMILY_ALPHA."""
    return statistics.NormalDist().inv_cdf(1 - FAMILY_ALPHA / (2 * tests))


PAIR_NORM = 0.5  # |x| d^-1/4 of every pair's query and key: larger norms give the estimates heavy tails (a
# lognormal's), whose sample means fall short of the kernel and fail a correct estimator


def _pairs(seed: int, width: int) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """Fixed (query, key) pairs: along the first and last axes and two random directions u, the pairs (u, u),
    (-u, -u) and (u, v) with v orthogonal to u; a biased draw of directions shows along some axis."""
    generator = torch.Generator().manual_seed(seed)

    def direction(*away: torch.Tensor) -> torch.Tensor:
        x = torch.randn(width, generator=generator, dtype=torch.float64)
        for other in away:
            x = x - (x @ other) * other
        return x / x.norm()

    axes = [torch.eye(width, dtype=torch.float64)[0], torch.eye(width, dtype=torch.float64)[-1], direction(), direction()]
    names = ["axis 0", f"axis {width - 1}", "random u", "random u'"]
    queries, keys, labels = [], [], []
    for axis, name in zip(axes, names):
        for query, key, label in ((axis, axis, "(u, u)"), (-axis, -axis, "(-u, -u)"), (axis, direction(axis), "(u, v)")):
            queries.append(query)
            keys.append(key)
            labels.append(f"{label} along {name}")
    scale = PAIR_NORM * width ** 0.25
    return torch.stack(queries) * scale, torch.stack(keys) * scale, labels


def check_random_features(variant, profile):
    """For a random-feature estimator (zoo.RandomFeatures), over 400 independently built modules: the mean estimate
    of its kernel on fixed query/key pairs is the exact kernel within a confidence interval (unbiasedness), and the
    random directions are isotropic (each coordinate of a unit direction has mean 0 and mean square 1/d). A module's
    own reference shares its draws, so only many draws can show a biased one."""
    features = variant.random_features
    if features is None:
        yield Result("random-features", SKIPPED, detail="variant declares no random features (zoo.RandomFeatures)")
        return
    width, heads = RANDOM_D_HEAD, RANDOM_HEADS
    query, key, labels = _pairs(profile.seed, width)
    q = query.expand(1, heads, *query.shape)
    k = key.expand(1, heads, *key.shape)
    exact = (torch.exp((q * k).sum(-1) / math.sqrt(width)) if features.kernel is None else
             torch.diagonal(features.kernel(q, k), dim1=-2, dim2=-1))
    ratios, directions = [], []
    for draw in range(RANDOM_DRAWS):
        torch.manual_seed(profile.seed * 100_003 + draw)
        module = zoo.build(variant, d_model=width * heads, num_heads=heads, **variant.check_options).double()
        with torch.no_grad():
            estimate = (features.features(module, q) * features.features(module, k)).sum(-1)
            ratios.append((estimate / exact)[0])  # (heads, pairs)
            if features.directions is not None:
                rows = features.directions(module).double()
                directions.append(rows / rows.norm(dim=-1, keepdim=True))  # (heads, features, width)
    ratios = torch.stack(ratios)  # (draws, heads, pairs)
    mean, spread = ratios.mean(0), ratios.std(0) / math.sqrt(RANDOM_DRAWS)
    z = ((mean - 1) / spread.clamp_min(1e-12)).abs()
    critical, largest = _critical_z(z.numel()), float(z.max())
    head, pair = divmod(int(z.argmax()), z.shape[1])
    ok = largest <= critical
    setting = " ".join([f"d_head={width} heads={heads}", *(f"{name}={value!r}" for name, value in variant.check_options.items()),
                        f"{RANDOM_DRAWS} draws {z.shape[1]} pairs"])
    yield Result("random-features", PASSED if ok else FAILED, f"{setting} unbiased", largest, "|z|",
                 "" if ok else f"the mean estimate of the kernel over {RANDOM_DRAWS} draws is "
                 f"{float(mean[head, pair]):.3f} x the exact kernel (+-{float(spread[head, pair]) * critical:.3f}) "
                 f"for the pair {labels[pair]} in head {head}: the estimator is biased", params={"test": "unbiased"})
    if not directions:
        yield Result("random-features", SKIPPED, f"{setting} isotropic", detail="the variant gives no directions")
        return
    units = torch.stack(directions).flatten(0, 1)  # (draws x heads, features, width): rows by their place
    count = units.shape[0]
    moments = torch.stack([units.mean(0), (units ** 2).mean(0)])  # each coordinate's mean and mean square
    fourth = 3 / (width * (width + 2)) - 1 / width ** 2  # the variance of a coordinate's square on the sphere
    z = torch.stack([moments[0] / math.sqrt(1 / width / count),
                     (moments[1] - 1 / width) / math.sqrt(fourth / count)]).abs()
    critical, largest = _critical_z(z.numel()), float(z.max())
    moment, row, axis = (int(i) for i in torch.unravel_index(z.argmax(), z.shape))
    ok = largest <= critical
    what, expected = [("mean", "0"), ("mean square", f"{1 / width:.3f}")][moment]
    yield Result("random-features", PASSED if ok else FAILED, f"{setting} isotropic", largest, "|z|",
                 "" if ok else f"coordinate {axis} of row {row}'s unit direction has {what} "
                 f"{float(moments[moment, row, axis]):.3f} over {count} draws, not {expected} (|z| {largest:.1f} > "
                 f"{critical:.1f}): the directions are not isotropic", params={"test": "isotropic"})


DECODE_LENGTH = 20  # positions a decode runs over on the check's small shapes (check_options: a window below it):
# past zoo.decoding.append's first regrowth
LEFT_PADDING = 3  # the padded case's first row masks its first keys: its first queries may attend to nothing


def _decode_case(variant, mask: str | None) -> Case:
    """The decoding checks' case: three sequences, four heads (so grouped heads really group), causal for a
    self-attention decoder; a context decoder's context is longer than its queries, and of other feature sizes,
    where the variant allows."""
    context, tags = variant.decoder.context, variant.tags
    k_len = DECODE_LENGTH + 3 if context and tags.allows_different_lengths else DECODE_LENGTH
    dims = dict(kdim=12, vdim=20) if context and tags.allows_kv_dims else {}
    return Case(batch=3, q_len=DECODE_LENGTH, k_len=k_len, d_model=16, num_heads=4, causal=not context, mask=mask,
                options=dict(variant.check_options), **dims)


def _decode_setup(variant, mask, seed, dtype=torch.float64):
    """The module, inputs, key-padding mask (batch, k_len) and the forward the decode must equal; with a mask the
    first sequence is left-padded, as a batch of prompts of different lengths is."""
    case = _decode_case(variant, mask)
    module, (q, k, v, attn_mask) = _setup(variant, case, seed, dtype)
    if attn_mask is not None:
        attn_mask[0, ..., :LEFT_PADDING] = False
    with torch.no_grad():
        expected = module(q, k, v, attn_mask=attn_mask, is_causal=case.causal)
    return case, module, (q, k, v), None if attn_mask is None else attn_mask[:, 0, 0], expected


def _not_decoding(check: str, variant) -> Result | None:
    reason = decoding.why_not(variant)
    return Result(check, SKIPPED, detail=reason) if reason else None


def check_decoding(variant, profile):
    """A prefill of p positions then one step per position equals the causal forward (a context decoder: the forward
    over its context), for p in {0, 1, n/2, n - 1}, without and (where the variant takes masks) with a key-padding
    mask that leaves a sequence's first queries nothing to attend to, three sequences at once; the same for each of
    the decoder's baselines (rows with ``versus`` its label)."""
    skipped = _not_decoding("decoding", variant)
    if skipped:
        yield skipped
        return
    decoders = {"": variant.decoder, **variant.decoder.baselines}
    for mask in [None, "padding"] if variant.tags.accepts_attn_mask else [None]:
        for seed in _seeds(profile, 11):
            case, module, (q, k, v), key_mask, expected = _decode_setup(variant, mask, seed)
            for versus, decoder in decoders.items():
                for prefill in sorted({0, 1, DECODE_LENGTH // 2, DECODE_LENGTH - 1}):
                    with torch.no_grad():
                        decoded, _ = decoding.decode(decoder, module, q, k, v, key_mask, prefill)
                    yield _decoded_verdict(variant, case, seed, prefill, decoded, expected, versus)


def _decoded_verdict(variant, case, seed, prefill, decoded, expected, versus) -> Result:
    """A decode's outputs against the forward's, and where they first went wrong."""
    error = relative_error(decoded, expected) if decoded.shape == expected.shape else float("inf")
    ok = error <= FLOAT64_TOLERANCE
    wrong = ((decoded - expected).abs().amax(dim=(0, 2)) > FLOAT64_TOLERANCE * expected.abs().max()
             if decoded.shape == expected.shape else None)
    where = ("" if ok else f"; first wrong position {int(wrong.nonzero()[0])} (0-based; steps start at "
             f"{prefill})" if wrong is not None and wrong.any() else f"; output {tuple(decoded.shape)}, "
             f"forward {tuple(expected.shape)}" if wrong is None else "")
    who = f"the outputs of its decoder baseline {versus!r}" if versus else "decoded outputs"
    return Result("decoding", PASSED if ok else FAILED, f"{case.describe()} prefill={prefill}", error,
                  "rel. error", "" if ok else f"{who} differ from the "
                  f"{'forward' if variant.decoder.context else 'causal forward'} by {error:.3g} > "
                  f"{FLOAT64_TOLERANCE:g} at seed {seed}{where}", versus=versus,
                  params={**case.params(), "prefill": prefill})


def _growth_problem(growth: str, counted: list[int]) -> str | None:
    """How the counted state bytes after 0, 1, 2... tokens break the declared growth (None: they keep it)."""
    steps = [b - a for a, b in zip(counted, counted[1:])]
    if growth == "fixed" and len(set(counted)) > 1:
        return f"declared fixed, but the state went {counted[0]} -> {counted[-1]} bytes over the decode"
    stretch = len(steps) // 4  # a cache may grow by whole blocks: a block shorter than this still shows
    if growth == "token" and any(sum(steps[start:start + stretch]) <= 0 for start in range(len(steps) - stretch + 1)):
        return (f"declared to grow with every token, but {stretch} steps in a row added no bytes (the steps added "
                f"{steps} bytes)")
    if growth == "window":
        grows = [step for step in steps if step]
        if not grows or len(set(grows)) > 1 or grows[0] < 0 or steps[:len(grows)] != grows:
            return f"declared to grow until its window is full and then stay, but the steps added {steps} bytes"
        if len(grows) == len(steps):
            return (f"declared to stop growing at its window, but it grew at every one of the {len(steps)} steps "
                    f"(set check_options to a window below the check's length, {DECODE_LENGTH})")
    return None


def _storages(state: dict) -> dict[str, int]:
    """Where each tensor of a state lives (its storage's address), by name."""
    return {name: value.untyped_storage().data_ptr() for name, value in state.items() if isinstance(value, torch.Tensor)}


def check_decoding_state(variant, profile):
    """The state's counted bytes, token by token, in float64 and float32: growing as declared (a cache by one
    token's worth per step, a fixed state never, a window's cache not past its window), equal to the declared
    formula at that element size where one is given, the same after a prefill of p tokens as after p steps; and no
    tensor of it moved to new storage at more than every other step (a cache copied whole per token, as torch.cat
    does, makes generation quadratic)."""
    skipped = _not_decoding("decoding-state", variant)
    if skipped:
        yield skipped
        return
    decoder = variant.decoder
    seed = _seeds(profile, 12)[0]  # the bytes depend on shapes, not values
    for dtype in (torch.float64, torch.float32):
        case, module, (q, k, v), _, _ = _decode_setup(variant, None, seed, dtype)
        counted, after_prefill, moves, last = [], [], {}, {}

        def watch(state):
            counted.append(decoding.counted_bytes(state))
            for name, address in _storages(state).items():
                moves[name] = moves.get(name, -1) + (last.get(name) != address)
                last[name] = address

        with torch.no_grad():
            decoding.decode(decoder, module, q, k, v, None, 0, watch)
            decoding.decode(decoder, module, q, k, v, None, DECODE_LENGTH // 2,
                            lambda state: after_prefill.append(decoding.counted_bytes(state)))
        setting, params = f"{case.describe()} {str(dtype).removeprefix('torch.')}", {**case.params(), "dtype": str(dtype)}
        problem = _growth_problem(decoder.growth, counted)
        yield Result("decoding-state", FAILED if problem else PASSED, f"{setting} growth={decoder.growth}",
                     counted[-1], "bytes", problem or "", params=params)
        if after_prefill[0] != counted[DECODE_LENGTH // 2]:
            yield Result("decoding-state", FAILED, f"{setting} prefill={DECODE_LENGTH // 2}", after_prefill[0], "bytes",
                         f"a prefill of {DECODE_LENGTH // 2} tokens left {after_prefill[0]} bytes, "
                         f"{DECODE_LENGTH // 2} steps {counted[DECODE_LENGTH // 2]}", params=params)
        copied = {name: count for name, count in moves.items() if count > DECODE_LENGTH // 2}
        yield Result("decoding-state", FAILED if copied else PASSED, f"{setting} storage", max(moves.values(), default=0),
                     "moves", "" if not copied else f"state tensors {sorted(copied)} moved to new storage at "
                     f"{max(copied.values())} of {DECODE_LENGTH} steps: copied whole per token (use "
                     "zoo.decoding.append or update in place)", params=params)
        if decoder.state_bytes is not None:  # a context decoder's state is its context's, whatever it decoded
            options = variant.resolve_options(case.options)
            itemsize = torch.finfo(dtype).bits // 8
            declared = [float(decoder.state_bytes(case.batch, case.k_len if decoder.context else context, case.d_model,
                                                  case.num_heads, itemsize=itemsize, **options))
                        for context in range(len(counted))]
            off = [(context, want, got) for context, (want, got) in enumerate(zip(declared, counted)) if want != got]
            yield Result("decoding-state", FAILED if off else PASSED, f"{setting} state_bytes formula", counted[-1],
                         "bytes", "" if not off else f"counted {off[0][2]} bytes after {off[0][0]} tokens, the "
                         f"declared state_bytes (itemsize {itemsize}) gives {off[0][1]:g} ({len(off)} of {len(counted)} "
                         "contexts differ)", params=params)


def check_decoding_isolation(variant, profile):
    """Two sequences decoded side by side, their steps interleaved, each equal to its own forward: no state is kept
    on the module or shared between decodes."""
    skipped = _not_decoding("decoding-isolation", variant)
    if skipped:
        yield skipped
        return
    decoder = variant.decoder
    for seed in _seeds(profile, 13):
        case, module, inputs, _, expected = _decode_setup(variant, None, seed)
        prefills = (1, DECODE_LENGTH // 2)
        sequences = [[x[row:row + 1] for x in inputs] for row in (0, 1)]  # rows 0 and 1, each on its own
        with torch.no_grad():
            states, outputs = [], []
            for (q, k, v), prefill in zip(sequences, prefills):
                output, state = (decoder.prefill(module, q[:, :prefill], k, v, None) if decoder.context else
                                 decoder.prefill(module, q[:, :prefill], k[:, :prefill], v[:, :prefill], None))
                states.append(state)
                outputs.append([output])
            for position in range(min(prefills), DECODE_LENGTH):
                for index, ((q, k, v), prefill) in enumerate(zip(sequences, prefills)):
                    if position < prefill:
                        continue
                    token = slice(position, position + 1)
                    output, states[index] = (decoder.step(module, states[index], q[:, token], None, None, None)
                                             if decoder.context else
                                             decoder.step(module, states[index], q[:, token], k[:, token], v[:, token],
                                                          None))
                    outputs[index].append(output)
        errors = [relative_error(torch.cat(out, dim=1), expected[row:row + 1]) for row, out in enumerate(outputs)]
        worst = max(errors)
        ok = worst <= FLOAT64_TOLERANCE
        yield Result("decoding-isolation", PASSED if ok else FAILED, f"{case.describe()} two decodes interleaved",
                     worst, "rel. error", "" if ok else f"decoding two sequences side by side, one of them differs "
                     f"from its own forward by {worst:.3g} > {FLOAT64_TOLERANCE:g} at seed {seed}: the decodes share "
                     "state", params=case.params())


CHECKS = [
    Check("reference-float64", SUITE, "equals its float64 reference to 1e-10 (relative)",
          check_reference(torch.float64, FLOAT64_TOLERANCE)),
    Check("reference-float32", SUITE, "float32 run equals the float64 reference to 1e-5 (relative)",
          check_reference(torch.float32, FLOAT32_TOLERANCE)),
    Check("reference-low-precision", SUITE, "bfloat16 and float16 runs (on the run's device) equal the float64 "
          "reference to 4 machine epsilons or twice plain torch's error in that dtype", check_low_precision),
    Check("baselines", SUITE, "equals each declared baseline implementation (float64, 1e-10)", check_baselines),
    Check("gradcheck", SUITE, "torch.autograd.gradcheck on inputs and parameters (float64)", check_gradients),
    Check("query-permutation", SUITE, "permuting the queries permutes the outputs",
          check_permutation("query-permutation", 4, "permuting the queries", permute_keys=False),
          requires("key_order_invariant")),
    Check("key-permutation", SUITE, "permuting key/value pairs leaves the outputs unchanged",
          check_permutation("key-permutation", 5, "permuting the key/value pairs", permute_keys=True),
          requires("key_order_invariant")),
    Check("batch-independence", SUITE, "each batch element is independent of the others", check_batch_independence),
    Check("causal-leak", SUITE, "future tokens change neither earlier outputs nor their gradients",
          check_causal_leak, requires("supports_causal")),
    Check("masked-keys", SUITE, "masked-out keys/values have no influence (values and gradients)",
          check_masked_keys, requires("accepts_attn_mask")),
    Check("empty-rows", SUITE, "a fully masked query row is finite and ignores keys (zeros without parameters)",
          check_empty_rows, requires("accepts_attn_mask")),
    Check("dtype-device", SUITE, "output shape (batch, q_len, d_model), dtype and device preserved (CPU and the "
          "run's device)", check_dtype_device),
    Check("device-placement", SUITE, "runs on the meta device, a stand-in for a GPU: no tensor made on the CPU "
          "behind the inputs' back", check_device_placement),
    Check("deterministic", SUITE, "two identical calls give identical outputs", check_deterministic),
    Check("large-magnitude", SUITE, "finite outputs for inputs scaled by 1e4", check_large_magnitude),
    Check("empty-sequences", SUITE, "length-0 queries, keys or both, and a batch of 0: the right shape, the "
          "reference's values and a backward that runs", check_empty_sequences),
    Check("outlier-keys", SUITE, "in float32, masked or future keys 20x larger or smaller than the visible ones leave "
          "the output equal to the float64 reference to 1e-4", check_outlier_keys),
    Check("long-sequences", SUITE, "at the default options, a sequence of 300 spanning several chunks, blocks or "
          "windows equals the float64 reference", check_long_sequences),
    Check("random-features", SUITE, "a random-feature estimator's mean over 400 draws is its kernel, and its "
          "directions are isotropic (z-tests at family-wise level 0.001)", check_random_features),
    Check("decoding", SUITE, "a prefill then one step per token equals the causal forward (float64), with and "
          "without key padding, at prefills of 0, 1, n/2 and n - 1 tokens", check_decoding),
    Check("decoding-state", SUITE, "the decoder's state grows as declared (per token, up to a window, or fixed), "
          "equals its state_bytes formula in float64 and float32, and is not copied whole per token",
          check_decoding_state),
    Check("decoding-isolation", SUITE, "two sequences decoded side by side do not share state",
          check_decoding_isolation),
    Check("approximation", SUITE, "an approximation beats the trivial answer (each query's mean of the values) "
          "against the function it approximates, on easy structured inputs", check_approximation),
]


def upgrade(row: dict) -> dict:
    """A stored row as the suite yields it today: a baseline's verdicts named by ``versus``, not in the check name
    (``baseline-<label>``) or, for device placement, at the end of the setting (``... baseline <label>``)."""
    row = legacy_names(row, {"baselines": "baseline-{}"}, [c.name for c in CHECKS])
    if row.get("form", 1) < 2 and row["check"] == "device-placement" and not row.get("versus") and " baseline " in (row.get("setting") or ""):
        row = {**row, "versus": row["setting"].rsplit(" baseline ", 1)[1]}
    return row


def section(board) -> zoo.Section:
    """Per variant: how many checks passed, failed, erred or did not apply, and how many cases ran."""
    rows = []
    for variant in board.variants:
        mine = board.rows(SUITE)
        mine = mine[mine.variant == variant]
        if mine.empty:
            continue
        by_check = mine.groupby("check").status
        rows.append({
            "variant": variant,
            "checks passed": sum(1 for _, s in by_check if (s == PASSED).any() and not s.isin(BAD).any()),
            "failed": sum(1 for _, s in by_check if (s == FAILED).any()),
            "errors": sum(1 for _, s in by_check if (s == ERROR).any()),
            "skipped (capability)": sum(1 for _, s in by_check if (s == SKIPPED).all()),
            "cases run": int(mine.status.isin([PASSED, FAILED]).sum()),
        })
    tolerance = {dtype: f"{value:g}".replace("e-0", "e-") for dtype, value in (("64", FLOAT64_TOLERANCE),
                                                                             ("32", FLOAT32_TOLERANCE))}
    return zoo.Section("Correctness", [f"Each check runs on every case its capability tags allow; float64 against "
                                       f"the reference to {tolerance['64']}, float32 to {tolerance['32']} "
                                       "(relative)."], [zoo.Table("", [], rows)])


SUITE_DEFINITION = zoo.Suite(
    SUITE, "each variant against its float64 reference and its baselines, and the properties any attention with its "
    "capabilities must keep", measures=tuple(zoo.Measure(c.name, c.summary) for c in CHECKS),
    blocking=(FAILED, ERROR), required=True, section=section, order=10, side_by_side=True,
    upgrade=upgrade,
    settings={"cases": 3},  # random cases per check, on small shapes
    presets={"full": {"cases": 8}, "smoke": {"cases": 1}}, legacy={"cases": "cases"})


@zoo.hookimpl
def zoo_register_suites(register):
    register(SUITE_DEFINITION)


@zoo.hookimpl
def zoo_register_checks(register):
    for check in CHECKS:
        register(check)
