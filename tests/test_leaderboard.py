"""Plugin text cannot break the Markdown tables or inject markup; ranking is correctness-gated."""

import re

import pandas as pd

from conftest import BUILTINS
from zoo.board import cell
from zoo.leaderboard import registered_suites
from zoo.ranking import gate


def test_cell_escapes_pipes_newlines_backticks_and_html():
    text = cell("a|b\nc `code` <script>alert(1)</script>")
    assert "|" not in text and "\n" not in text and "`" not in text and "<script>" not in text
    assert "&lt;script&gt;" in text
    assert cell("<!--<script>\u2028x") == "&lt;!--&lt;script&gt; x"  # what emptied index.html stays text here
    assert "](" not in cell("![pixel](http://example.com/x.png) [link](http://example.com)")  # no remote image


def test_table_headers_from_plugin_text_are_escaped_and_page_data_with_nan_still_parses():
    import json

    from zoo.board import markdown_table as _table
    from zoo.webpage import script_json

    assert "&#124;" in _table(pd.DataFrame([{"task|<b>": 1.0}])).splitlines()[0]
    assert json.loads(script_json({"value": float("nan"), "rows": [float("inf"), 1.0]})) == {"value": None, "rows": [None, 1.0]}


def test_gate_ranks_only_checked_variants_and_lists_correctness_failures_and_errors_anywhere():
    rows = pd.DataFrame([
        {"variant": "good", "suite": "correctness", "check": "x", "status": "passed", "detail": "", "setting": ""},
        {"variant": "good", "suite": "complexity", "check": "flops-exponent", "status": "failed", "detail": "claim", "setting": ""},
        {"variant": "bad", "suite": "correctness", "check": "causal-leak", "status": "failed", "detail": "leak", "setting": "s"},
        {"variant": "crashy", "suite": "correctness", "check": "x", "status": "passed", "detail": "", "setting": ""},
        {"variant": "crashy", "suite": "speed", "check": "worker", "status": "error", "detail": "crashed", "setting": ""},
        {"variant": "nan", "suite": "correctness", "check": "x", "status": "passed", "detail": "", "setting": ""},
        {"variant": "nan", "suite": "speed", "check": "time", "status": "error", "detail": "NaN output", "setting": ""},
        {"variant": "unchecked-crash", "suite": "correctness", "check": "worker", "status": "error", "detail": "killed",
         "setting": ""},
        {"variant": "unchecked", "suite": "speed", "check": "time", "status": "measured", "detail": "", "setting": ""},
    ])
    standings = gate(rows, registered_suites())
    assert standings["good"].ranked and standings["good"].reasons == []
    assert standings["bad"].reasons == ["correctness/causal-leak: leak [s]"] and not standings["bad"].ranked
    # a speed job its worker did not finish leaves speed's figures missing; an error a check gave still blocks,
    # and an unfinished job of the required suite does too
    assert standings["crashy"].ranked and standings["crashy"].reasons == []
    assert standings["nan"].reasons == ["speed/time: NaN output"] and not standings["nan"].ranked
    assert standings["unchecked-crash"].reasons == ["correctness/worker: killed"]
    assert not standings["unchecked"].checked and not standings["unchecked"].ranked


def _gpu_run(tmp_path):
    """A stored cuda run with what a GPU records: the kernels that ran and the allocator's peaks."""
    from zoo.store import Store

    store = Store(tmp_path / "results.sqlite")
    run = store.start_run({"name": "quick", "reference_length": 64, "dtype": "bfloat16", "device": "cuda"},
                          {"device": "cuda (NVIDIA H200)"}, "2026-01-01 00:00:00")
    where = {"n": 64, "mode": "full", "phase": "fwd+bwd"}
    store.record_job(run, "dot-product", "speed", "done", 1.0, {"card": {}}, [
        {"check": "gflops", "status": "measured", "value": 50.0, **where},
        {"check": "peak-fraction", "status": "measured", "value": 0.1, **where},
        {"check": "tokens-per-s", "status": "measured", "value": 1e6, **where},
        {"check": "sdpa-backend", "status": "measured", **where, "detail": "aten._scaled_dot_product_flash_attention."
         "default, aten._scaled_dot_product_flash_attention_backward.default"}])
    store.record_job(run, "dot-product", "complexity", "done", 1.0, {"card": {}}, [
        {"check": "cuda-allocator-peak", "status": "measured", "value": 3 * 2 ** 20, **where},
        {"check": "memory", "status": "measured", "value": 2 * 2 ** 20, **where}])
    return store, run


