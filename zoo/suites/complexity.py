"""Complexity suite: how FLOPs and peak memory grow with sequence length, against the claim.

FLOPs (torch's FlopCounterMode formulas, with formulas for the fused CPU attention ops) and peak live tensor
memory, counted in one dispatch mode (:class:`zoo.measure.Counters`), are deterministic, so the verdicts rest on
them; on CPU a call is counted on fake tensors where it allows it and that is cheaper (the same counts, no
arithmetic: :func:`zoo.measure.counts_on_fake_tensors`). The time exponent comes from the speed suite. Shapes: the
profile's complexity config (one head of 64 by default).
"""

from __future__ import annotations

import math
import time

import pandas as pd
import torch

import zoo
from zoo import plots as plots_
from zoo.board import best_known_rows, fmt_exp
from zoo.contract import BEST_KNOWN_SLACK, COMPARATOR_LABELS, COMPARATORS
from zoo.checks import FAILED, MEASURED, PASSED, SKIPPED, Check, Result
from zoo.measure import call_counts, cheaper_on_fake_tensors, counts_on_fake_tensors
from zoo.plan import plan_lengths, plan_rows
from zoo.scaling import fit_exponent
from zoo.suite import legacy_names
from zoo.workload import SDPA, comparator, modes_for, non_finite_output, self_attention_workloads

SUITE = "complexity"
EXPONENT_TOLERANCE = 0.25
FORMULA_TOLERANCE = 0.01
PHASES = ("fwd", "fwd+bwd")


def _count(fn, device: str) -> tuple[int, int, int | None, int]:
    """FLOPs and peak live tensor bytes of one call (the counters in one pass); on CUDA also the
    caching allocator's own peak above what was allocated before the call; the ops it dispatched."""
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    flops, peak, ops = call_counts(fn)
    allocator_peak = None
    if device == "cuda":
        torch.cuda.synchronize()
        allocator_peak = torch.cuda.max_memory_allocated() - before
    return flops, peak, allocator_peak, ops


def _fake_counts(load, device: str, counted: list[tuple[int, float, int]], n: int) -> tuple[list | None, bool]:
    """Both phases' counts on fake tensors (:func:`zoo.measure.counts_on_fake_tensors`) where that is predicted to
    cost less than real calls (:func:`zoo.measure.cheaper_on_fake_tensors`, from ``counted``: the callable's real
    forward+backward counts so far, as (length, seconds, ops)), after a real warm call (what a callable builds once
    and keeps is real); and whether they were tried. None on CUDA, whose allocator's peak a real call gives, where
    real calls are cheaper, or where a phase cannot be counted so (then count a fresh callable: this one may hold
    fake tensors)."""
    if device != "cpu" or not cheaper_on_fake_tensors(counted, n):
        return None, False
    both = []
    for fn in (load.forward, load.train_step):
        counts = counts_on_fake_tensors(fn)
        if counts is None:
            return None, True
        both.append((*counts[:2], None, None))
    return both, True


