"""Inference suite: what generating a token costs, at several context lengths and batch sizes.

For every variant that decodes (:class:`zoo.Decoder`) a prompt of each context length is prefilled once, then
generated tokens are stepped one at a time, each step timed, taking turns with the decode a user would write
for the same shapes (torch SDPA over a preallocated KV cache; for a layer with nn.MultiheadAttention's
projections) so the machine's drift falls on both alike. Beside the time per token stand the state the sequence
keeps (counted, tensor by tensor) and how close the step comes to this machine's memory read bandwidth,
measured in the same process: decoding reads the whole state and the weights once per token, so that is its
physical limit. How much a step grows with the context is measured the same way: in every cell beyond the
shortest context, the variant's decode after the shortest prompt takes turns with its decode after the cell's.
Which cells are timed is fixed before timing (predicted prefill FLOPs and state bytes against
the profile's caps). The check is repeated in the run's fresh processes and its figures combined
(:mod:`zoo.timing`), as the speed suite's are; a later process reads back the states the first prefilled, where the
run kept them (:data:`SHARED_STATES_BYTES`), and times the same steps from them, so a prefill's time is the first
process's.
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.benchmark import Timer
from torch.utils.benchmark.utils.timer import timer as synchronized_clock

import zoo
from zoo import decoding
from zoo import plots as plots_
from zoo.board import Footnotes, fmt_g, fmt_x
from zoo.checks import ERROR, MEASURED, SKIPPED, Check, Result, describe_exception
from zoo.environment import counted_once, made_once_in_run, run_shared
from zoo.measure import bytes_read, count_flops
from zoo.plan import extrapolate, loglog_slope, out_of_memory
from zoo.timing import figure, strays

SUITE = "inference"
STANDARD = decoding.STANDARD_DECODES
"""The decode each kind of variant is compared with: what a user would write for the same shapes."""
SDPA_CACHE, MHA_CACHE = STANDARD["core"], STANDARD["layer"]
STANDARD_LABELS = {SDPA_CACHE: "torch SDPA over a preallocated KV cache",
                   MHA_CACHE: "nn.MultiheadAttention's projections and torch SDPA over a preallocated KV cache"}
DECODE, PREFILL = "decode", "prefill"  # the rows' phase: a generated token's step, or the prompt's prefill
SHARED_STATES_BYTES = 2 * 2 ** 30
"""A run keeps the states its first inference process prefilled, up to this many bytes in all, for its later
processes to read back instead of prefilling again (the same state: the same module and prompt from the same
seed); a prefill there took half of a quick run's inference time. Kept in memory (:func:`zoo.runner.shared_parent`)."""


def mode_of(variant) -> str:
    """A self-attention decoder continues a causal sequence; a context decoder attends to a whole fixed context."""
    return "full" if variant.decoder.context else "causal"


@functools.lru_cache(maxsize=None)
def read_bandwidth(threads: int, device: str = "cpu", mib: int = 256) -> tuple[float, int]:
    """This machine's memory read rate in bytes/s and the buffer's size: a sum over a float32 buffer of ``mib`` MiB
    and at least four times the last-level cache, so every byte comes from memory (the ceiling a decode step, which
    reads its whole state and the weights once, can approach). Measured once in a run
    (:func:`zoo.environment.run_shared`), not in each of its inference processes."""
    return run_shared(f"read-bandwidth|{threads}|{device}|{mib}", lambda: _measure_read_bandwidth(threads, device, mib),
                      tuple)