def test_a_gpu_run_shows_its_kernels_allocator_peaks_and_dtype(tmp_path):
    from zoo.leaderboard import render

    store, run = _gpu_run(tmp_path)
    readme = render(store, run, tmp_path / "board")[0].read_text()
    assert "flash_attention (+ backward)" in readme
    gpu = readme.split("### GPU memory", 1)[1].split("## Speed", 1)[0]
    assert re.search(r"\| dot-product \| full +\| fwd\+bwd \| +64 \| +3 \| +2 \|", gpu), gpu
    assert "Bfloat16 matmul peak" in readme


def test_line_end_labels_never_overlap_and_every_line_looks_different():
    import math

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from zoo.plots import label_line_ends as _label_line_ends, variant_styles

    fig, ax = plt.subplots()
    ax.set_yscale("log")
    ends = [(1024.0, 0.0101 + 0.0001 * i, f"variant-{i}", "black") for i in range(8)]  # eight lines ending together
    _label_line_ends(ax, ends)
    heights = sorted(math.log10(text.xyann[1]) for text in ax.texts)
    assert len(heights) == 8 and all(b - a >= 0.07 - 1e-9 for a, b in zip(heights, heights[1:]))
    plt.close(fig)
    names = sorted(f"variant-{i}" for i in range(40))
    styles = variant_styles(names)
    assert len(set(styles.values())) == 40 and len({styles[n][0] for n in names[:14]}) == 14  # colours first
    assert len({style[0] for style in variant_styles(list(BUILTINS)).values()}) == len(BUILTINS)  # the built-ins
    assert variant_styles(["windowed", "linear"])["linear"] == variant_styles(["linear", "windowed"])["linear"]
    every = variant_styles(list(BUILTINS))  # a built-in looks the same on a board of a few of them (the long board)
    assert all(variant_styles(list(BUILTINS)[::3] + ["third-party"])[v] == every[v] for v in list(BUILTINS)[::3])


def test_targets_are_judged_in_both_directions_and_older_cards_without_at_least_still_read():
    from zoo.leaderboard import _target_rows

    where = {"variant": "v", "mode": "full", "phase": "fwd", "versus": ""}
    results = pd.DataFrame([{**where, "check": "peak-fraction", "n": 16384, "value": 0.55},
                            {**where, "check": "peak-fraction", "n": 4096, "value": 0.3},
                            {**where, "check": "time-ratio", "versus": "torch-sdpa", "n": 16384, "value": 0.05}])
    target = {"mode": "full", "phase": "fwd", "n": 16384, "note": ""}
    cards = {"v": {"card": {"targets": [
        {**target, "check": "peak-fraction", "at_most": None, "at_least": 0.4},
        {**target, "check": "peak-fraction", "at_most": None, "at_least": 0.6},
        {**target, "check": "peak-fraction", "at_most": None, "at_least": 0.4, "n": None},
        {**target, "check": "x-torch-sdpa", "at_most": 0.0667},  # recorded before at_least and versus existed
        {**target, "check": "time-ratio", "versus": "torch-sdpa", "at_most": 0.04, "at_least": None},
        {**target, "check": "backward-cost", "at_most": 3}]}}}
    from zoo.board import Board
    from zoo.leaderboard import registered_suites

    rows = _target_rows(Board("r", {}, {}, results, pd.DataFrame(), cards, registered_suites()))
    assert [(r["goal"], r["verdict"]) for r in rows] == [
        ("at least 0.4", "met"), ("at least 0.6", "not met"), ("at least 0.4", "not met"),
        ("at most 0.0667", "met"), ("at most 0.04", "not met"),
        ("at most 3", "not measured in this run")]
    assert rows[2]["measured"] == "n=16384: 0.55, n=4096: 0.3"