def measure(variant, profile):
    """Counts per (who, mode, phase): {n: (flops, bytes)}, for the variant, SDPA and its baselines, at
    the lengths the plan (zoo.plan) allows; plus rows for what the plan left out, the CUDA allocator's
    peaks on a GPU, and an error row where the variant's output is not finite."""
    table: dict[tuple[str, str, str], dict[int, tuple[int, int]]] = {}
    extra: list[Result] = []
    real: dict[tuple[str, str], list[tuple[int, float, int]]] = {}  # (callable, mode) -> (n, seconds, ops) counted
    for mode in modes_for(variant, profile.of(SUITE).modes):
        def loads_at(n, only=None, mode=mode):  # baselines are compared in the non-causal mode only
            return self_attention_workloads(
                variant, batch=1, d_model=profile.of(SUITE).d_model, heads=profile.of(SUITE).heads,
                n=n, causal=mode == "causal", seed=profile.seed, device=profile.device, dtype=profile.dtype,
                baselines=mode == "full", only=only,
            )

        plan = plan_lengths(loads_at, profile.of(SUITE).lengths, variant, {SDPA, comparator(variant)},
                            profile.of(SUITE).max_call_gflop, profile.of(SUITE).max_call_gib)
        extra += plan_rows(plan, variant.name, mode, "measured")
        for n in plan.lengths[variant.name]:
            loads = loads_at(n, only=plan.at(n))
            error = non_finite_output(loads, variant.name, mode, n, profile.dtype)
            if error:
                extra.append(error)
                continue
            for who, load in loads.items():
                # one uncounted call first: what a callable builds once and keeps (a baseline's cached mask, a
                # table) is not charged to whichever phase happens to be counted first, so fwd and fwd+bwd are
                # both a steady call's figures, as the variant's are after its finiteness check (its first call)
                if who != variant.name:
                    load.forward()
                history = real.setdefault((who, mode), [])
                counted, tried = _fake_counts(load, profile.device, history, n)
                if counted is None:
                    if tried:  # a fake call failed, and may have left fake tensors in what the callable keeps
                        load = loads_at(n, only={who})[who]
                        load.forward()
                    counted = [_count(load.forward, profile.device)]
                    started = time.perf_counter()
                    counted.append(_count(load.train_step, profile.device))
                    history.append((n, time.perf_counter() - started, counted[1][3]))
                for phase, (flops, peak, allocator_peak, _) in zip(PHASES, counted):
                    table.setdefault((who, mode, phase), {})[n] = (flops, peak)
                    if allocator_peak is not None:
                        extra.append(Result("cuda-allocator-peak", MEASURED, f"{mode} {phase} n={n}", allocator_peak,
                                            "bytes", n=n, mode=mode, phase=phase,
                                            versus="" if who == variant.name else who))
    return table, extra


def _exponent_verdict(check, claimed, lengths, values, mode, phase) -> Result:
    fitted = fit_exponent(lengths, values)
    setting = f"{mode} {phase}"
    if fitted is None:
        return Result(check, SKIPPED, setting, detail="fewer than two lengths measured", mode=mode, phase=phase)
    span = f"n={min(lengths[-3:])}..{max(lengths)}"
    if fitted > claimed + EXPONENT_TOLERANCE:
        return Result(check, FAILED, setting, fitted, "exponent",
                      f"claimed {claimed:g}, fitted {fitted:.2f} over {span}", mode=mode, phase=phase)
    better = " (better than claimed)" if fitted < claimed - EXPONENT_TOLERANCE else ""
    return Result(check, PASSED, setting, fitted, "exponent", f"claimed {claimed:g}{better} over {span}",
                  mode=mode, phase=phase)


def _crossover(lengths, ours, theirs, claimed: float) -> tuple[float | None, str]:
    """Smallest measured n from which the variant costs less than SDPA; for a variant claiming to grow
    slower than n^2, else a power-law extrapolation beyond the measured lengths."""
    cheaper = [n for n in lengths if ours[n] < theirs[n]]
    if cheaper and all(ours[n] < theirs[n] for n in lengths if n >= cheaper[0]):
        return float(cheaper[0]), "measured"
    if claimed >= 2:
        return None, "no crossover measured, and none expected from a quadratic claim"
    a, b = fit_exponent(lengths, [ours[n] for n in lengths]), fit_exponent(lengths, [theirs[n] for n in lengths])
    if a is None or b is None or a >= b:
        return None, "no crossover: does not grow slower than SDPA"
    top = max(lengths)
    n_star = top * math.exp(math.log(ours[top] / theirs[top]) / (b - a))
    return n_star, "extrapolated from the fitted exponents"


