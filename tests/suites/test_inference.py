"""The inference suite: counted states, times per token against the standard KV-cache decode (no timing asserts)."""

import dataclasses

import torch
import torch.nn.functional as F

import zoo
from zoo.board import fmt_x
from zoo.checks import MEASURED, SKIPPED
from zoo.profiles import get_profile
from zoo.measure import count_flops
from zoo.suites.inference import MHA_CACHE, SDPA_CACHE, StandardDecode, combine, prefill_predictor, run_inference

PROFILE = get_profile("smoke")
SETTINGS = PROFILE.of("inference")


def rows_of(registry, name, profile=PROFILE):
    return list(run_inference(registry.variant(name), profile))


def test_every_cell_states_its_counted_state_its_prefill_and_its_time_per_token_against_the_standard_decode(registry):
    rows = rows_of(registry, "dot-product")
    cells = {(b, n) for b in SETTINGS.batches for n in SETTINGS.contexts}
    for check, versus in [("state-bytes", ""), ("state-bytes", SDPA_CACHE), ("decode-time", ""),
                          ("decode-time", SDPA_CACHE), ("decode-ratio", SDPA_CACHE), ("read-fraction", ""),
                          ("prefill-time", ""), ("decode-tokens-per-s", "")]:
        measured = {(r.batch, r.n) for r in rows if r.check == check and r.versus == versus and r.status == MEASURED}
        assert measured >= cells, (check, versus, measured)
    state = {(r.batch, r.n): r.value for r in rows if r.check == "state-bytes" and not r.versus}
    for (batch, n), value in state.items():  # keys and values of every token, float32
        assert value == 2 * batch * n * SETTINGS.d_model * 4
    times = [r for r in rows if r.check == "decode-time" and not r.versus]
    assert all(len(r.samples) == SETTINGS.steps and r.low <= r.value <= r.high for r in times)
    ratio = next(r for r in rows if r.check == "decode-ratio")
    mine = next(r for r in times if (r.batch, r.n) == (ratio.batch, ratio.n))
    theirs = next(r for r in rows if r.check == "decode-time" and r.versus == SDPA_CACHE
                  and (r.batch, r.n) == (ratio.batch, ratio.n))
    assert ratio.samples == [a / b for a, b in zip(mine.samples, theirs.samples)]  # paired turn by turn
    bandwidth = next(r for r in rows if r.check == "read-bandwidth")
    fraction = next(r for r in rows if r.check == "read-fraction" and not r.versus and (r.batch, r.n) == (mine.batch, mine.n))
    step_bytes = next(r for r in rows if r.check == "step-bytes" and not r.versus and (r.batch, r.n) == (mine.batch, mine.n))
    assert abs(fraction.value - step_bytes.value / mine.value / (bandwidth.value * 1e9)) < 1e-9 * fraction.value


def test_a_layer_is_compared_with_the_projections_of_nn_multihead_attention_and_a_step_counts_what_it_reads(registry):
    rows = rows_of(registry, "multi-head", PROFILE.with_settings("inference", batches=(1,), contexts=(64,)))
    assert {r.versus for r in rows if r.check == "decode-ratio"} == {MHA_CACHE}
    [mine] = [r for r in rows if r.check == "step-bytes" and not r.versus]
    [state] = [r for r in rows if r.check == "state-bytes" and not r.versus and r.n == 64]
    d, grown = SETTINGS.d_model, SETTINGS.warmup_steps + 1  # the cache has grown by the untimed steps before
    weights, cache = (4 * d * d + 4 * d) * 4, state.value * (64 + grown) / 64  # projections with their biases
    assert weights + cache <= mine.value <= weights + cache + 16 * d * 4  # and a few token-sized temporaries


def test_the_standard_decode_steps_compute_the_causal_attention_they_are_compared_as():
    torch.manual_seed(0)
    batch, n, d, heads, prompt = 2, 12, 16, 2, 5
    q, k, v = (torch.randn(batch, n, d, dtype=torch.float64) for _ in range(3))
    for layer in (False, True):
        standard = StandardDecode(layer, batch, d, heads, n, "cpu", torch.float64)
        standard.fill(k[:, :prompt], v[:, :prompt])
        outputs = [standard.step(q[:, i:i + 1], k[:, i:i + 1], v[:, i:i + 1], context=False) for i in range(prompt, n)]
        if layer:
            expected = standard.mha(q, k, v, attn_mask=torch.ones(n, n, dtype=torch.bool).triu(1), need_weights=False)[0]
        else:
            split = [x.view(batch, n, heads, -1).transpose(1, 2) for x in (q, k, v)]
            expected = F.scaled_dot_product_attention(*split, is_causal=True).transpose(1, 2).reshape(batch, n, d)
        assert torch.allclose(torch.cat(outputs, 1), expected[:, prompt:], atol=1e-12)
        assert standard.state_bytes() == 2 * batch * n * d * 8