def test_a_target_whose_figure_interval_spans_the_goal_is_judged_within_noise_not_met_or_missed():
    from zoo.board import Board
    from zoo.leaderboard import _target_rows, registered_suites

    where = {"variant": "v", "mode": "full", "phase": "fwd", "versus": "torch-sdpa", "check": "time-ratio"}
    results = pd.DataFrame([{**where, "n": 256, "value": 1.08, "low": 1.01, "high": 1.12},  # spans 1.05
                            {**where, "n": 512, "value": 1.02, "low": 0.98, "high": 1.04},  # all within
                            {**where, "n": 1024, "value": 1.2, "low": 1.1, "high": 1.3}])  # all beyond
    target = {"mode": "full", "phase": "fwd", "note": "", "check": "time-ratio", "versus": "torch-sdpa"}
    cards = {"v": {"card": {"targets": [{**target, "n": n, "at_most": 1.05, "at_least": None} for n in (256, 512, 1024)]
                            + [{**target, "n": None, "at_most": 1.05, "at_least": None}]}}}
    rows = _target_rows(Board("r", {}, {}, results, pd.DataFrame(), cards, registered_suites()))
    assert [r["verdict"] for r in rows] == ["within noise", "met", "not met", "not met"]
    assert rows[0]["measured"] == "n=256: 1.08 [1.01-1.12]"


def test_each_variant_is_shown_against_its_best_known_implementation_and_flagged_when_behind():
    from zoo.board import Board, best_known_rows
    from zoo.leaderboard import registered_suites

    def ratio(variant, versus, n, value, low):
        return {"variant": variant, "check": "time-ratio", "mode": "full", "phase": "fwd+bwd", "versus": versus,
                "n": n, "value": value, "low": low}

    results = pd.DataFrame([ratio("a", "fast-form", 256, 1.02, 0.98), ratio("a", "fast-form", 1024, 1.3, 1.2),
                            ratio("b", "torch-sdpa", 256, 1.08, 1.01), ratio("b", "other", 256, 9.0, 9.0),
                            ratio("c", "torch-sdpa", 256, 2.0, 2.0)])
    cards = {"a": {"card": {"best_known": "fast-form"}}, "b": {"card": {"best_known": "torch-sdpa"}}, "c": {"card": {}}}
    board = Board("r", {}, {}, results, pd.DataFrame(), cards, registered_suites())
    rows, undeclared = best_known_rows(board, "time-ratio", ("fwd", "fwd+bwd"), [256, 1024])
    assert undeclared == ["c"]
    assert [(r["variant"], r["best known"], r["pass"], r["n=256"], r["n=1024"], r["verdict"]) for r in rows] == [
        ("a", "fast-form", "fwd+bwd", "1.02x", "1.3x behind", "behind at n=1024"),
        ("b", "torch-sdpa", "fwd+bwd", "1.08x behind?", "", "behind at n=256?")]
    # a ratio no second process or run measured is unconfirmed however tight its rounds (the speed suite's rule)
    alone, _ = best_known_rows(board, "time-ratio", ("fwd", "fwd+bwd"), [256, 1024],
                               lambda variant, mode, phase, n, versus: False)
    assert alone[0]["n=1024"] == "1.3x behind?" and alone[0]["verdict"] == "behind at n=1024?"
    from zoo.suites.speed import _confirmed

    assert not _confirmed(board, "a", "full", "fwd+bwd", 1024, "fast-form")  # no time-between row, no reruns
    spread = {**ratio("a", "fast-form", 1024, 0.03, None), "check": "time-between"}
    board = Board("r", {}, {}, pd.concat([results, pd.DataFrame([spread])]), pd.DataFrame(), cards,
                  registered_suites())
    assert _confirmed(board, "a", "full", "fwd+bwd", 1024, "fast-form")  # three processes' medians: confirmed