def run_complexity(variant, profile):
    """The complexity check: counts, exponents against the claims, crossover, memory ratios, the FLOP formula."""
    table, extra = measure(variant, profile)
    yield from extra
    for (who, mode, phase), by_n in sorted(table.items()):
        tag = dict(mode=mode, phase=phase, versus="" if who == variant.name else who)
        for n, (flops, peak) in sorted(by_n.items()):
            yield Result("flops", MEASURED, f"{mode} {phase} n={n}", flops, "FLOP", n=n, **tag)
            yield Result("memory", MEASURED, f"{mode} {phase} n={n}", peak, "bytes", n=n, **tag)
        if who != variant.name:
            continue
        lengths = sorted(by_n)
        yield _exponent_verdict("flops-exponent", variant.complexity.time, lengths,
                                [by_n[n][0] for n in lengths], mode, phase)
        yield _exponent_verdict("memory-exponent", variant.complexity.memory, lengths,
                                [by_n[n][1] for n in lengths], mode, phase)
        sdpa = table.get((SDPA, mode, phase), {})
        common = [n for n in lengths if n in sdpa]
        n_star, how = _crossover(common, {n: by_n[n][0] for n in common}, {n: sdpa[n][0] for n in common},
                                 variant.complexity.time)
        yield Result("crossover-flops", MEASURED if n_star else SKIPPED, f"{mode} {phase}",
                     round(n_star) if n_star else None, "n", how, mode=mode, phase=phase)
        for label in sorted(label for (label, m, p) in table if (m, p) == (mode, phase) and label != variant.name):
            theirs = table[label, mode, phase]
            for n in (n for n in lengths if n in theirs and theirs[n][1]):
                yield Result("memory-ratio", MEASURED, f"{mode} {phase} n={n}", by_n[n][1] / theirs[n][1],
                             "ratio", f"peak memory of the variant / {label}'s", n=n, mode=mode, phase=phase,
                             versus=label)
    yield from _formula_rows(variant, profile, table)


def count_forward(variant, profile, q_len: int, k_len: int, **kv_dims) -> int:
    """FLOPs of one forward call at (q_len, k_len) on the complexity shapes (``kdim``/``vdim`` where given)."""
    torch.manual_seed(profile.seed)
    d_model, dtype = profile.of(SUITE).d_model, getattr(torch, profile.dtype)
    module = zoo.build(variant, d_model=d_model, num_heads=profile.of(SUITE).heads, **kv_dims).to(profile.device, dtype)
    query = torch.randn(1, q_len, d_model, device=profile.device, dtype=dtype)
    key, value = (torch.randn(1, k_len, kv_dims.get(dim) or d_model, device=profile.device, dtype=dtype)
                  for dim in ("kdim", "vdim"))
    with torch.no_grad():
        return _count(lambda: module.forward(query, key, value, is_causal=variant.tags.causal_only), profile.device)[0]