def _measure_read_bandwidth(threads: int, device: str, mib: int) -> tuple[float, int]:
    size = max(mib * 2 ** 20, 4 * last_level_cache_bytes(device))
    buffer = torch.ones(size // 4, device=device)
    seconds = Timer("buffer.sum()", globals={"buffer": buffer}, num_threads=threads).blocked_autorange(
        min_run_time=0.3).median
    return buffer.numel() * 4 / seconds, size


class StandardDecode:
    """The decode a user would write: keys and values written into a cache preallocated for the whole generation,
    torch SDPA of the new query over the filled part; for a layer, nn.MultiheadAttention's in- and
    out-projections around it (its own weights, made from the same seed). A context decode (cross-attention)
    projects its context once and never grows."""

    def __init__(self, layer: bool, batch: int, d_model: int, heads: int, capacity: int, device, dtype):
        self.heads, self.d_model = heads, d_model
        self.mha = (torch.nn.MultiheadAttention(d_model, heads, batch_first=True).to(device, dtype) if layer
                    else None)
        shape = (batch, heads, capacity, d_model // heads)
        self.keys, self.values = (torch.empty(shape, device=device, dtype=dtype) for _ in range(2))
        self.length = 0

    def _project(self, x, index):
        if self.mha is None:
            return x
        d = self.d_model
        return F.linear(x, self.mha.in_proj_weight[index * d:(index + 1) * d], self.mha.in_proj_bias[index * d:(index + 1) * d])

    def _heads(self, x):
        return x.view(x.shape[0], x.shape[1], self.heads, self.d_model // self.heads).transpose(1, 2)

    def _out(self, out):
        out = out.transpose(1, 2).reshape(out.shape[0], -1, self.d_model)
        return out if self.mha is None else self.mha.out_proj(out)

    def fill(self, key, value, shared_as: str | None = None):
        """The prompt's keys and values into the cache, nothing else: what the steps it is timed by need (its
        attention over the prompt would cost what a softmax prefill costs, for every variant it is compared with).
        ``shared_as``: a key the projected prompt is made under once in a run (:func:`made_once_in_run`), for every
        variant's cells of the same shapes alike (the same weights and prompt, from the same seed)."""
        t = key.shape[1]

        def project():
            return self._heads(self._project(key, 1)), self._heads(self._project(value, 2))

        keys, values = made_once_in_run(shared_as, project, SHARED_STATES_BYTES)[0] if shared_as else project()
        self.keys[:, :, :t] = keys
        self.values[:, :, :t] = values
        self.length = t

    def step(self, query, key, value, context: bool):
        """One token: its key and value written at the next slot (not for a context), its query over the cache."""
        if not context:
            self.keys[:, :, self.length] = self._heads(self._project(key, 1))[:, :, 0]
            self.values[:, :, self.length] = self._heads(self._project(value, 2))[:, :, 0]
            self.length += 1
        q = self._heads(self._project(query, 0))
        return self._out(F.scaled_dot_product_attention(q, self.keys[:, :, :self.length],
                                                        self.values[:, :, :self.length]))

    def state_bytes(self) -> int:
        """The filled part of the cache."""
        return 2 * self.keys[:, :, :self.length].numel() * self.keys.element_size()


PROBE_LENGTHS = (64, 128, 256, 512, 1024, 2048)
"""Where a prefill without an analytic FLOP count is counted, in order, until its growth settles."""


def prefill_predictor(variant, d_model: int, heads: int, longest: int):
    """``(batch, context) -> GFLOP``: a prefill's predicted FLOPs. The plugin's analytic count of the forward over
    the context (queries against every key: an upper bound for a causal prefill), else the causal forward's counted
    FLOPs at doubling lengths up to ``longest`` (the profile's longest context), extrapolated from the last two at
    least as steeply as the claimed time exponent. Counting stops once two lengths in a row grow no faster than the
    claim (within 0.25): a window or block longer than the first lengths makes them grow quadratically, and
    extrapolating that would leave a linear variant's long prefill out of the plan. A length the module cannot
    take stops the counting too (the cells it can take are still planned). No clock decides."""
    options = dict(variant.options)
    if variant.flops is not None:
        return lambda batch, context: float(variant.flops(batch=batch, q_len=context, k_len=context, d_model=d_model,
                                                          num_heads=heads, **options)) / 1e9
    torch.manual_seed(0)
    module = zoo.build(variant, d_model=d_model, num_heads=heads)
    claim = variant.complexity.time
    points = []
    for n in (n for n in PROBE_LENGTHS if n <= max(longest, PROBE_LENGTHS[0])):
        x = torch.randn(1, n, d_model)
        try:
            with torch.no_grad():
                points.append((n, float(count_flops(lambda: module(x, x, x, is_causal=not variant.decoder.context)))))
        except Exception:  # noqa: BLE001 - the cell that needs this length fails on its own, with its reason
            break
        if len(points) > 1 and loglog_slope(*points[-2:]) <= claim + 0.25:
            break
    if not points:
        return lambda batch, context: 0.0  # nothing counted: every cell is tried, and says why it fails
    if len(points) == 1:  # one length counted: grown at the claimed exponent
        (n, flops), = points
        return lambda batch, context: batch * flops * (context / n) ** claim / 1e9
    return lambda batch, context: batch * extrapolate(context, points[-2:], claim) / 1e9


def itemsize(profile) -> int:
    """Bytes per element of the run's dtype: what the plugin's state_bytes formula is asked for."""
    return getattr(torch, profile.dtype).itemsize


def planned_out(variant, settings, profile, batch: int, context: int, prefill_gflop) -> str | None:
    """Why a cell is not timed (None: it is): its prefill (``prefill_gflop(batch, context)``, from
    :func:`prefill_predictor`) or its state over the profile's caps."""
    cap = settings.max_prefill_tokens
    if cap is not None and batch * context > cap:
        return f"a prefill of batch x context = {batch * context} tokens, over the profile's cap of {cap}"
    gflop = prefill_gflop(batch, context)
    if gflop > settings.max_prefill_gflop:
        return f"predicted prefill of {gflop:.3g} GFLOP, over the profile's cap of {settings.max_prefill_gflop:g}"
    formula = variant.decoder.state_bytes
    if formula is not None:
        state = float(formula(batch, context, settings.d_model, settings.heads, itemsize=itemsize(profile),
                              **dict(variant.options)))
        if state > settings.max_state_gib * 2 ** 30:
            return f"predicted state of {state / 2 ** 30:.3g} GiB, over the profile's cap of {settings.max_state_gib:g} GiB"
    return None


@functools.lru_cache(maxsize=1)
def _flush_buffer(mib: int, device, beyond_cache: bool = True) -> torch.Tensor:
    """A buffer larger than the last-level cache (``mib``, at least twice the cache this machine reports unless
    not ``beyond_cache``): reading it before a step evicts what the last step of either decode left there, so a
    small state is timed as it is read in a model, from memory, and not warm beside a small cache and cold beside a
    large one."""
    floor = 2 * last_level_cache_bytes(device) if beyond_cache else 0
    return torch.ones(max(mib * 2 ** 20, floor) // 4, device=device)


def last_level_cache_bytes(device) -> int:
    """The size of the largest cache of the device (the CPU's from sysfs, a GPU's L2), 0 where none is reported."""
    if str(device).startswith("cuda"):
        return int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0))
    sizes = []
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = path.read_text().strip()
        try:
            sizes.append(int(text[:-1]) * {"K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30}[text[-1]] if text[-1] in "KMG"
                         else int(text))
        except (ValueError, OSError):
            continue
    return max(sizes, default=0)


_PROMPTS: dict[tuple, torch.Tensor] = {}


def _prompt(settings, profile, batch: int, context: int) -> torch.Tensor:
    """The prompt of a cell: the leading part of one random sequence batch for the largest cell, the same for every
    variant, drawn once in a run and read back by its other processes (drawing it took 0.24 s, more than many a
    cell's steps, in each variant's first process)."""
    key = (max(settings.batches), max(settings.contexts), settings.d_model, profile.device, profile.dtype, profile.seed)
    if key not in _PROMPTS:
        _PROMPTS.clear()

        def draw():
            return torch.randn(*key[:3], generator=torch.Generator().manual_seed(profile.seed))

        drawn = made_once_in_run(f"prompt|{key}", draw, SHARED_STATES_BYTES)[0]
        _PROMPTS[key] = drawn.to(profile.device, getattr(torch, profile.dtype))
    return _PROMPTS[key][:batch, :context]


def _cell(variant, settings, profile, batch: int, context: int, shortest: int | None = None):
    """Prefill both decodes, then their steps in turns; the raw figures of one (batch, context) cell. Query, key and
    value are the same sequence, as in a model's self-attention (a context decoder: its context). ``shortest``: the
    shortest timed context, below this cell's: the variant's decode after that shorter prompt takes turns too, so
    how much a step grows with the context is a ratio measured in the same turns, not two cells timed minutes
    apart on a machine whose speed drifts by more than the 10% such a claim is judged by."""
    dtype, device, decoder = getattr(torch, profile.dtype), profile.device, variant.decoder
    generator = torch.Generator().manual_seed(profile.seed + 1)
    torch.manual_seed(profile.seed)
    module = zoo.build(variant, d_model=settings.d_model, num_heads=settings.heads).to(device, dtype).eval()
    torch.manual_seed(profile.seed)
    steps = settings.warmup_steps + 1 + settings.steps  # one more, untimed, counts the bytes a step reads
    standard = StandardDecode(variant.tags.has_parameters, batch, settings.d_model, settings.heads,
                              context + (0 if decoder.context else steps), device, dtype)
    prompt = _prompt(settings, profile, batch, context).clone()  # the decoder's own: it may keep it
    tokens = [torch.randn(batch, 1, settings.d_model, generator=generator).to(device, dtype) for _ in range(steps)]

    def prefilled(label, other, prompt):  # a decoder baseline with the variant's own prefill starts from its state
        same = variant.name if other.prefill is decoder.prefill else label
        return _prefilled(f"prefill|{variant.name}|{same}|{batch}|{prompt.shape[1]}|{profile!r}", other, module, prompt)

    with torch.no_grad():
        try:
            state, prefill_seconds = prefilled(variant.name, decoder, prompt)
        except Exception as exc:
            if out_of_memory(exc):
                raise PromptTooLarge(describe_exception(exc)) from exc
            raise
        standard.fill(prompt, prompt, shared_as=f"standard|{STANDARD[variant.kind]}|{batch}|{context}|{profile!r}")

        def theirs(token):
            standard.step(token, token, token, decoder.context)

        calls = {variant.name: _stepper(decoder, module, state), STANDARD[variant.kind]: theirs}
        dropped = {}
        for label, other in decoder.baselines.items():  # the plugin's other decodes, each from its own prefill
            try:
                calls[label] = _stepper(other, module, prefilled(label, other, prompt.clone())[0])
            except Exception as exc:  # a baseline that fails costs its own figures, not the variant's cell
                dropped[label] = exc
        if shortest is not None:
            shorter = _prompt(settings, profile, batch, shortest).clone()
            try:
                calls[SHORTEST] = _stepper(decoder, module, prefilled(variant.name, decoder, shorter)[0])
            except Exception as exc:  # costs the growth figure only
                dropped[SHORTEST] = exc
        state_bytes = {variant.name: decoding.counted_bytes(state), STANDARD[variant.kind]: standard.state_bytes()}
        allocated = decoding.allocated_bytes(state)
        for call in calls.values():
            for token in tokens[:settings.warmup_steps]:
                call(token)
        steps_counted = {who: functools.partial(call, tokens[settings.warmup_steps]) for who, call in calls.items()
                         if who != SHORTEST}  # counted once in a run: a further process steps plainly
        counted = {who: counted_once(f"step-bytes|{variant.name}|{who}|{batch}|{context}|{profile!r}",
                                     functools.partial(bytes_read, step), step) for who, step in steps_counted.items()}
        samples = {who: [] for who in calls}
        flush = _flush_buffer(settings.flush_mib, device, settings.flush_beyond_cache)
        flushed = {who for who in calls if settings.flush_large_steps
                   or counted.get(who, 0) < 2 * flush.numel() * flush.element_size()}
        for index, token in enumerate(tokens[settings.warmup_steps + 1:]):
            for who in (list(calls) if index % 2 == 0 else list(calls)[::-1]):  # ABBA: what one leaves falls on both
                if who in flushed:  # each step starts from memory, as in a model whose other layers ran in between;
                    flush.sum()  # a step that reads twice the buffer or more has evicted its own start by its end
                started = synchronized_clock()
                calls[who](token)
                samples[who].append(synchronized_clock() - started)
    growth = samples.pop(SHORTEST, None)
    if growth is not None:
        growth = [a / b for a, b in zip(samples[variant.name], growth)]
    return dict(samples=samples, prefill=prefill_seconds, state=state_bytes, allocated=allocated, read=counted,
                dropped=dropped, growth=growth)


SHORTEST = "the variant at the shortest context"
"""The label of the variant's decode after the shortest timed prompt, in turns with its decode in a longer cell."""


class PromptTooLarge(Exception):
    """The variant's prefill of a cell's prompt ran out of memory: the cell does not fit this machine."""


def _prefill(decoder, module, prompt) -> dict:
    """The state a decoder's prefill of the prompt leaves (a context decoder: the prompt is its context)."""
    _, state = decoder.prefill(module, prompt[:, :0] if decoder.context else prompt, prompt, prompt, None)
    return state


def _prefilled(key: str, decoder, module, prompt) -> tuple[dict, float | None]:
    """The state the decoder's prefill of ``prompt`` leaves and the seconds that prefill took; where a process of
    this run already prefilled the same (``key``) and left its state, that state read back, and None seconds."""
    seconds = []

    def prefill():
        started = synchronized_clock()
        state = _prefill(decoder, module, prompt)
        seconds.append(synchronized_clock() - started)
        return state

    state, made = made_once_in_run(key, prefill, SHARED_STATES_BYTES)
    return state, seconds[0] if made else None


def _stepper(decoder, module, state):
    """One generated token per call, each advancing the state the last call left."""
    holder = [state]

    def step(token):
        _, holder[0] = (decoder.step(module, holder[0], token, None, None, None) if decoder.context else
                        decoder.step(module, holder[0], token, token, token, None))

    return step


def run_inference(variant, profile):
    """The inference check: every planned (batch, context) cell, its state, prefill and time per generated token."""
    settings = profile.of(SUITE)
    torch.set_num_threads(profile.threads)
    bandwidth, size = read_bandwidth(profile.threads, profile.device, settings.bandwidth_mib)
    yield Result("read-bandwidth", MEASURED, f"sum over a {size / 2 ** 20:g} MiB float32 buffer, {profile.threads} "
                 "threads", bandwidth / 1e9, "GB/s")
    reason = decoding.why_not(variant)
    if reason:
        yield Result("decode-time", SKIPPED, detail=reason)
        return
    mode = mode_of(variant)
    prefill_gflop = prefill_predictor(variant, settings.d_model, settings.heads, max(settings.contexts))
    for batch in settings.batches:
        counted = []
        plan = {context: planned_out(variant, settings, profile, batch, context, prefill_gflop)
                for context in settings.contexts}
        shortest = min((context for context, why in plan.items() if not why), default=None)
        for context in settings.contexts:
            tag = dict(n=context, mode=mode, phase=DECODE, batch=batch)
            setting = f"batch={batch} context={context}"
            why = plan[context]
            if why:
                yield Result("decode-time", SKIPPED, setting, detail=f"not timed: {why}", **tag)
                continue
            try:
                cell = _cell(variant, settings, profile, batch, context, shortest if context > shortest else None)
            except PromptTooLarge as exc:  # as the plan's caps leave a cell out, but found by trying: not timed
                yield Result("decode-time", SKIPPED, setting, detail=f"not timed: its prefill ran out of memory "
                             f"here ({exc})", **tag)
                continue
            except Exception as exc:  # one cell failing costs that cell
                yield Result("decode-time", ERROR, setting, detail=describe_exception(exc), **tag)
                continue
            failed = cell["dropped"].pop(SHORTEST, None)
            if failed is not None:  # out of memory beside this cell's state: not measured; else a bug
                yield Result("decode-growth", SKIPPED if out_of_memory(failed) else ERROR,
                             _growth_setting(batch, shortest, context), detail=f"the variant's prefill of {shortest} "
                             f"tokens beside this cell's failed: {describe_exception(failed)}", **tag)
            for label, exc in cell["dropped"].items():
                yield Result("decode-time", SKIPPED if out_of_memory(exc) else ERROR, setting, detail=f"decoder "
                             f"baseline {label!r} not timed: its prefill failed ({describe_exception(exc)})",
                             versus=label, **tag)
            states = list(_state_rows(variant, setting, tag, cell))
            counted += states
            yield from states
            if cell["prefill"] is not None:  # else the state an earlier process of the run prefilled, read back
                yield Result("prefill-time", MEASURED, setting, cell["prefill"], "s", f"one prefill of {context} "
                             "tokens (its first call)", samples=[cell["prefill"]], **{**tag, "phase": PREFILL})
            for who, read in cell["read"].items():
                yield Result("step-bytes", MEASURED, setting, read, "bytes", "counted: every tensor one step's ops "
                             "read (state, weights, the token), each once", versus="" if who == variant.name else who,
                             **tag)
            yield from _timed_rows(variant, setting, tag, {who: {0: s} for who, s in cell["samples"].items()},
                                   cell["read"], [bandwidth])
            if cell["growth"] is not None:
                yield _growth_row(tag, shortest, [cell["growth"]])
        yield from _state_growth_rows(batch, mode, counted)
    yield from _formula_rows(variant, settings, profile, mode)


def _state_rows(variant, setting, tag, cell):
    """The state the prompt left, counted, beside the standard cache's."""
    mine, theirs = cell["state"][variant.name], cell["state"][STANDARD[variant.kind]]
    yield Result("state-bytes", MEASURED, setting, mine, "bytes", "counted after the prefill: every tensor of the "
                 "state at its live size", **tag)
    yield Result("state-allocated", MEASURED, setting, cell["allocated"], "bytes", "the storage behind the state's "
                 "tensors, room to grow included", **tag)
    yield Result("state-bytes", MEASURED, setting, theirs, "bytes", "the filled part of its KV cache",
                 versus=STANDARD[variant.kind], **tag)
    yield Result("state-ratio", MEASURED, setting, mine / theirs if theirs else None, "ratio",
                 "the variant's state / the standard KV cache's", versus=STANDARD[variant.kind], **tag)


DERIVED = {"decode-time", "decode-ratio", "decode-between", "read-fraction", "decode-tokens-per-s", "decode-growth",
           "state-growth", "prefill-time"}
"""Rows derived from a cell's timed steps: :func:`combine` derives them again from every process's."""


def _timed_rows(variant, setting, tag, per_process: dict[str, dict[int, list[float]]], read, bandwidths):
    """A cell's figures from the per-step times (callable -> process -> its steps there): times, ratios per pair of
    turns, the spread between processes, and the rate the bytes a step reads (``read``, counted) are read at
    against the read bandwidth."""
    bandwidth = statistics.median(bandwidths)
    for who, times in per_process.items():  # the variant's decode, the standard one, the plugin's other decodes
        versus = "" if who == variant.name else who
        timed = figure([times[p] for p in sorted(times)])
        yield Result("decode-time", MEASURED, setting, timed.value, "s", f"per generated token: median of "
                     f"{len(timed.samples)} rounds of steps in {timed.processes} process(es); IQR {timed.iqr:.3g} s",
                     samples=timed.samples, low=timed.low, high=timed.high, versus=versus, **tag)
        if timed.between is not None:
            yield Result("decode-between", MEASURED, setting, timed.between, "(max-min)/median",
                         f"spread of {timed.processes} processes' medians", versus=versus, **tag)
        yield Result("read-fraction", MEASURED, setting, read[who] / timed.value / bandwidth, "fraction",
                     f"step bytes / time per token / read bandwidth ({bandwidth / 1e9:.3g} GB/s)", versus=versus, **tag)
        yield Result("decode-tokens-per-s", MEASURED, setting, tag["batch"] * len(timed.samples) / sum(timed.samples),
                     "tokens/s", "generated tokens (every sequence of the batch) over the timed steps' total time",
                     versus=versus, **tag)
    mine = per_process[variant.name]
    for versus, theirs in per_process.items():
        both = sorted(set(mine) & set(theirs))
        if versus == variant.name or not both:
            continue
        ratio = figure([[a / b for a, b in zip(mine[p], theirs[p])] for p in both])
        yield Result("decode-ratio", MEASURED, setting, ratio.value, "ratio", f"time per token / {versus}'s, median "
                     f"of per-turn ratios; IQR {ratio.iqr:.3g}", samples=ratio.samples, low=ratio.low,
                     high=ratio.high, versus=versus, **tag)


def _growth_setting(batch: int, shortest: int, context: int) -> str:
    return f"batch={batch} context {shortest} to {context}"


def _growth_row(tag: dict, shortest: int, per_process: list[list[float]]) -> Result:
    """How much the time per token grows from the shortest timed context to this cell's: the median of per-turn
    ratios of the variant's two decodes, stepped in turns (one list of ratios per process)."""
    growth = figure(per_process)
    return Result("decode-growth", MEASURED, _growth_setting(tag["batch"], shortest, tag["n"]), growth.value, "ratio",
                  f"time per token at context {tag['n']} / at {shortest}, median of per-turn ratios of the two decodes "
                  f"taking turns in {growth.processes} process(es); IQR {growth.iqr:.3g}", samples=growth.samples,
                  low=growth.low, high=growth.high, params={"shortest": shortest}, **tag)


def _state_growth_rows(batch, mode, rows):
    """How much the counted state grows from the shortest to the longest timed context, at one batch size
    (``rows``: the cells' state rows)."""
    values = {row.n: row.value for row in rows if row.check == "state-bytes" and not row.versus and row.value}
    if len(values) > 1:
        shortest, longest = min(values), max(values)
        yield Result("state-growth", MEASURED, f"batch={batch} context {shortest} to {longest}",
                     values[longest] / values[shortest], "ratio", f"counted state at context {longest} / at {shortest}",
                     n=longest, mode=mode, phase=DECODE, batch=batch)


def _formula_rows(variant, settings, profile, mode):
    """The state at the long contexts the board states, from the plugin's state_bytes formula (which the
    correctness suite checks against the counted bytes token by token), where no cell counted it."""
    formula = variant.decoder.state_bytes
    if formula is None:
        return
    for context in settings.state_contexts:
        if context in settings.contexts:
            continue
        for batch in settings.batches:
            value = float(formula(batch, context, settings.d_model, settings.heads, itemsize=itemsize(profile),
                                  **dict(variant.options)))
            yield Result("state-bytes", MEASURED, f"batch={batch} context={context}", value, "bytes",
                         "from the plugin's state_bytes formula (checked against counted bytes by the correctness "
                         "suite)", n=context, mode=mode, phase=DECODE, batch=batch, params={"source": "formula"})


def combine(variant, profile, rows_by_process: list[list[Result]]):
    """The inference check's rows from several processes' (``Check.combine``): each cell's time per token and ratio
    derived again from every process's steps, its prefill time from every process's prefill, the read bandwidth
    the median of theirs; every other row (states, counted bytes, plans) as the first process gave it, and an error
    of a later process kept unless the first met it."""
    steps: dict[tuple, dict[str, dict[int, list[float]]]] = {}
    prefills: dict[tuple, list[list[float]]] = {}
    growths: dict[tuple, dict[int, list[float]]] = {}
    for process, rows in enumerate(rows_by_process):
        for row in rows:
            if row.check == "decode-time" and row.status == MEASURED and row.samples:
                steps.setdefault((row.batch, row.n), {}).setdefault(row.versus or variant.name, {})[process] = row.samples
            elif row.check == "prefill-time" and row.status == MEASURED and row.value is not None:
                prefills.setdefault((row.batch, row.n), []).append([row.value])
            elif row.check == "decode-growth" and row.status == MEASURED and row.samples:
                growths.setdefault((row.batch, row.n, row.params["shortest"]), {})[process] = row.samples
    bandwidths = [row.value * 1e9 for rows in rows_by_process for row in rows if row.check == "read-bandwidth"
                  and row.value]
    first = rows_by_process[0]
    kept = []
    for row in first:
        if row.check == "read-bandwidth" and bandwidths:
            row = dataclasses.replace(row, value=statistics.median(bandwidths) / 1e9, samples=[b / 1e9 for b in bandwidths],
                                      detail=f"median of the {len(bandwidths)} processes' figures, "
                                             f"{len(set(bandwidths))} measurement(s) (a run measures it once; "
                                             "samples: each process's)")
        elif row.check == "prefill-time" and row.status == MEASURED:
            pooled = figure(prefills[(row.batch, row.n)])
            row = dataclasses.replace(row, value=pooled.value, samples=pooled.samples, low=pooled.low, high=pooled.high,
                                      detail=f"one prefill of {row.n} tokens (its first call) in each of "
                                             f"{pooled.processes} process(es), their median (a later process reads "
                                             "back the state the first left, where the run kept it)")
            kept.append(row)
            continue
        if row.check not in DERIVED or row.status != MEASURED:
            kept.append(row)
    seen = {(row.check, row.setting, row.detail) for row in kept if row.status == ERROR}
    kept += [row for rows in rows_by_process[1:] for row in rows
             if row.status == ERROR and (row.check, row.setting, row.detail) not in seen]
    read = {(row.batch, row.n, row.versus or variant.name): row.value for row in first
            if row.check == "step-bytes" and row.status == MEASURED}
    timed: dict[int, list[Result]] = {}
    for (batch, context), per_process in steps.items():
        if 0 not in per_process.get(variant.name, {}):  # the cells the first process timed
            continue
        setting, tag = f"batch={batch} context={context}", dict(n=context, mode=mode_of(variant), phase=DECODE,
                                                                 batch=batch)
        per_process = {who: runs for who, runs in per_process.items() if (batch, context, who) in read}  # the first's
        timed.setdefault(batch, []).extend(_timed_rows(
            variant, setting, tag, per_process, {who: read[(batch, context, who)] for who in per_process},
            bandwidths or [float("nan")]))
    for batch, rows in timed.items():
        counted = [row for row in kept if row.check == "state-bytes" and row.batch == batch and not row.params]
        kept += rows + list(_state_growth_rows(batch, mode_of(variant), counted))
    for (batch, context, shortest), per_process in sorted(growths.items()):
        if 0 in per_process:  # the cells the first process timed
            kept.append(_growth_row(dict(n=context, mode=mode_of(variant), phase=DECODE, batch=batch), shortest,
                                    [per_process[p] for p in sorted(per_process)]))
    return kept


# --- on the board ---------------------------------------------------------------------------------------


def _fmt_bytes(value) -> str:
    if value is None or value != value:
        return "-"
    for unit, size in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if value >= size:
            return f"{value / size:.3g} {unit}"
    return f"{value:.0f} B"


def _fmt_token(seconds) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3g} ms" if seconds >= 1e-4 else f"{seconds * 1e6:.3g} µs"


def _varies(board, variant, check, n, batch, versus="") -> bool:
    """The figure's interval (every process's median, at least the steps' spread; for the variant's own time per
    token also the machine's drift over the run, :meth:`Board.drift`) reaches farther from it than half the run's
    threshold (:func:`zoo.timing.strays`)."""
    mode = mode_of_card(board, variant)
    value, low, high = (board.value(variant, check, mode, DECODE, n, versus=versus, field=f, batch=batch)
                        for f in ("value", "low", "high"))
    threshold = getattr(board.settings_of(SUITE), "interval_threshold", None)
    if None in (value, low, high, threshold) or value <= 0:
        return False
    drift = board.drift(SUITE, check, STANDARD.values(), mode, DECODE, n, batch) if check == "decode-time" else None
    if drift is not None and not versus:
        low, high = min(low, value * drift[0]), max(high, value * drift[1])
    return strays(value, low, high, threshold)


def mode_of_card(board, variant) -> str:
    """The mode a variant's decode rows were stored in (causal, or full for a context decoder)."""
    rows = board.rows(SUITE, variant)
    modes = rows[rows.phase == DECODE]["mode"].dropna()
    return modes.iloc[0] if not modes.empty else "causal"


def _contexts(board) -> list[int]:
    rows = board.rows(SUITE)
    return sorted(int(n) for n in rows[rows.check == "decode-time"].n.dropna().unique())


def _batches(board) -> list[int]:
    rows = board.rows(SUITE)
    return sorted(int(b) for b in rows[rows.check == "decode-time"].batch.dropna().unique())


def _why_not_timed(board, variant, n, batch) -> str:
    rows = board.rows(SUITE, variant)
    here = rows[(rows.check == "decode-time") & (rows.versus == "") & rows.status.isin([SKIPPED, ERROR])]
    cell = here[(here.n == n) & (here.batch == batch)]
    if not cell.empty:
        return cell.detail.iloc[0]
    whole = here[here.n.isna()]
    return whole.detail.iloc[0] if not whole.empty else f"context {n}, batch {batch} is not among this run's cells"


def _per_token_text(board, variant, growth, batch, context: bool) -> str:
    """The state's bytes per token of context (two counted contexts apart), or its fixed size; a context decoder's
    state is its context's, fixed while it decodes."""
    rows = board.rows(SUITE, variant)
    mine = rows[(rows.check == "state-bytes") & (rows.versus == "")
                & (rows.batch == batch)].dropna(subset=["value", "n"]).sort_values("n")
    if mine.empty:
        return "not measured"
    if growth == "fixed" and not context:
        return f"fixed: {_fmt_bytes(mine.value.iloc[-1])}"
    first, last = mine.iloc[0], mine.iloc[-1]
    if first.n == last.n:
        return _fmt_bytes(first.value) + f" at {int(first.n)}"
    per_token = (last.value - first.value) / (last.n - first.n)
    if growth == "window":
        return f"bounded: {_fmt_bytes(last.value)} from its window on" + (
            f" ({_fmt_bytes(per_token)}/token before)" if per_token > 0 else "")
    return f"{_fmt_bytes(per_token)} per token" + (" of its context (fixed while it decodes)" if context else "")


def _column_shape(board) -> tuple[int, int] | None:
    """(context, batch) the ranked rows show: the longest context timed at the smallest batch."""
    contexts, batches = _contexts(board), _batches(board)
    if not contexts or not batches:
        return None
    batch = min(batches)
    timed = board.rows(SUITE)
    timed = timed[(timed.check == "decode-time") & (timed.versus == "") & (timed.batch == batch)].n.dropna()
    return (int(timed.max()) if not timed.empty else max(contexts)), batch


def axes(board, variant) -> list[zoo.Axis]:
    """What a reader weighs from this suite at the ranked rows' context: the state a sequence keeps and the time per
    token against the standard cache decode (each a reason to choose for decoding)."""
    shape = _column_shape(board)
    if shape is None:
        return []
    n, batch = shape
    decodes = bool(board.card(variant).get("decoder_growth"))
    mode = mode_of_card(board, variant) if decodes else ""
    state = board.value(variant, "state-bytes", mode, DECODE, n, batch=batch) if decodes else None
    x = board.value(variant, "decode-ratio", mode, DECODE, n, versus=STANDARD[board.kind(variant)], batch=batch) \
        if decodes else None
    unfinished = board.unfinished(SUITE, variant)
    absent = ("does not decode" if not decodes else
              f"not measured: {unfinished[0]}" if unfinished else "not measured")
    return [zoo.Axis(f"decoding state at context {n}", state, "lower", _fmt_bytes(state) if state is not None else absent,
                     use=f"decoding memory at context {n}"),
            zoo.Axis(f"time per token at context {n} (x standard cache decode)", x, "lower",
                     fmt_x(x) if x is not None else absent, use=f"decoding speed at context {n}")]


def columns(board, variant) -> dict:
    """Beside the rank: what generating a token costs at the longest context timed at the smallest batch, and the
    state a sequence keeps there (or why the variant does not decode)."""
    shape = _column_shape(board)
    if shape is None:
        return {}
    n, batch = shape
    header = f"decode at context {n}, batch {batch}: time per token (x standard cache decode), state"
    card = board.card(variant)
    if not card.get("decoder_growth"):
        why = card.get("decoder_absent") or "no decoder recorded in this run"
        return {header: "does not decode " + board.notes.mark(f"{variant}: {why}")}
    mode, standard = mode_of_card(board, variant), STANDARD[board.kind(variant)]
    t = board.value(variant, "decode-time", mode, DECODE, n, batch=batch)
    if t is None and (unfinished := board.unfinished(SUITE, variant)):
        return {header: f"not timed: {unfinished[0]} "
                + board.notes.mark(f"the inference suite's job for {variant} did not finish: {unfinished[1]}")}
    if t is None:
        return {header: "not timed " + board.notes.mark(f"{variant}, batch {batch}, context {n}: "
                                                         + _why_not_timed(board, variant, n, batch))}
    x = board.value(variant, "decode-ratio", mode, DECODE, n, versus=standard, batch=batch)
    state = board.value(variant, "state-bytes", mode, DECODE, n, batch=batch)
    return {header: f"{_fmt_token(t)} ({fmt_x(x)}), {_fmt_bytes(state)}"}


def section(board) -> zoo.Section:
    """The inference section: the state each variant keeps, its time per generated token against the standard KV
    cache decode and the machine's read bandwidth, the variants that do not decode and why, the time plot."""
    rows, notes = board.rows(SUITE), Footnotes()
    if rows.empty:
        return zoo.Section("Inference", [f"_Not on this board: `zoo run-all --suite {SUITE}` runs it._"])
    settings = board.settings_of(SUITE)
    contexts, batches = _contexts(board), _batches(board)
    state_contexts = sorted(set(int(n) for n in rows[rows.check == "state-bytes"].n.dropna()))
    small = min(batches) if batches else 1
    states, times, absent = [], [], []
    for variant in board.variants:
        card = board.card(variant)
        growth = card.get("decoder_growth")
        if not growth:
            absent.append({"variant": variant, "why it does not decode": card.get("decoder_absent") or "not recorded"})
            continue
        mode = mode_of_card(board, variant)
        standard = STANDARD[board.kind(variant)]
        context = mode == "full"
        state_row = {"variant": variant, "state grows": {"token": "per token", "window": "up to its window",
                                                         "fixed": "with its context" if context else "fixed"}.get(
                                                             growth, growth),
                     f"state per sequence (batch {small})": _per_token_text(board, variant, growth, small, context)}
        for n in state_contexts:
            value = board.value(variant, "state-bytes", mode, DECODE, n, batch=small)
            state_row[f"context {n}"] = _fmt_bytes(value)
        ratios = board.rows(SUITE, variant)
        ratios = ratios[(ratios.check == "state-ratio") & (ratios.batch == small)].dropna(
            subset=["value", "n"]).sort_values("n")
        state_row["/ standard KV cache"] = (f"{fmt_g(ratios.value.iloc[-1])} (context {int(ratios.n.iloc[-1])})"
                                            if not ratios.empty else "-")
        states.append(state_row)
        for batch in batches:
            row = {"variant": variant, "batch": batch}
            for n in contexts:
                t = board.value(variant, "decode-time", mode, DECODE, n, batch=batch)
                if t is None:
                    row[f"context {n}"] = "not timed " + notes.mark(f"{variant}, batch {batch}, context {n}: "
                                                                     + _why_not_timed(board, variant, n, batch))
                    continue
                x = board.value(variant, "decode-ratio", mode, DECODE, n, versus=standard, batch=batch)
                fraction = board.value(variant, "read-fraction", mode, DECODE, n, batch=batch)
                marks = "varies" if _varies(board, variant, "decode-time", n, batch) or _varies(
                    board, variant, "decode-ratio", n, batch, standard) else ""
                row[f"context {n}"] = (f"{_fmt_token(t)} ({fmt_x(x)}" + (f", {fraction:.0%} of bandwidth" if fraction
                                       is not None else "") + ")" + (f" {marks}" if marks else ""))
            times.append(row)
    drifts = board.drifts(SUITE, "decode-time", STANDARD.values())
    bandwidth = rows[rows.check == "read-bandwidth"].value.dropna()
    setting = rows[rows.check == "read-bandwidth"].setting.dropna()
    text = [
        "Decoding token by token after a prompt of each context length: the state a sequence keeps (every tensor of "
        "it counted; beyond the timed contexts from the plugin's state_bytes formula, which the correctness suite "
        "checks against the counted bytes token by token) and the time per generated token: the median over "
        f"{settings.steps} steps per process (after {settings.warmup_steps} untimed ones) taking turns step by step "
        "with the standard decode, each step after a read of a buffer larger than the CPU's caches"
        f"{'' if getattr(settings, 'flush_large_steps', True) else ' (unless the step itself reads twice that buffer or more)'}, so it "
        "starts from memory as in a model whose other layers ran in between: "
        f"{STANDARD_LABELS[SDPA_CACHE]} for cores, {STANDARD_LABELS[MHA_CACHE]} for layers, at the same d_model "
        f"({settings.d_model}), heads ({settings.heads}, each with its own keys and values: a variant that keeps "
        f"fewer, grouped- or multi-query, is compared with the multi-head cache it replaces) and "
        f"{board.settings.get('dtype', 'float32')}. In brackets: the ratio to that standard decode and the bytes a "
        "step reads (counted: every tensor its ops read, each once: state, weights, the token) per second as a "
        "fraction of this machine's read bandwidth "
        + (f"({statistics.median(bandwidth):.3g} GB/s, {setting.iloc[0]}, measured in the same processes)"
           if not bandwidth.empty else "(not measured)")
        + ": decoding reads its whole state once per token, so that is its limit, and at batch 1 what is left of a "
        "step beyond it (1 - the fraction) is compute and framework overhead; over 100%, the step read less than "
        "was counted (an op that gathers a few blocks of a cache is counted as reading the whole tensor it gathers "
        "from) or part of it was still in the CPU's caches. *varies*: the figure's interval (every process's median, at least the steps' "
        "interquartile range; for a time per token also the machine's drift over the run: the standard decode, "
        "timed beside each variant in its own job, landed apart by (largest - smallest) / median "
        + (f"{statistics.median(drifts):.3g} over the cells, largest {max(drifts):.3g}" if drifts else "(not measured)")
        + ") reaches farther from it than half the run's threshold; compare ratios, measured in the same turns, not times, between runs.",
        *_overhead_text(board, small),
    ]
    tables = [zoo.Table("State each sequence keeps", [], states),
              zoo.Table("Time per generated token", [], times, footnotes=notes.reasons)]
    others = _other_decodes(board, contexts)
    if others:
        tables.append(zoo.Table("Against the plugin's own other decodes", [], others, note=[
            "Time per generated token of the variant's decode / that of another decode of the same function its "
            "plugin declares (a decoder baseline, checked against the forward by the correctness suite), median of "
            "per-turn ratios, the two taking turns step by step in the same cells as above; *varies*: the ratio's "
            "interval reaches farther from it than half the run's threshold."]))
    if absent:
        tables.append(zoo.Table("Variants that do not decode", [], absent))
    plots = {}
    for batch in batches:
        chosen = rows[(rows.phase == DECODE) & (rows.batch == batch)]
        plot = plots_.log_log(chosen, "decode-time", f"decode-time-batch{batch}.png",
                              f"seconds per generated token (batch {batch})", xlabel="context length (tokens)",
                              panels=plots_.kind_panels(board, {k: (c, STANDARD_LABELS[c]) for k, c in STANDARD.items()}),
                              greyed=plots_.unranked(board), palette=tuple(board.variants))
        if plot:
            plots[plot[0]] = plot[1]
    return zoo.Section("Inference", text, tables, plots)


def _overhead_text(board, batch: int) -> list[str]:
    """How much of a step at ``batch`` (the smallest) is not reading its state and weights at the measured
    bandwidth (1 - its read fraction: compute and framework overhead), at the longest context each variant was
    timed at, for the fixed-state variants and the others apart: a fixed state is small, so its step is bound by
    what runs around the read."""
    rows = board.rows(SUITE)
    fractions = rows[(rows.check == "read-fraction") & (rows.versus == "") & (rows.batch == batch)].dropna(
        subset=["value", "n"])
    groups: dict[str, dict[str, float]] = {}
    for variant, mine in fractions.groupby("variant", sort=False):
        fixed = board.card(variant).get("decoder_growth") == "fixed" and mode_of_card(board, variant) != "full"
        group = "fixed-state variants" if fixed else "cache decoders (a state that grows with the context, or is the context)"
        groups.setdefault(group, {})[variant] = max(1 - float(mine.sort_values("n").value.iloc[-1]), 0.0)
    parts = []
    for group, overheads in sorted(groups.items(), reverse=True):
        low, high = min(overheads, key=overheads.get), max(overheads, key=overheads.get)
        parts.append(f"{group}, median {statistics.median(overheads.values()):.0%} of a step (from "
                     f"{overheads[low]:.0%}, {low}, to {overheads[high]:.0%}, {high})")
    if not parts:
        return []
    return [f"Overhead at batch {batch}: the part of a step beyond reading its state and weights at the measured "
            "bandwidth (1 - its read fraction, at the longest context the variant was timed at): "
            + "; ".join(parts) + "."]


def _other_decodes(board, contexts) -> list[dict]:
    """Each variant's time per token against each decoder baseline its plugin declares, per batch and context."""
    rows = board.rows(SUITE)
    ratios = rows[(rows.check == "decode-ratio") & ~rows.versus.isin(["", *STANDARD.values()])]
    table = []
    for (variant, versus, batch), _ in ratios.groupby(["variant", "versus", "batch"], sort=True):
        mode = mode_of_card(board, variant)
        row = {"variant": variant, "versus": versus, "batch": int(batch)}
        for n in contexts:
            x = board.value(variant, "decode-ratio", mode, DECODE, n, versus=versus, batch=batch)
            row[f"context {n}"] = "-" if x is None else fmt_x(x) + (
                " varies" if _varies(board, variant, "decode-ratio", n, batch, versus) else "")
        table.append(row)
    return table


def settle(settings: dict) -> dict:
    """Contexts and batches in order, each once; a run stored before ``flush_large_steps`` existed flushed before
    every step."""
    return {"flush_large_steps": True, **settings, "contexts": tuple(sorted(set(settings["contexts"]))),
            "batches": tuple(sorted(set(settings["batches"]))),
            "state_contexts": tuple(sorted(set(settings["state_contexts"])))}


def details(board, variant) -> list:
    """The variant page's decoding: per batch and context, the state a sequence keeps, the time per generated token,
    its ratio to the standard decode and the fraction of the read bandwidth a step reaches; or why it does not
    decode."""
    card = board.card(variant)
    if not card.get("decoder_growth"):
        reason = card.get("decoder_absent")
        return [zoo.Table("Decoding", ["why it does not decode"], [{"why it does not decode": reason}])] if reason \
            else []
    mode, standard = mode_of_card(board, variant), STANDARD[board.kind(variant)]
    rows = []
    for batch in _batches(board):
        for n in _contexts(board):
            t = board.value(variant, "decode-time", mode, DECODE, n, batch=batch)
            state = board.value(variant, "state-bytes", mode, DECODE, n, batch=batch)
            if t is None and state is None:
                continue
            x = board.value(variant, "decode-ratio", mode, DECODE, n, versus=standard, batch=batch)
            fraction = board.value(variant, "read-fraction", mode, DECODE, n, batch=batch)
            rows.append({"batch": batch, "context": n, "state": _fmt_bytes(state),
                         "time per token": _fmt_token(t) if t is not None else "not timed",
                         f"x {STANDARD_LABELS[standard]}": fmt_x(x) if x is not None else "-",
                         "of read bandwidth": f"{fraction:.0%}" if fraction is not None else "-"})
    return [zoo.Table("Decoding", list(rows[0]), rows)] if rows else []


SUITE_DEFINITION = zoo.Suite(
    SUITE, "decoding token by token after a prompt: the state each sequence keeps, the time per generated token "
    "against the standard KV-cache decode, and the fraction of the machine's memory bandwidth a step reaches",
    measures=(
        zoo.Measure("state-bytes", "the state a sequence keeps after a prompt of n tokens (batch: in the batch "
                    "field), counted; params source=formula: from the plugin's checked state_bytes formula", "bytes"),
        zoo.Measure("state-ratio", "the variant's state / the standard KV cache's (versus)", "ratio"),
        zoo.Measure("prefill-time", "one prefill of the prompt: its outputs and the state it leaves", "s"),
        zoo.Measure("decode-time", "time per generated token, median over the rounds of steps of every process (versus: the "
                    "standard decode's or a decoder baseline's, in turns with it)", "s"),
        zoo.Measure("decode-ratio", "time per token / that of the decode in versus (the standard one, or a decoder "
                    "baseline of the plugin's), median of per-turn ratios", "ratio"),
        zoo.Measure("decode-between", "spread of the processes' medians of the time per token", "(max-min)/median"),
        zoo.Measure("step-bytes", "the bytes one step reads, counted: every tensor its ops read, each once", "bytes"),
        zoo.Measure("state-allocated", "the storage behind the state's tensors, room to grow included", "bytes"),
        zoo.Measure("read-fraction", "step bytes / time per token / the measured read bandwidth", "fraction"),
        zoo.Measure("decode-tokens-per-s", "generated tokens per second, every sequence of the batch", "tokens/s"),
        zoo.Measure("decode-growth", "time per token at context n / at the shortest timed context (params: shortest), "
                    "median of per-turn ratios of the variant's two decodes taking turns", "ratio"),
        zoo.Measure("state-growth", "counted state at the longest timed context / at the shortest", "ratio"),
        zoo.Measure("read-bandwidth", "this machine's memory read rate, measured in the same process", "GB/s")),
    section=section, columns=columns, details=details, axes=axes, order=35, settle=settle,
    settings={
        "batches": (1, 16), "contexts": (1024, 4096), "d_model": 512, "heads": 8,
        # timed generated tokens per cell and process, each step after a flush of the caches, the two decodes taking
        # turns step by step, after untimed ones
        "steps": 16, "warmup_steps": 4,
        # the plan: a cell is not timed where its prefill or its state is predicted to exceed these (no clock decides)
        "max_prefill_gflop": 120.0, "max_state_gib": 2.0, "max_prefill_tokens": 16384,
        "state_contexts": (16384, 32768),  # contexts the state is stated at beyond the timed ones (formula)
        "bandwidth_mib": 256,
        "flush_mib": 64,  # read before every timed step (at least twice the last-level cache the machine reports)
        "flush_beyond_cache": True,  # false: flush_mib alone (the smoke profile checks that it works, in seconds)
        # false: no flush before a step that itself reads at least twice the flush buffer (it has evicted its own
        # start by its end)
        "flush_large_steps": False,
        # a time per token whose interval reaches farther than half this fraction from it is marked varies
        # (zoo.timing.strays)
        "interval_threshold": 0.1,
    },
    presets={
        "full": {"contexts": (1024, 2048, 4096, 8192, 16384, 32768), "steps": 256, "warmup_steps": 8,
                 "max_prefill_gflop": 12000.0, "max_state_gib": 8.0, "max_prefill_tokens": None},
        "smoke": {"batches": (1, 2), "contexts": (64, 128), "d_model": 64, "heads": 2, "steps": 8, "warmup_steps": 1,
                  "state_contexts": (1024,), "bandwidth_mib": 32, "flush_mib": 4,
                  "flush_beyond_cache": False},
    })


@zoo.hookimpl
def zoo_register_suites(register):
    register(SUITE_DEFINITION)


@zoo.hookimpl
def zoo_register_checks(register):
    register(Check("inference", SUITE, "state bytes, prefill and time per generated token against the standard KV "
                   "cache decode and the read bandwidth, at each context and batch", run_inference, combine=combine))