def _timed_run(tmp_path, comparator_times=(None, None, None)):
    """A stored run of three checked cores timed in three processes: a and b within each other's interval, c
    clear of both; b's interval is wide. ``comparator_times``: torch SDPA's time in each one's job (s)."""
    from zoo.profiles import get_profile
    from zoo.store import Store

    profile = get_profile("smoke").with_overrides(processes=3)
    store = Store(tmp_path / "results.sqlite")
    run = store.start_run(profile.as_dict(), {"device": "cpu"}, "2026-01-01 00:00:00")
    n = profile.of("speed").reference_length
    where = {"n": n, "mode": "full", "phase": "fwd+bwd"}
    cells = {"a": (0.90, 0.88, 0.93), "b": (0.92, 0.80, 1.05), "c": (1.40, 1.38, 1.41)}
    for (variant, (ratio, low, high)), comparator in zip(cells.items(), comparator_times):
        store.record_job(run, variant, "correctness", "done", 1.0, {"card": {"kind": "core"}},
                         [{"check": "reference", "status": "passed"}])
        store.record_job(run, variant, "speed", "done", 1.0, {"card": {"kind": "core"}}, [
            *([{"check": "time", "status": "measured", "value": comparator, "low": comparator, "high": comparator,
                "versus": "torch-sdpa", **where}] if comparator else []),
            {"check": "time", "status": "measured", "value": ratio * 1e-3, "low": low * 1e-3, "high": high * 1e-3,
             "samples": [ratio * 1e-3] * 6, **where},
            {"check": "time-ratio", "status": "measured", "value": ratio, "low": low, "high": high,
             "versus": "torch-sdpa", **where},
            {"check": "time-between", "status": "measured", "value": (high - low) / ratio, "versus": "torch-sdpa",
             **where},
            {"check": "time-between", "status": "measured", "value": 0.01, **where}])
    return store, run


def test_overlapping_intervals_tie_a_wide_one_is_marked_and_the_board_states_its_reproducibility(tmp_path):
    from zoo.board import Board
    from zoo.leaderboard import registered_suites
    from zoo.ranking import ranked_tables

    store, run = _timed_run(tmp_path)
    tables, unranked = ranked_tables(Board.of(store, run, registered_suites()))
    assert unranked == [] and [(row["variant"], row["rank"]) for row in tables["core"]] == [("a", 1), ("b", 1), ("c", 3)]
    column = next(key for key in tables["core"][0] if key.startswith("time / torch SDPA, fwd+bwd"))
    assert [row[column] for row in tables["core"]] == ["0.9x [0.88-0.93]", "0.92x [0.8-1.05] (varies)",
                                                       "1.4x [1.38-1.41]"]
    from zoo.leaderboard import render

    readme = render(store, run, tmp_path / "board")[0].read_text()
    assert ("Reproducibility: each cell was timed in 3 fresh processes" in readme
            and "2 of 6 of these figures have one reaching farther than 0.05 of their value from them" in readme), readme  # b


def test_a_board_timing_longer_sequences_than_it_ranks_at_answers_for_the_longest_at_that_length(tmp_path):
    """Ranked at the reference length, a board that also timed longer sequences answers 'the longest sequences
    timed' from the ratios measured there (b, slower at the reference length, is faster at the longest)."""
    from zoo.board import Board
    from zoo.leaderboard import registered_suites
    from zoo.profiles import get_profile
    from zoo.ranking import advice, ranked_tables
    from zoo.store import Store

    profile = get_profile("smoke")
    store = Store(tmp_path / "results.sqlite")
    run = store.start_run(profile.as_dict(), {"device": "cpu"}, "2026-01-01 00:00:00")
    n = profile.of("speed").reference_length
    for variant, ratios in {"a": {n: 0.5, 4 * n: 0.9}, "b": {n: 0.8, 4 * n: 0.2}}.items():
        store.record_job(run, variant, "correctness", "done", 1.0, {"card": {"kind": "core"}},
                         [{"check": "reference", "status": "passed"}])
        store.record_job(run, variant, "speed", "done", 1.0, {"card": {"kind": "core"}}, [
            row for length, ratio in ratios.items() for row in (
                {"check": "time", "status": "measured", "value": ratio * 1e-3, "n": length, "mode": "full",
                 "phase": "fwd+bwd"},
                {"check": "time-ratio", "status": "measured", "value": ratio, "low": ratio, "high": ratio,
                 "versus": "torch-sdpa", "n": length, "mode": "full", "phase": "fwd+bwd"})])
    board = Board.of(store, run, registered_suites())
    tables, _ = ranked_tables(board)
    answers = {a.use: a.picks[0].variant for a in advice(board, tables)}
    assert answers[f"non-causal training and encoding at n={n}"] == "a"
    assert answers[f"the longest sequences timed, n={4 * n}"] == "b"