def test_a_variant_that_does_not_decode_says_why_and_keeps_the_bandwidth_row(registry):
    rows = rows_of(registry, "linformer")
    skipped = [r for r in rows if r.status == SKIPPED]
    assert len(skipped) == 1 and "no causal form" in skipped[0].detail
    assert any(r.check == "read-bandwidth" and r.value > 0 for r in rows)


def test_the_plan_leaves_a_cell_out_by_its_predicted_prefill_before_timing_anything(registry):
    profile = PROFILE.with_settings("inference", max_prefill_gflop=1e-9)
    rows = rows_of(registry, "dot-product", profile)
    skipped = [r for r in rows if r.check == "decode-time" and r.status == SKIPPED]
    assert len(skipped) == len(SETTINGS.batches) * len(SETTINGS.contexts)
    assert all("predicted prefill" in r.detail and r.batch is not None for r in skipped)
    assert not [r for r in rows if r.check == "decode-time" and r.status == MEASURED]


def test_a_prefill_counted_below_a_window_is_not_extrapolated_as_quadratic(registry):
    """A banded variant without a FLOP formula costs a dense prefill's FLOPs below its window: the plan counts on
    to where its growth settles to the claim, so a long prefill is predicted near its counted cost."""
    windowed = registry.variant("windowed")
    variant = dataclasses.replace(windowed, options={**windowed.options, "window": 256, "block": 256})
    d_model, heads, context = 64, 2, 8192
    predicted = prefill_predictor(variant, d_model, heads, context)(1, context)
    torch.manual_seed(0)
    module = zoo.build(variant, d_model=d_model, num_heads=heads)
    x = torch.randn(1, context, d_model)
    with torch.no_grad():
        counted = count_flops(lambda: module(x, x, x, is_causal=True)) / 1e9
    assert counted <= predicted <= 1.5 * counted, (predicted, counted)
    dense = prefill_predictor(registry.variant("additive"), d_model, heads, context)  # claims quadratic: two lengths
    assert dense(1, 256) / dense(1, 128) > 3.5


def test_a_probe_length_the_module_cannot_take_stops_the_counting_and_not_the_suite(registry, monkeypatch):
    """A module that refuses sequences past 256 tokens is counted up to there, and its prefills predicted from
    what was counted (inside its window of 512: as if quadratic, over what counting on would give); one that
    refuses every length is predicted nothing, so its cells are tried (and fail there, each with its reason)."""
    windowed = registry.variant("windowed")
    variant = dataclasses.replace(windowed, options={**windowed.options, "window": 512, "block": 512})
    build = zoo.build

    class Refusing(torch.nn.Module):
        def __init__(self, module, longest):
            super().__init__()
            self.module, self.longest = module, longest

        def forward(self, query, key, value, **kwargs):
            if query.shape[1] > self.longest:
                raise ValueError(f"longer than {self.longest}")
            return self.module(query, key, value, **kwargs)

    def refusing(longest):
        return lambda *args, **kwargs: Refusing(build(*args, **kwargs), longest)

    unbounded = prefill_predictor(variant, 64, 2, 4096)
    monkeypatch.setattr(zoo, "build", refusing(256))
    predicted = prefill_predictor(variant, 64, 2, 4096)
    assert predicted(1, 4096) > unbounded(1, 4096) > 0  # counted inside its window only: the safe side, quadratic
    monkeypatch.setattr(zoo, "build", refusing(0))
    assert prefill_predictor(variant, 64, 2, 4096)(16, 4096) == 0.0