def cross_shape(variant, profile) -> tuple[int, int, dict]:
    """The cross-attention shape the formula is also checked at: keys twice the queries' length and, where the
    variant takes them, key and value widths of their own, so no term of the formula can swap with another."""
    q_len = profile.of(SUITE).lengths[0]
    kv = {"kdim": profile.of(SUITE).d_model // 2, "vdim": profile.of(SUITE).d_model * 2} \
        if variant.tags.allows_kv_dims else {}
    return q_len, 2 * q_len, kv


def _formula_rows(variant, profile, table):
    if variant.flops is None:
        yield Result("flops-formula", SKIPPED, detail="variant declares no analytic FLOP formula")
        return
    mode = variant.tags.primary_mode
    shapes = [(n, n, {}, counted) for n, (counted, _) in sorted(table.get((variant.name, mode, "fwd"), {}).items())]
    if variant.tags.allows_different_lengths:  # a formula measured on self-attention alone can mix q_len and k_len up
        q_len, k_len, kv = cross_shape(variant, profile)
        shapes.append((q_len, k_len, kv, count_forward(variant, profile, q_len, k_len, **kv)))
    for q_len, k_len, kv, counted in shapes:
        yield formula_row(variant, profile, q_len, k_len, kv, counted)


def formula_row(variant, profile, q_len, k_len, kv, counted) -> Result:
    """The formula's FLOPs against the counted ones at one shape (passed within 1%), in the variant's primary mode
    (a causal-only variant's formula counts its causal form)."""
    expected = variant.flops(batch=1, q_len=q_len, k_len=k_len, d_model=profile.of(SUITE).d_model,
                             num_heads=profile.of(SUITE).heads, **{**variant.options, **kv})
    deviation = abs(counted - expected) / expected
    ok = deviation <= FORMULA_TOLERANCE
    mode = variant.tags.primary_mode
    setting = f"{mode} fwd n={q_len}" if q_len == k_len and not kv else \
        f"{mode} fwd q_len={q_len} k_len={k_len}" + "".join(f" {k}={v}" for k, v in kv.items())
    return Result("flops-formula", PASSED if ok else FAILED, setting, deviation, "rel. deviation",
                  "" if ok else f"counted {counted:.4g} FLOPs, formula says {expected:.4g}",
                  n=q_len if q_len == k_len and not kv else None, mode=mode, phase="fwd")


# --- on the board ---------------------------------------------------------------------------------------


def claims_verdict(board, variant) -> str:
    """'hold', 'VIOLATED: ...' or 'not measured' for the variant's complexity claims and FLOP formula."""
    rows = board.rows(variant=variant)
    verdicts = rows[rows.check.isin(["flops-exponent", "memory-exponent", "flops-formula"])]
    if (verdicts.status == FAILED).any():
        return "VIOLATED: " + "; ".join(sorted(set(verdicts[verdicts.status == FAILED].detail)))
    return "hold" if (verdicts.status == PASSED).any() else "not measured"


def columns(board, variant) -> dict:
    """Beside the rank: whether the claims hold (a wrong FLOP formula is shown here, not blocking: the outputs
    are not wrong), and the fitted exponents."""
    mode = board.primary_mode(variant)
    return {"complexity claims": claims_verdict(board, variant),
            "FLOP exp.": fmt_exp(board.value(variant, "flops-exponent", mode, "fwd")),
            "memory exp.": fmt_exp(board.value(variant, "memory-exponent", mode, "fwd+bwd"))}


def axes(board, variant) -> list[zoo.Axis]:
    """The counted FLOPs' growth in n: the reason to choose for long sequences (exponents within 0.05 are tied)."""
    exponent = board.value(variant, "flops-exponent", board.primary_mode(variant), "fwd")
    return [zoo.Axis("FLOP growth exponent in n", exponent, "lower", fmt_exp(exponent), use="long sequences", tie=0.05)]


def details(board, variant) -> list:
    """The variant page's table of claimed and measured exponents."""
    card = board.card(variant)
    mine = board.rows(variant=variant)
    exponent = {(r.check, r.mode, r.phase): r.value for r in mine.itertuples() if r.check.endswith("-exponent")}
    claims = [{"measure": f"{what} exponent ({mode} {phase})", "claimed": card.get(f"claimed_{key}"),
               "measured": fmt_exp(exponent.get((f"{check}-exponent", mode, phase))),
               "reading": exponent_reading(exponent.get((f"{check}-exponent", mode, phase)), card.get(f"claimed_{key}"))}
              for what, key, check in (("FLOP", "time", "flops"), ("memory", "memory", "memory"))
              for mode in ("full", "causal") for phase in PHASES
              if (f"{check}-exponent", mode, phase) in exponent]
    return [zoo.Table("Claims and measurements", ["measure", "claimed", "measured", "reading"], claims)] if claims else []


def exponent_reading(measured, claimed) -> str:
    """What a fitted exponent says against the claim, in words (the verdict's tolerance: EXPONENT_TOLERANCE)."""
    if measured is None or claimed is None or pd.isna(measured):
        return ""
    if measured > claimed + EXPONENT_TOLERANCE:
        return f"grows faster than claimed: the claim fails (tolerance {EXPONENT_TOLERANCE:g})"
    if measured < claimed - EXPONENT_TOLERANCE:
        return ("grows slower than claimed over the lengths measured: a part that does not grow with n (weights, "
                "fixed-size buffers, a projection to a fixed length) is most of it there; the claim is the limit")
    return "as claimed"


def section(board) -> zoo.Section:
    """The complexity section: exponents and verdicts, GPU memory, the FLOP and memory plots."""
    results, settings, rows, shapes = board.results, board.settings, [], board.settings_of(SUITE)
    for variant in board.variants:
        card = board.card(variant)
        own = board.rows(variant=variant)
        for mode in ("full", "causal"):
            flops = own[(own.check == "flops-exponent") & (own["mode"] == mode)]
            if flops.empty:
                continue
            mem = own[(own.check == "memory-exponent") & (own["mode"] == mode)]
            verdicts = pd.concat([flops, mem]).status
            cross = board.value(variant, "crossover-flops", mode, "fwd")
            rows.append({
                "variant": variant, "mode": mode,
                "claimed time/memory": f"n^{card.get('claimed_time', '?'):g} / n^{card.get('claimed_memory', '?'):g}",
                "FLOPs fwd": fmt_exp(board.value(variant, "flops-exponent", mode, "fwd")),
                "FLOPs fwd+bwd": fmt_exp(board.value(variant, "flops-exponent", mode, "fwd+bwd")),
                "memory fwd": fmt_exp(board.value(variant, "memory-exponent", mode, "fwd")),
                "memory fwd+bwd": fmt_exp(board.value(variant, "memory-exponent", mode, "fwd+bwd")),
                "time fwd+bwd": fmt_exp(board.value(variant, "time-exponent", mode, "fwd+bwd")),
                "verdict": "violated" if (verdicts == FAILED).any() else ("holds" if (verdicts == PASSED).any() else "n/a"),
                "FLOP crossover with SDPA": "" if cross is None else f"n = {cross:.0f}",
            })
    text = ("Exponents fitted on log-log over the three largest lengths measured (FLOPs by torch's "
            "FlopCounterMode formulas, fused attention kernels included; peak live tensor memory by a dispatch "
            "mode). The verdict uses FLOPs and memory only (deterministic); the time exponent is from the speed "
            "suite. Shapes: batch 1, "
            f"d_model {shapes.d_model}, {shapes.heads} head(s), "
            f"{settings.get('dtype', 'float32')}, on {settings.get('device', 'cpu')}.")
    mine = board.rows(SUITE)
    panels = plots_.kind_panels(board, {kind: (c, COMPARATOR_LABELS[c]) for kind, c in COMPARATORS.items()})
    plots = [plots_.log_log(board.in_primary_mode(mine[mine.phase == phase]), check, f"{check}.png", label,
                            panels=panels, greyed=plots_.unranked(board), palette=tuple(board.variants))
             for check, phase, label in (("flops", "fwd", "FLOPs (forward, complexity shapes)"),
                                         ("memory", "fwd+bwd", "peak live tensor bytes (forward+backward)"))]
    lengths = sorted(int(n) for n in results[(results.suite == SUITE) & (results.check == "memory-ratio")].n.dropna().unique())
    behind, _ = best_known_rows(board, "memory-ratio", PHASES, lengths)
    memory = zoo.Table("Memory against the best known implementation of the same math", [], behind, note=[
        "Peak live tensor bytes of one call of the variant / those of the fastest implementation of its own math "
        f"its plugin knows (see the speed section), on this suite's shapes, non-causal; over {BEST_KNOWN_SLACK:g} "
        "is marked *behind*."])
    return zoo.Section("Complexity", [text], [zoo.Table("", [], rows), memory, *_allocator_tables(board)],
                       dict(plot for plot in plots if plot))


def _allocator_tables(board) -> list:
    """On a GPU: the CUDA caching allocator's peak at the largest length, beside the counted peak."""
    peaks = board.results[(board.results.check == "cuda-allocator-peak") & (board.results.versus == "")].dropna(subset=["n"])
    if peaks.empty:
        return []
    rows, variants = [], board.variants
    for (variant, mode, phase), group in peaks.groupby(["variant", "mode", "phase"], sort=False):
        n = int(group.n.max())
        rows.append({"variant": variant, "mode": mode, "pass": phase, "n": n,
                     "CUDA allocator peak (MiB)": (board.value(variant, "cuda-allocator-peak", mode, phase, n) or 0) / 2 ** 20,
                     "counted peak (MiB)": (board.value(variant, "memory", mode, phase, n) or 0) / 2 ** 20})
    rows.sort(key=lambda r: (variants.index(r["variant"]) if r["variant"] in variants else len(variants), r["mode"]))
    return [zoo.Table("GPU memory", [], rows, note=[
        "The CUDA caching allocator's peak during one call above what was allocated before it, at the largest "
        "length measured; the counted peak is the dispatch mode's figure the exponents use."])]


LEGACY_NAMES = {"memory-ratio": "memory-vs-{}", "flops": "{}-flops", "memory": "{}-memory", "plan": "{}-plan",
                "cuda-allocator-peak": "{}-cuda-allocator-peak"}
"""How rows named the callable before ``versus`` was a field (``torch-sdpa-flops``, ``memory-vs-naive``...)."""


SUITE_DEFINITION = zoo.Suite(
    SUITE, "how FLOPs and peak memory grow with the sequence length, against the variant's claim", measures=(
        zoo.Measure("flops", "FLOPs of one call (torch's FlopCounterMode formulas, fused attention kernels included; with versus: "
                    "that callable's)", "FLOP"),
        zoo.Measure("memory", "peak live tensor bytes of one call (with versus: that callable's)", "bytes"),
        zoo.Measure("flops-exponent", "FLOPs' fitted exponent in n, judged against the claimed time exponent", "exponent"),
        zoo.Measure("memory-exponent", "peak memory's fitted exponent in n, judged against the claim", "exponent"),
        zoo.Measure("crossover-flops", "the length from which the variant costs fewer FLOPs than torch SDPA", "n"),
        zoo.Measure("memory-ratio", "peak memory of the variant / that of the callable in versus (a baseline, torch "
                    "SDPA or nn.MultiheadAttention)", "ratio"),
        zoo.Measure("flops-formula", "the plugin's analytic FLOP formula against the counted FLOPs", "rel. deviation"),
        zoo.Measure("cuda-allocator-peak", "the CUDA caching allocator's peak during one call (GPU runs)", "bytes"),
        zoo.Measure("plan", "a length the measurement plan left out for the variant (or the callable in versus), "
                    "and why")),
    section=section, columns=columns, details=details, axes=axes, order=20, side_by_side=True,
    upgrade=lambda row: legacy_names(row, LEGACY_NAMES, [m.name for m in SUITE_DEFINITION.measures]),
    # one head of 64, where the additive baseline still fits in memory; the measurement plan (zoo.plan) leaves
    # out a length whose forward+backward call is predicted, from counted FLOPs and memory, to exceed the caps
    settings={"d_model": 64, "heads": 1, "lengths": (256, 512, 1024, 2048, 4096), "modes": ("full", "causal"),
              "max_call_gflop": 100.0, "max_call_gib": 4.0},
    presets={"full": {"lengths": (256, 512, 1024, 2048, 4096, 8192, 16384), "max_call_gflop": 2500.0,
                      "max_call_gib": 8.0},
             "smoke": {"lengths": (64, 128, 256)}},
    legacy={"complexity_d_model": "d_model", "complexity_heads": "heads", "complexity_lengths": "lengths",
            "complexity_modes": "modes", "max_call_gflop": "max_call_gflop", "max_call_gib": "max_call_gib"})


@zoo.hookimpl
def zoo_register_suites(register):
    register(SUITE_DEFINITION)


@zoo.hookimpl
def zoo_register_checks(register):
    register(Check("complexity", SUITE, "FLOP and peak-memory growth with n vs the claimed exponents; crossover with SDPA",
                   run_complexity))