def test_an_own_time_carries_the_machines_drift_over_the_run_and_a_ratio_does_not(tmp_path):
    """torch SDPA, timed beside each of three variants in its own job, landing 30% apart marks a's own time (its
    processes agreed within 6%) varies, not its ratio; SDPA landing within 2% leaves a's time unmarked."""
    from zoo.board import Board
    from zoo.leaderboard import registered_suites, render
    from zoo.suites.speed import _varies

    for times, drifted in (((1e-3, 1.3e-3, 1e-3), True), ((1e-3, 1.02e-3, 1e-3), False)):
        folder = tmp_path / str(drifted)
        folder.mkdir()
        store, run = _timed_run(folder, times)
        board = Board.of(store, run, registered_suites())
        n = board.settings_of("speed").reference_length
        assert _varies(board, "a", "full", "fwd+bwd", n) is drifted
        assert not _varies(board, "a", "full", "fwd+bwd", n, "torch-sdpa")
        assert _varies(board, "b", "full", "fwd+bwd", n, "torch-sdpa")  # its own interval is wide either way
        readme = render(store, run, folder / "board")[0].read_text()
        assert f"landed apart by (largest - smallest) / median {0.3 if drifted else 0.02:g} (median" in readme, readme
        own = r"\| a +\| full +\| fwd\+bwd +\| torch-sdpa +\| 0\.9 ms " + (r"varies " if drifted else "") + r"\(0\.9x\)"
        assert re.search(own, readme), readme


def test_the_drift_takes_each_version_of_a_comparator_call_relative_to_its_own_median(tmp_path):
    """A board showing jobs of a form-1 run and of a form-2 run: nn.MultiheadAttention's causal call, which form 2
    changed (1.3 ms each time before, 1.0, 1.1 and 1.0 ms after), drifted 1.0-1.1 within each version, not by the
    two calls' difference; torch SDPA's call, the same in both forms, drifted over all six jobs."""
    from zoo.board import Board
    from zoo.contract import MHA, SDPA
    from zoo.leaderboard import registered_suites
    from zoo.profiles import get_profile
    from zoo.store import Store

    profile = get_profile("smoke").with_overrides(processes=3)
    store = Store(tmp_path / "results.sqlite")
    n = profile.of("speed").reference_length
    for started, environment, times in (("2026-01-01 00:00:00", {"device": "cpu"}, {"a": 1.3, "b": 1.3, "c": 1.3}),
                                        ("2026-01-02 00:00:00", {"device": "cpu", "timing_form": "2"},
                                         {"d": 1.0, "e": 1.1, "f": 1.0})):
        run = store.start_run(profile.as_dict(), environment, started)
        for variant, milliseconds in times.items():
            store.record_job(run, variant, "speed", "done", 1.0, {"card": {"kind": "layer"}}, [
                {"check": "time", "status": "measured", "value": milliseconds * 1e-3, "versus": versus, "n": n,
                 "mode": mode, "phase": "fwd+bwd"} for versus, mode in ((MHA, "causal"), (SDPA, "full"))])
    board = Board.of(store, run, registered_suites())
    assert set(board.rows("speed").variant) == set("abcdef")

    def drift(versus, mode):
        return tuple(round(end, 6) for end in board.drift("speed", "time", [versus], mode, "fwd+bwd", n))

    assert drift(MHA, "causal") == (1.0, 1.1)
    assert drift(SDPA, "full") == (round(1.0 / 1.2, 6), round(1.3 / 1.2, 6))  # over the median of all six, 1.2 ms