def test_the_state_at_long_contexts_comes_from_the_checked_formula_and_says_so(registry):
    rows = rows_of(registry, "multi-query")
    formula = [r for r in rows if r.check == "state-bytes" and (r.params or {}).get("source") == "formula"]
    assert {r.n for r in formula} == set(SETTINGS.state_contexts) - set(SETTINGS.contexts)
    heads = registry.variant("multi-query")
    for row in formula:  # one key head and one value head per token: 1/heads of multi-head's cache
        assert row.value == 2 * row.batch * row.n * (SETTINGS.d_model // SETTINGS.heads) * 4, heads


def test_processes_combine_into_pooled_times_and_one_state_per_cell(registry):
    variant = registry.variant("linear")
    profile = PROFILE.with_settings("inference", batches=(1,), contexts=(64, 128))
    first, second = list(run_inference(variant, profile)), list(run_inference(variant, profile))
    rows = combine(variant, profile, [first, second])
    times = [r for r in rows if r.check == "decode-time" and not r.versus]
    assert {r.n for r in times} == {64, 128} and all(len(r.samples) == 2 * SETTINGS.steps
                                                 for r in times)
    assert all(r.low <= r.value <= r.high for r in times)
    assert len([r for r in rows if r.check == "state-bytes" and not r.versus and not r.params]) == 2
    [growth] = [r for r in rows if r.check == "decode-growth"]
    assert growth.n == 128 and growth.params == {"shortest": 64} and len(growth.samples) == 2 * SETTINGS.steps
    assert growth.low <= growth.value <= growth.high
    [state] = [r for r in rows if r.check == "state-growth"]
    assert state.value == 1.0  # linear attention's state does not grow with the context
    between = [r for r in rows if r.check == "decode-between"]
    assert between and all(r.value >= 0 for r in between)


def test_the_board_shows_state_and_time_per_token_and_why_a_variant_does_not_decode(registry, tmp_path):
    from zoo import leaderboard
    from zoo.store import Store

    profile = PROFILE.with_settings("inference", batches=(1,), contexts=(64, 128))
    store = Store(tmp_path / "results.sqlite")
    run_id = store.start_run(profile.as_dict(), {"device": "cpu"}, "2026-01-01 00:00:00")
    for name in ("dot-product", "linear", "linformer"):
        variant = registry.variant(name)
        store.record_job(run_id, name, "inference", "done", 1.0, {"card": variant.card()},
                         [r.as_dict() for r in run_inference(variant, profile)])
    leaderboard.render(store, run_id, tmp_path)
    text = (tmp_path / "README.md").read_text()
    section = text[text.index("## Inference"):]
    assert "State each sequence keeps" in section and "Time per generated token" in section
    assert "fixed: " in section and "per token" in section and "no causal form" in section
    assert (tmp_path / "decode-time-batch1.png").stat().st_size > 0


def test_a_step_counts_the_buffers_it_reads_and_not_the_weights_it_leaves_alone(registry):
    profile = PROFILE.with_settings("inference", batches=(1,), contexts=(64,))
    performer, cross = (registry.variant(name) for name in ("performer", "cross"))
    [read] = [r.value for r in run_inference(performer, profile) if r.check == "step-bytes" and not r.versus]
    module = zoo.build(performer, d_model=SETTINGS.d_model, num_heads=SETTINGS.heads)
    buffers = sum(b.numel() * b.element_size() for b in module.buffers())
    assert buffers and read >= buffers  # its random projection is read at every step
    rows = list(run_inference(cross, profile))
    [read] = [r.value for r in rows if r.check == "step-bytes" and not r.versus]
    [state] = [r.value for r in rows if r.check == "state-bytes" and not r.versus and not r.params]
    module = zoo.build(cross, d_model=SETTINGS.d_model, num_heads=SETTINGS.heads)
    weights = sum(p.numel() * p.element_size() for p in module.parameters())
    assert state < read < state + weights  # the context's projections ran in the prefill, not in a step


def test_a_decoder_baseline_is_timed_in_turns_and_its_ratio_survives_combining_and_reaches_the_board(registry, tmp_path):
    from zoo import leaderboard
    from zoo.store import Store

    variant = registry.variant("mla")
    profile = PROFILE.with_settings("inference", batches=(1,), contexts=(64,))
    processes = [list(run_inference(variant, profile)) for _ in range(2)]
    for rows in (processes[0], combine(variant, profile, processes)):
        assert {r.versus for r in rows if r.check == "decode-ratio"} == {MHA_CACHE, "explicit-latent"}
        mine, explicit = ([r for r in rows if r.check == "decode-time" and r.versus == who] for who in ("", "explicit-latent"))
        [ratio] = [r for r in rows if r.check == "decode-ratio" and r.versus == "explicit-latent"]
        assert len(mine) == len(explicit) == 1 and ratio.samples == [a / b for a, b in zip(mine[0].samples,
                                                                                           explicit[0].samples)]
        assert {r.versus for r in rows if r.check == "step-bytes"} == {"", MHA_CACHE, "explicit-latent"}
    assert len(ratio.samples) == 2 * SETTINGS.steps  # both processes' turns
    store = Store(tmp_path / "results.sqlite")
    run_id = store.start_run(profile.as_dict(), {"device": "cpu"}, "2026-01-01 00:00:00")
    store.record_job(run_id, "mla", "inference", "done", 1.0, {"card": variant.card()},
                     [r.as_dict() for r in combine(variant, profile, processes)])
    leaderboard.render(store, run_id, tmp_path)
    section = (tmp_path / "README.md").read_text().split("## Inference", 1)[1]
    table = section[section.index("Against the plugin's own other decodes"):]
    [combined] = [r for r in combine(variant, profile, processes) if r.check == "decode-ratio"
                  and r.versus == "explicit-latent"]
    assert "| mla " in table and "explicit-latent" in table and f"| {fmt_x(combined.value)}" in table

    only_later = [[r for r in processes[0] if r.versus != "explicit-latent"], processes[1]]
    rows = combine(variant, profile, only_later)  # the first process's callables are the cell's
    assert not [r for r in rows if r.versus == "explicit-latent" and r.check in ("decode-time", "decode-ratio")]
    assert [r for r in rows if r.check == "decode-ratio" and r.versus == MHA_CACHE]


def test_a_decoder_baseline_whose_prefill_fails_costs_its_own_figures_and_not_the_variants_cell(registry):
    import dataclasses

    variant = registry.variant("mla")
    profile = PROFILE.with_settings("inference", batches=(1,), contexts=(64,))
    explicit = variant.decoder.baselines["explicit-latent"]

    def out_of_memory(module, *inputs):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes")

    broken = dataclasses.replace(variant, decoder=dataclasses.replace(
        variant.decoder, baselines={"explicit-latent": dataclasses.replace(explicit, prefill=out_of_memory)}))
    rows = list(run_inference(broken, profile))
    [skipped] = [r for r in rows if r.versus == "explicit-latent" and r.check == "decode-time"]
    assert skipped.status == SKIPPED and "decoder baseline 'explicit-latent'" in skipped.detail
    assert [r for r in rows if r.check == "decode-ratio" and r.versus == MHA_CACHE and r.status == MEASURED]
    assert not [r for r in rows if r.status == "error"]


def test_a_prefill_that_runs_out_of_memory_leaves_its_cell_untimed_and_any_other_failure_is_an_error(registry):
    import dataclasses

    variant = registry.variant("dot-product")
    profile = PROFILE.with_settings("inference", batches=(1,), contexts=(64, 128))

    def failing(error):
        def prefill(module, query, key, value, key_mask=None):
            if query.shape[1] > 64:
                raise error
            return variant.decoder.prefill(module, query, key, value, key_mask)
        return dataclasses.replace(variant, decoder=dataclasses.replace(variant.decoder, prefill=prefill))

    for error, status in ((RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes"),
                           SKIPPED), (RuntimeError("a bug"), "error")):
        rows = list(run_inference(failing(error), profile))
        [cell] = [r for r in rows if r.check == "decode-time" and r.n == 128 and not r.versus]
        assert cell.status == status and ("ran out of memory" in cell.detail) == (status == SKIPPED), cell
        assert [r for r in rows if r.check == "decode-time" and r.n == 64 and r.status == MEASURED]


def test_growth_is_the_ratio_of_the_variants_two_decodes_taking_turns_in_the_longer_cell(registry):
    import dataclasses

    variant = registry.variant("linear")
    profile = PROFILE.with_settings("inference", batches=(1,), contexts=(64, 128))
    stepped = []

    def step(module, state, query, key, value, key_mask):
        stepped.append(state["length"])  # which decode took this step: the one after 64 tokens or after 128
        out, state = variant.decoder.step(module, state, query, key, value, key_mask)
        return out, {**state, "length": state["length"] + 1}

    def prefill(module, query, key, value, key_mask=None):
        out, state = variant.decoder.prefill(module, query, key, value, key_mask)
        return out, {**state, "length": query.shape[1]}

    traced = dataclasses.replace(variant, decoder=dataclasses.replace(variant.decoder, prefill=prefill, step=step))
    rows = list(run_inference(traced, profile))
    [growth] = [r for r in rows if r.check == "decode-growth"]
    assert growth.n == 128 and growth.params == {"shortest": 64} and len(growth.samples) == SETTINGS.steps
    timed = stepped[-2 * SETTINGS.steps:]  # the 128 cell's timed steps of the variant's two decodes
    assert sorted({length < 128 for length in timed}) == [False, True]  # both decodes stepped, in turns
    assert all((a < 128) != (b < 128) for a, b in zip(timed[::2], timed[1::2]))


def test_a_failed_prefill_of_the_shorter_prompt_leaves_growth_unmeasured_or_an_error_and_the_cells_timed(registry):
    import dataclasses

    variant = registry.variant("linear")
    profile = PROFILE.with_settings("inference", batches=(1,), contexts=(64, 128))
    for error, status in ((RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes"),
                           SKIPPED), (RuntimeError("a bug"), "error")):  # out of memory beside the cell; a bug
        prefills = []

        def prefill(module, query, key, value, key_mask=None):
            prefills.append(query.shape[1])
            if len(prefills) == 3:  # the 128 cell's second prefill: the 64-token prompt beside it
                raise error
            return variant.decoder.prefill(module, query, key, value, key_mask)

        rows = list(run_inference(dataclasses.replace(variant, decoder=dataclasses.replace(variant.decoder,
                                                                                            prefill=prefill)), profile))
        assert prefills == [64, 128, 64]
        [growth] = [r for r in rows if r.check == "decode-growth"]
        assert growth.status == status and str(error) in growth.detail and "64 tokens" in growth.detail
        assert {r.n for r in rows if r.check == "decode-time" and r.status == MEASURED and not r.versus} == {64, 128}


def test_a_steps_bytes_are_counted_once_in_a_run_and_a_further_process_steps_plainly(registry, monkeypatch, tmp_path):
    """The first process counts what a step reads; a further process of the same run (the same shared folder)
    reads the count and still makes the step, outside the counting mode, so its state advances alike."""
    from zoo.environment import RUN_CACHE
    from zoo.suites import inference

    monkeypatch.setenv(RUN_CACHE, str(tmp_path))
    counting = []
    monkeypatch.setattr(inference, "bytes_read", lambda step: counting.append(step) or zoo.measure.bytes_read(step))
    profile = PROFILE.with_settings("inference", batches=(1,), contexts=(16,))
    first, again = (rows_of(registry, "dot-product", profile) for _ in range(2))
    read = [{r.versus: r.value for r in rows if r.check == "step-bytes"} for rows in (first, again)]
    assert read[0] == read[1] and read[0][""] > 0 and len(read[0]) == 2  # the variant's and the standard decode's
    assert len(counting) == 2  # in the first process only
    states = [[r.value for r in rows if r.check == "state-bytes"] for rows in (first, again)]
    assert states[0] == states[1]


def test_an_inference_job_that_did_not_finish_says_why_where_its_figures_are_missing(registry, tmp_path):
    """A timed-out job (its worker's row) reads 'not timed: timed out' beside the rank and 'not measured: timed
    out' on the decoding axes, the whole reason in a footnote."""
    from conftest import board_with_a_timed_out_job
    from zoo.suites.inference import axes, columns

    profile = PROFILE.with_settings("inference", batches=(1,), contexts=(64,))
    timed = [r.as_dict() for r in run_inference(registry.variant("dot-product"), profile)]
    why = "timed out: the job took longer than the limit of 900 s (--timeout)"
    board = board_with_a_timed_out_job(tmp_path, registry, profile, "inference", ("dot-product", timed), "linear", why)
    [cell] = columns(board, "linear").values()
    assert cell.startswith("not timed: timed out ") and any(why in line for line in board.notes.lines())
    assert [axis.text for axis in axes(board, "linear")] == ["not measured: timed out"] * 2
    assert not any(axis.text.startswith("not") for axis in axes(board, "dot-product"))


def test_the_section_says_what_fraction_of_a_step_at_batch_1_is_overhead_for_fixed_states_and_caches_apart(
        registry, tmp_path):
    """#26's target: the part of a step beyond reading its state and weights at the measured bandwidth (1 - the
    read fraction), a fixed state's apart from a cache's, from the stored rows."""
    from zoo.board import Board
    from zoo.store import Store
    from zoo.suites.inference import section

    profile = PROFILE.with_settings("inference", batches=(1,), contexts=(64, 128))
    store = Store(tmp_path / "results.sqlite")
    run = store.start_run(profile.as_dict(), {"device": "cpu"}, "2026-01-01 00:00:00")
    overhead = {}
    for name in ("dot-product", "linear"):
        rows = list(run_inference(registry.variant(name), profile))
        store.record_job(run, name, "inference", "done", 1.0, {"card": registry.variant(name).card()},
                         [r.as_dict() for r in rows])
        fraction = next(r.value for r in rows if r.check == "read-fraction" and not r.versus and r.n == 128)
        overhead[name] = f"{max(1 - fraction, 0):.0%}"
    [line] = [p for p in section(Board.of(store, run, registry.suites)).text if p.startswith("Overhead at batch 1")]
    assert f"fixed-state variants, median {overhead['linear']} of a step (from {overhead['linear']}, linear" in line
    assert f"cache decoders (a state that grows with the context, or is the context), median {overhead['dot-product']}" in line


def test_a_later_process_of_a_run_reads_back_the_states_the_first_prefilled_and_times_the_same_cells(
        registry, tmp_path, monkeypatch):
    """A further process does not prefill again where the run kept the first's states: its cells, counted states and
    steps are the first's, only the prefill time is the first process's alone; the decoder baseline that shares the
    variant's prefill (MLA's explicit form) and the shortest prompt's decode start from the state prefilled once;
    the standard decode's cache of a cell is projected once for every variant of its kind."""
    import dataclasses

    from zoo.environment import RUN_CACHE

    variant = registry.variant("mla")
    prefills = []

    def counted(module, *inputs):
        prefills.append(inputs[0].shape[:2])
        return variant.decoder.prefill(module, *inputs)

    explicit = dataclasses.replace(variant.decoder.baselines["explicit-latent"], prefill=counted)
    counting = dataclasses.replace(variant, decoder=dataclasses.replace(
        variant.decoder, prefill=counted, baselines={"explicit-latent": explicit}))
    profile = PROFILE.with_settings("inference", batches=(1,), contexts=(64, 128))
    projected = []  # the standard decode's prompts projected into its cache (its steps project one token)
    project = StandardDecode._project

    def noting_prompts(self, x, index):
        if x.shape[1] > 1:
            projected.append(x.shape[1])
        return project(self, x, index)

    monkeypatch.setattr(StandardDecode, "_project", noting_prompts)
    monkeypatch.setenv(RUN_CACHE, str(tmp_path))
    first = list(run_inference(counting, profile))
    assert sorted(prefills) == [(1, 64), (1, 128)]  # each prompt once, for the variant, its baseline and the growth
    assert sorted(projected) == [64, 64, 128, 128]  # keys and values, once per cell
    later = list(run_inference(counting, profile))
    other_layer = list(run_inference(registry.variant("multi-head"), profile))  # the same standard decode's cells
    assert len(prefills) == 2 and len(projected) == 4
    assert {r.n for r in other_layer if r.check == "decode-time" and r.versus == MHA_CACHE} == {64, 128}
    assert [r.check for r in first if r.check == "prefill-time"] == ["prefill-time"] * 2
    assert not [r for r in later if r.check == "prefill-time"]
    key = lambda rows: sorted((r.check, r.versus, r.n, r.value) for r in rows if r.check in ("state-bytes", "step-bytes"))
    assert key(later) == key(first)
    timed = lambda rows: sorted((r.versus, r.n, len(r.samples)) for r in rows if r.check == "decode-time")
    assert timed(later) == timed(first) and len(timed(first)) == 2 * 3  # the variant, its baseline, the standard
    [prefill] = [r for r in combine(counting, profile, [first, later]) if r.check == "prefill-time" and r.n == 128]
    assert prefill.samples == [next(r.value for r in first if r.check == "prefill-time" and r.n == 128)]


def test_the_prompt_is_drawn_once_in_a_run_and_read_back_by_its_other_processes(tmp_path, monkeypatch):
    from zoo.environment import RUN_CACHE
    from zoo.suites import inference

    settings = PROFILE.of("inference")
    drawn, randn = [], torch.randn
    monkeypatch.setattr(torch, "randn", lambda *shape, **kw: drawn.append(shape) or randn(*shape, **kw))
    monkeypatch.setenv(RUN_CACHE, str(tmp_path))
    prompts = []
    for _ in range(2):  # two processes of one run: each starts with no prompt of its own
        monkeypatch.setattr(inference, "_PROMPTS", {})
        prompts.append(inference._prompt(settings, PROFILE, 1, min(settings.contexts)))
    assert len(drawn) == 1 and torch.equal(prompts[0], prompts[1])
    assert prompts[0].shape == (1, min(settings.contexts), settings.d_model)