def _png(pixels) -> bytes:
    import io

    import numpy as np
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.asarray(pixels, dtype=np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def test_a_plot_drawn_again_from_the_same_runs_keeps_the_committed_bytes(tmp_path):
    """Another machine's rounding moves a few anti-aliased pixels by a level: the folder's plot stays as it was.
    A plot whose drawing changed (a point moved, another size), or none in the folder, takes the new bytes."""
    import numpy as np

    from zoo.leaderboard import _as_drawn_before

    committed = np.full((100, 100, 3), 255, dtype=np.uint8)
    committed[40:50, 40:50] = (31, 119, 180)
    path = tmp_path / "time.png"
    path.write_bytes(_png(committed))
    rounded = committed.copy()
    rounded[45, 50] -= 1  # one anti-aliased pixel a level darker
    assert _as_drawn_before(path, _png(rounded)) == path.read_bytes()
    moved = np.full_like(committed, 255)
    moved[41:51, 40:50] = (31, 119, 180)  # the point one pixel lower
    assert _as_drawn_before(path, _png(moved)) == _png(moved)
    assert _as_drawn_before(path, _png(committed[:90])) == _png(committed[:90])
    assert _as_drawn_before(tmp_path / "none.png", _png(rounded)) == _png(rounded)
    (tmp_path / "broken.png").write_bytes(b"not a picture")
    assert _as_drawn_before(tmp_path / "broken.png", _png(rounded)) == _png(rounded)


def test_which_should_i_use_offers_no_approximation_over_its_error_ceiling_and_says_which_it_passed_over(monkeypatch):
    """The fastest approximation is offered only when its error is measured and within the ceiling; otherwise the
    answer names it, its figure and why it is not offered, and offers the best one within."""
    import zoo.ranking as ranking
    from zoo.suite import Axis

    def figures(ratio, error):
        return {"time": Axis("time", ratio, "lower", f"{ratio}x", use="training"),
                "error": Axis("error", error, "lower", "not measured" if error is None else f"{error}", ceiling=0.5)}

    known = {"exact": figures(0.6, 0.0), "loose": figures(0.2, 0.93), "close": figures(0.4, 0.3),
             "unknown": figures(0.1, None)}

    def answer(variants):
        monkeypatch.setattr(ranking, "figures_of", lambda board, names: {v: known[v] for v in names})
        rows = [{"variant": v, "class": "exact" if v == "exact" else "approximates softmax"} for v in variants]
        [one] = ranking.advice(None, {"core": rows})
        return [pick.variant for pick in one.picks], one.passed_over

    assert answer(["exact", "loose", "close", "unknown"]) == (
        ["exact", "close"], "unknown (0.1x): error: not measured (its ceiling: 0.5)")
    assert answer(["exact", "loose"]) == (["exact"], "loose (0.2x): error: 0.93, over its ceiling of 0.5")
    assert answer(["exact", "close"]) == (["exact", "close"], "")


def test_which_should_i_use_names_the_top_value_as_the_best_and_the_variants_tied_with_a_pick(monkeypatch):
    """A cost names the variant with the top value (not the first of those within the tie), and is a cost only
    beyond the tie; a pick names the others it does not beat on its figure."""
    import zoo.ranking as ranking
    from zoo.suite import Axis

    def figures(exponent, quality):
        return {"exponent": Axis("exponent", exponent, "lower", f"{exponent:.2f}", use="long", tie=0.05),
                "quality": Axis("quality", quality, "higher", f"{quality:.3f}", tie=0.02)}

    known = {"first": figures(1.0, 0.70), "second": figures(1.02, 0.715), "third": figures(1.0, 0.60),
             "steep": figures(2.0, 0.90)}
    monkeypatch.setattr(ranking, "figures_of", lambda board, names: {v: known[v] for v in names})
    rows = [{"variant": v, "class": "exact"} for v in known]
    [one] = ranking.advice(None, {"core": rows})
    [pick] = one.picks
    assert (pick.variant, pick.tied) == ("first", ["second", "third"])
    assert pick.costs == ["quality: 0.700 (the best: steep, 0.900)"]
    assert "tied on it with second, third" in one.sentence()
    known["steep"] = figures(2.0, 0.71)  # within the tie of the pick's 0.70: no cost; 0.715 is the top value
    [one] = ranking.advice(None, {"core": rows})
    assert one.picks[0].costs == []
    known["first"], known["steep"] = figures(1.0, 0.60), figures(2.0, 0.73)  # 0.73 ties 0.715, ranked after it
    [one] = ranking.advice(None, {"core": rows})
    assert one.picks[0].costs == ["quality: 0.600 (the best: steep, 0.730)"]


def test_which_should_i_use_also_names_the_best_that_keeps_a_cost_within_its_keep_of_the_top(monkeypatch):
    """A reader who will not give up quality gets a second pick: the fastest within the keep of the best quality,
    approximations over their ceiling still not offered; none when the first pick already keeps it."""
    import zoo.ranking as ranking
    from zoo.suite import Axis

    def figures(ratio, quality, error=0.0):
        return {"time": Axis("time", ratio, "lower", f"{ratio}x", use="training"),
                "quality": Axis("quality", quality, "higher", f"{quality:.3f}", tie=0.02, keep=0.05),
                "error": Axis("error", error, "lower", f"{error}", ceiling=0.5)}

    known = {"fast": figures(0.5, 0.60), "kept": figures(0.8, 0.85), "best": figures(1.0, 0.89),
             "loose": figures(0.7, 0.88, error=0.9)}
    monkeypatch.setattr(ranking, "figures_of", lambda board, names: {v: known[v] for v in names})
    rows = [{"variant": v, "class": "exact" if v != "loose" else "approximates softmax"} for v in known]
    [one] = ranking.advice(None, {"core": rows})
    assert [(pick.variant, pick.keeping) for pick in one.picks] == [
        ("fast", ""), ("kept", "quality within 0.05 of the best")]
    assert "; or keeping quality within 0.05 of the best, kept (exact: 0.8x), at a cost: quality: 0.850" in one.sentence()
    known["fast"] = figures(0.5, 0.86)
    [one] = ranking.advice(None, {"core": rows})
    assert [pick.variant for pick in one.picks] == ["fast"]


def test_figures_whose_intervals_overlap_are_tied_in_the_answers_as_the_ranking_ties_them():
    from zoo.suite import Axis

    a = Axis("t", 0.60, "lower", "", low=0.575, high=0.64)
    b = Axis("t", 0.68, "lower", "", low=0.625, high=0.729)
    c = Axis("t", 0.80, "lower", "", low=0.773, high=0.815)
    assert not a.beats(b) and not b.beats(a) and a.beats(c) and b.beats(c) and not c.beats(a)
    apart = Axis("t", 0.60, "lower", "", low=0.575, high=0.616)
    assert apart.beats(b) and not Axis("t", 0.60, "lower", "", low=0.575, high=0.625).beats(b)  # touching: tied
    assert Axis("t", 0.60, "lower", "").beats(Axis("t", 0.68, "lower", "", low=0.62, high=0.73))  # one interval only


def test_the_accuracy_plot_draws_each_ratios_interval_as_a_bar(monkeypatch):
    """The scatter shows the noise of its x: each variant's interval, from low to high, as a horizontal bar."""
    from matplotlib.collections import LineCollection

    import zoo.plots as plots_
    from zoo.suites.quality import _pareto_plot

    drawn = []
    monkeypatch.setattr(plots_, "save", lambda plt, fig, name: drawn.append(fig) or (name, b""))
    x, y = pd.Series({"a": 0.5, "b": 1.0}), pd.Series({"a": 0.7, "b": 0.9})
    _pareto_plot(x, y, "time", "accuracy", "p.png", spread={"a": (0.4, 0.6), "b": (0.9, 1.2)}, palette=("a", "b"))
    bars = sorted(tuple(segment[:, 0]) for c in drawn[0].axes[0].collections if isinstance(c, LineCollection)
                  for segment in c.get_segments())
    assert bars == [(0.4, 0.6), (0.9, 1.2)]


def test_the_committed_boards_measured_each_built_in_on_the_plugin_file_installed_here():
    """The board takes a variant's newest job as its current source and never reads the plugin file, so a plugin
    edited without measuring it again would leave the committed boards showing the old file's figures as
    today's. Every job a committed board shows of a built-in (its newest of each suite among the runs of the
    board's settings and machine: a run elsewhere does not count) must have measured the file here."""
    from pathlib import Path

    import zoo
    from zoo.board import board_rows
    from zoo.folder import BoardFolder
    from zoo.leaderboard import board_run
    from zoo.registry import source_hash

    registry = zoo.load_registry()
    installed = {name: source_hash(registry.variant(name).origin.location) for name in BUILTINS}
    root = Path(__file__).resolve().parent.parent
    folders = [path.parent for path in sorted((root / "leaderboard").rglob("runs.jsonl"))]
    assert {root / "leaderboard", root / "leaderboard" / "long-sequences"} <= set(folders)
    outdated = []
    for folder in folders:
        store = BoardFolder(folder).for_reading()
        shown, held = board_run(store)
        jobs = board_rows(store, shown, frozenset(held) - {shown})[1]
        jobs = jobs[jobs.variant.isin(installed)]
        assert len(jobs) >= 4 * jobs.variant.nunique() > 0, folder  # every built-in there, in most suites
        outdated += [f"{folder.relative_to(root)}: {job.variant}'s {job.suite} (run {job.run_id}) measured source "
                     f"{job.provenance.get('source_sha256')}, the installed file's is {installed[job.variant]} "
                     f"(scripts/measure-again {job.variant}, on the board's machine)"
                     for job in jobs.itertuples() if job.provenance.get("source_sha256") != installed[job.variant]]
    assert not outdated, "\n".join(outdated)


def test_every_variant_on_a_committed_board_is_shown_in_each_of_its_suites():
    """A board shows, per suite, the runs with that suite's settings: measuring a few variants again after a suite's
    settings changed leaves the section with those few (the long board's inference section once lost nine of its
    thirteen that way). Every variant a committed board holds has rows of every suite the board shows (a carried
    suite, quality, takes each variant's latest rows on its source from any run instead)."""
    from pathlib import Path

    import zoo
    from zoo.board import board_rows
    from zoo.folder import BoardFolder
    from zoo.leaderboard import board_run

    carried = {name: suite.carried for name, suite in zoo.load_registry().suites.items()}
    root = Path(__file__).resolve().parent.parent
    missing = []
    for folder in [path.parent for path in sorted((root / "leaderboard").rglob("runs.jsonl"))]:
        store = BoardFolder(folder).for_reading()
        shown, held = board_run(store)
        jobs = board_rows(store, shown, frozenset(held) - {shown})[1]
        everyone = set(jobs.variant)
        missing += [f"{folder.relative_to(root)}: no {suite} rows of {', '.join(sorted(everyone - set(group.variant)))}"
                    for suite, group in jobs.groupby("suite") if not carried[suite] and everyone - set(group.variant)]
    assert not missing, "\n".join(missing)


def test_an_unranked_variants_page_gives_the_command_that_measures_it_again(registry, tmp_path):
    """Failing or never checked, the page's standing ends with the command that measures what keeps it out: the
    blocking suites of a variant that fails, the required suite of one that was never checked."""
    from zoo.board import Board
    from zoo.profiles import get_profile
    from zoo.ranking import why_unranked
    from zoo.store import Store

    store = Store(tmp_path / "results.sqlite")
    run = store.start_run(get_profile("smoke").as_dict(), {"device": "cpu"}, "2026-01-01 00:00:00")
    for variant, suite, status in [("dot-product", "correctness", "failed"), ("linear", "speed", "measured")]:
        store.record_job(run, variant, suite, "done", 1.0, {"card": registry.variant(variant).card()},
                         [{"check": "x", "status": status, "detail": "off by 1"}])
    board = Board.of(store, run, registry.suites)
    failing, unchecked = why_unranked(board, "dot-product"), why_unranked(board, "linear")
    assert failing.startswith("correctness/x: off by 1; to measure it again: "
                              "zoo run dot-product --suite correctness")
    assert unchecked.startswith("the correctness suite has not run on it with these settings; run it with: "
                                "zoo run linear --suite correctness")


def test_a_variant_page_gives_each_option_and_the_value_the_quality_suite_trains_with(registry):
    from zoo.leaderboard import _options_text

    card = registry.variant("windowed").card()
    trained = card["quality_options"]["window"]
    assert _options_text(card)["window"] == f"{card['options']['window']} (the quality suite trains with {trained})"
    assert _options_text(registry.variant("dot-product").card()) == {}


def test_a_target_on_a_measure_no_suite_takes_says_so_instead_of_waiting_for_a_run(registry, tmp_path):
    """A typo in a Target's check would read 'not measured in this run' on every board: it is named instead."""
    import dataclasses

    import zoo
    from zoo.board import Board
    from zoo.leaderboard import _target_rows
    from zoo.profiles import get_profile
    from zoo.store import Store

    variant = dataclasses.replace(registry.variant("linear"), targets=(
        zoo.Target("tiem-ratio", at_most=1.0, versus="torch-sdpa", n=64, note="typo"),
        zoo.Target("time-ratio", at_most=1.0, versus="torch-sdpa", n=64, note="not run")))
    store = Store(tmp_path / "results.sqlite")
    run = store.start_run(get_profile("smoke").as_dict(), {"device": "cpu"}, "2026-01-01 00:00:00")
    store.record_job(run, "linear", "correctness", "done", 1.0, {"card": variant.card()},
                     [{"check": "reference-float64", "status": "passed"}])
    verdicts = {row["target"]: row["verdict"] for row in _target_rows(Board.of(store, run, registry.suites))}
    assert verdicts == {"typo": "never measured: no suite on this board measures 'tiem-ratio'",
                        "not run": "not measured in this run"}
