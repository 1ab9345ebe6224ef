"""The leaderboard can be trusted under real conditions: partial results render, only checked variants
rank, non-finite outputs are errors, and cores and layers are ranked against their own kind of op."""

import json

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import good_plugin, run_zoo, zoo_here
from zoo.board import fmt_x
from zoo.environment import machine_text
from zoo.leaderboard import registered_suites, render
from zoo.ranking import gate
from zoo.store import Store

LEAKY = good_plugin("leaky", causal="False")

NAN_WHEN_LONG = good_plugin("nanlong", before="""
    if query.shape[1] > 64:
        return query * float('nan')""")


SIGMOID = """
import torch
import zoo
from torch import nn
from zoo.functional import merge_heads, split_heads


class Sigmoid(nn.Module):
    def __init__(self, d_model, num_heads=1):
        super().__init__()
        self.num_heads = num_heads

    def forward(self, query, key, value, attn_mask=None, is_causal=False):
        q, k, v = (split_heads(x, self.num_heads) for x in (query, key, value))
        weights = torch.sigmoid(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5)
        return merge_heads((weights.tril() if is_causal else weights) @ v)


def reference(module, query, key, value, attn_mask=None, is_causal=False):
    out = []
    for i in range(query.shape[1]):  # one query at a time, by the definition
        seen = slice(0, i + 1) if is_causal else slice(None)
        q, k, v = (x.double().unflatten(-1, (module.num_heads, -1)) for x in (query[:, i], key[:, seen], value[:, seen]))
        weights = torch.sigmoid(torch.einsum("bhd,bjhd->bhj", q, k) / q.shape[-1] ** 0.5)
        out.append(torch.einsum("bhj,bjhd->bhd", weights, v).flatten(1))
    return torch.stack(out, dim=1) if out else value.double().new_zeros(query.shape[0], 0, value.shape[-1])


@zoo.hookimpl
def zoo_register_variants(register):
    register(zoo.Variant(name="sigmoid", summary="Sigmoid attention: exact for its own function.", family="sigmoid",
                         citation="Ramapuram et al. 2024", factory=Sigmoid, reference=reference,
                         tags=zoo.Tags(accepts_attn_mask=False), complexity=zoo.Complexity(time=2, memory=2)))
"""

MEAN_OF_VALUES = """
import zoo
from twins import MeanOfValues, mean_reference


@zoo.hookimpl
def zoo_register_variants(register):
    register(zoo.Variant(name="mean-of-values", summary="Claims to approximate softmax; returns mean(V).",
                         family="test", citation="none", factory=MeanOfValues, reference=mean_reference,
                         approximates="softmax", tags=zoo.Tags(accepts_attn_mask=False, allows_different_lengths=False),
                         complexity=zoo.Complexity(time=1, memory=1)))
"""


def _leaderboard(out) -> str:
    return (out / "README.md").read_text()


def _ranked_tables(readme: str) -> str:
    return readme.split("## Leaderboard", 1)[1].split("## Capabilities", 1)[0].split("### Not ranked", 1)[0] \
        .split("### Unranked", 1)[0].split("### Results of an older source", 1)[0]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_subset_of_a_real_runs_rows_renders(smoke_run, tmp_path_factory, data):
    store, run_id = smoke_run
    rows = store.results(run_id)
    keep = data.draw(st.lists(st.booleans(), min_size=len(rows), max_size=len(rows)))
    subset = rows[pd.Series(keep, index=rows.index)]
    jobs = store.jobs(run_id)
    target = Store(tmp_path_factory.mktemp("subset") / "results.sqlite")
    copy = target.start_run(store.settings(run_id), store.environment(run_id), "2026-01-01 00:00:00")
    for job in jobs.itertuples():
        mine = subset[(subset.variant == job.variant) & (subset.suite == job.suite)]
        records = [{k: (None if pd.isna(v) else v) if not isinstance(v, list) else v for k, v in r.items()}
                   for r in mine.drop(columns=["variant", "suite"]).to_dict("records")]
        target.record_job(copy, job.variant, job.suite, job.status, job.seconds, job.provenance, records)
    readme = render(target, copy, tmp_path_factory.mktemp("board"))[0].read_text()
    assert "## Leaderboard" in readme and "## Speed" in readme


def test_a_real_run_ranks_cores_against_sdpa_and_layers_against_multihead_attention(smoke_run, tmp_path):
    store, run_id = smoke_run
    readme = render(store, run_id, tmp_path)[0].read_text()
    cores = readme.split("### Attention cores", 1)[1].split("###", 1)[0]
    layers = readme.split("### Attention layers", 1)[1].split("##", 1)[0]
    assert "time / torch SDPA, fwd+bwd, n=256" in cores and "dot-product" in cores and "linear" in cores
    assert "time / nn.MultiheadAttention, fwd+bwd, n=256" in layers and "multi-head" in layers
    assert "multi-head" not in cores and "dot-product" not in layers
    linear = next(line for line in cores.splitlines() if "| linear" in line)
    assert "approx. of softmax: error 0." in linear  # an approximation's speed beside its cost in accuracy
    speed = readme.split("## Speed", 1)[1].split("###", 1)[0]
    assert all("; approx. error 0." in line for line in speed.splitlines() if line.startswith("| linear") and "| fwd " in line)
    assert "Noise on this board:" in readme
    departures = readme.split("## Departures from the papers", 1)[1].split("\n## ", 1)[0]
    rows = [[cell.strip() for cell in line.split("|")[1:-1]] for line in departures.splitlines() if line.startswith("| ")]
    assert ["multi-head", "extension"] in [r[:2] for r in rows]
    assert {r[0] for r in rows[1:]} == {"dot-product", "linear", "multi-head"}  # every variant of the run states some


def test_a_speed_only_run_of_a_causal_leaking_plugin_is_not_ranked(write_plugin, tmp_path):
    plugins = write_plugin("leaky", LEAKY)
    done = run_zoo("run", "leaky", "--suite", "speed", "--profile", "smoke", "--plugins-dir", plugins, "--out", tmp_path)
    assert done.returncode == 0, done.stderr
    readme = _leaderboard(tmp_path)
    assert "leaky" not in _ranked_tables(readme)
    assert "- leaky" in readme.split("### Unranked: correctness not run", 1)[1]
    # and with the correctness suite it is caught, not merely unranked
    done = run_zoo("run", "leaky", "--suite", "correctness", "--profile", "smoke", "--plugins-dir", plugins,
                   "--out", tmp_path)
    store = Store(tmp_path / "results.sqlite")
    standing = gate(store.results(store.latest_run()))["leaky"]
    assert not standing.ranked and any("causal" in reason for reason in standing.reasons)


def test_a_plugin_returning_nan_for_long_inputs_is_an_error_and_not_ranked(write_plugin, tmp_path):
    plugins = write_plugin("nanlong", NAN_WHEN_LONG)
    done = run_zoo("run", "nanlong", "--profile", "smoke", "--plugins-dir", plugins, "--out", tmp_path)
    assert done.returncode == 0, done.stderr
    store = Store(tmp_path / "results.sqlite")
    results = store.results(store.latest_run())
    errors = results[(results.check == "finite-output") & (results.status == "error")]
    assert set(errors.suite) == {"speed", "complexity"} and set(errors.n) == {128, 256}
    assert not gate(results)["nanlong"].ranked
    readme = _leaderboard(tmp_path)
    assert "nanlong" not in _ranked_tables(readme) and "speed/finite-output" in readme


def test_the_correctness_suite_cannot_be_blocked(tmp_path):
    done = run_zoo("run", "dot-product", "--profile", "smoke", "--suite", "correctness", "--out", tmp_path,
                   env={"ZOO_BLOCK_PLUGINS": "correctness"})
    assert done.returncode == 0, done.stderr
    assert "one of the zoo's own suites, part of the harness, and was not blocked" in done.stderr
    store = Store(tmp_path / "results.sqlite")
    assert gate(store.results(store.latest_run()))["dot-product"].ranked


def test_under_load_every_planned_length_is_timed_for_the_variants_and_sdpa(tmp_path):
    """Both cores kept busy by other processes: the plan, not the clock, decides what is measured.
    Asserts what was measured, never how fast."""
    import subprocess
    import sys

    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        done = run_zoo("run", "dot-product", "windowed", "--suite", "speed", "--lengths", "256,512",
                       "--profile", "smoke", "--out", tmp_path)  # smoke: the quick profile's plan rule, smaller shapes
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert done.returncode == 0, done.stderr
    store = Store(tmp_path / "results.sqlite")
    results = store.results(store.latest_run())
    for who, versus in [("dot-product", ""), ("windowed", ""), ("windowed", "torch-sdpa-band"),
                        ("dot-product", "torch-sdpa"), ("windowed", "torch-sdpa")]:
        rows = results[(results.variant == who) & (results.check == "time") & (results.versus == versus)
                       & (results.status == "measured")]
        for phase in ("fwd", "fwd+bwd"):
            assert set(rows[rows.phase == phase].n) == {256, 512}, (who, versus, phase)
    assert (tmp_path / "README.md").exists()


def test_a_plot_an_earlier_run_drew_is_removed_when_this_run_has_none(smoke_run, tmp_path):
    store, run_id = smoke_run
    (tmp_path / "accuracy-vs-speed.png").write_bytes(b"stale")  # this run has no quality suite
    render(store, run_id, tmp_path)
    assert not (tmp_path / "accuracy-vs-speed.png").exists() and (tmp_path / "time.png").exists()


def test_an_approximation_no_better_than_the_mean_of_the_values_is_caught_and_an_exact_non_softmax_is_not_measured(
        write_plugin, tmp_path):
    """mean(V) claims to approximate softmax and its own reference agrees with it; sigmoid attention is exact
    for its own function. The first is unranked by the approximation check, the second ranks as exact."""
    write_plugin("sigmoid", SIGMOID)
    plugins = write_plugin("mean_of_values", MEAN_OF_VALUES)
    done = run_zoo("run", "sigmoid", "mean-of-values", "--suite", "correctness", "--profile", "smoke",
                   "--plugins-dir", plugins, "--out", tmp_path)
    assert done.returncode == 0, done.stderr
    store = Store(tmp_path / "results.sqlite")
    results = store.results(store.latest_run())
    standings = gate(results)
    assert not standings["mean-of-values"].ranked and standings["sigmoid"].ranked, standings
    assert [r for r in standings["mean-of-values"].reasons if r.startswith("correctness/")] and all(
        r.startswith("correctness/approximation: mean normalised error on the easy inputs 1 >= 0.98")
        for r in standings["mean-of-values"].reasons), standings["mean-of-values"].reasons
    sigmoid = results[(results.variant == "sigmoid") & (results.check == "approximation")]
    assert list(sigmoid.status) == ["skipped"], sigmoid  # never measured against softmax
    readme = _leaderboard(tmp_path)
    row = next(line for line in _ranked_tables(readme).splitlines() if "| sigmoid" in line)
    assert "| exact" in row and "approx" not in row
    assert "mean-of-values" not in _ranked_tables(readme)
    assert "no better than each query's mean of the values as an approximation of softmax" in readme


def test_a_run_without_quality_shows_the_latest_trained_accuracy_labelled_with_its_run(tmp_path):
    import zoo

    trained = zoo.run(["dot-product"], suites=["quality"], profile="smoke", out=tmp_path).attrs["run_id"]
    checked = zoo.run(["dot-product"], suites=["correctness"], profile="smoke", out=tmp_path).attrs["run_id"]
    assert checked != trained
    readme = _leaderboard(tmp_path)
    assert f"quality: mean accuracy ± std over seeds (run {trained})" in _ranked_tables(readme)
    assert f"From run {trained} (this run did not train them" in readme
    assert "### Associative recall versus number of pairs" in readme and (tmp_path / "recall-vs-pairs.png").exists()
    page = (tmp_path / "index.html").read_text()
    data = json.loads(page.split('id="board-data">', 1)[1].split("</script>", 1)[0])
    [quality] = [t for t in data["variants"]["dot-product"]["details"] if t["title"] == f"Quality (run {trained})"]
    assert quality["columns"] == ["task", "accuracy", "chance"] and quality["rows"]  # the variant page's quality
    assert all(row["accuracy"][0].isdigit() for row in quality["rows"])


def test_the_board_accumulates_a_partial_run_and_keeps_every_other_variant(
        write_plugin, tmp_path):
    import zoo

    plugins = write_plugin("mine", good_plugin("mine"))
    first = zoo.run(["dot-product", "mine"], suites=["correctness", "complexity"], profile="smoke", out=tmp_path,
                    plugins_dirs=[plugins]).attrs["run_id"]
    second = zoo.run(["mine"], suites=["correctness"], profile="smoke", out=tmp_path,
                     plugins_dirs=[plugins]).attrs["run_id"]
    ranked = _ranked_tables(_leaderboard(tmp_path))
    dot = next(line for line in ranked.splitlines() if "| dot-product" in line)
    mine = next(line for line in ranked.splitlines() if "| mine" in line)
    assert f"| run {first} " in dot and f"| this run and run {first} " in mine  # both still ranked, sources named
    csv = pd.read_csv(tmp_path / "results.csv")
    assert set(csv[csv.variant == "dot-product"].run_id) == {first}
    assert set(csv[(csv.variant == "mine") & (csv.suite == "correctness")].run_id) == {second}


def test_a_run_that_changes_one_suites_settings_keeps_the_other_suites_earlier_rows(tmp_path):
    """Rows of an earlier run stay on the board suite by suite: new complexity lengths keep the earlier correctness
    rows, and the complexity rows of the older lengths leave; another run-wide setting (threads) keeps nothing."""
    import zoo

    first = zoo.run(["dot-product"], suites=["correctness", "complexity"], profile="smoke", out=tmp_path).attrs["run_id"]
    second = zoo.run(["dot-product"], suites=["complexity"], profile="smoke", out=tmp_path,
                     suite_settings={"complexity": {"lengths": (32, 64, 128)}}).attrs["run_id"]
    csv = pd.read_csv(tmp_path / "results.csv")
    assert set(csv[csv.suite == "correctness"].run_id) == {first}
    assert set(csv[csv.suite == "complexity"].run_id) == {second}
    assert f"| this run and run {first} " in _ranked_tables(_leaderboard(tmp_path))

    third = zoo.run(["dot-product"], suites=["complexity"], profile="smoke", out=tmp_path, threads=2,
                    suite_settings={"complexity": {"lengths": (32, 64, 128)}}).attrs["run_id"]
    csv = pd.read_csv(tmp_path / "results.csv")
    assert set(csv.run_id) == {third} and set(csv.suite) == {"complexity"}


def test_a_run_of_one_suite_keeps_the_boards_settings_of_the_suites_it_does_not_measure(tmp_path):
    """The long board's case: complexity measured with its own lengths, then correctness alone without them. The
    second run takes the folder's complexity settings (they change nothing it measures), so the board keeps the
    complexity rows; a run that measures complexity with other lengths replaces them as before."""
    import zoo
    from zoo.store import Store

    lengths = {"complexity": {"lengths": (32, 64, 128)}}
    first = zoo.run(["dot-product"], suites=["complexity"], profile="smoke", out=tmp_path,
                    suite_settings=lengths).attrs["run_id"]
    second = zoo.run(["dot-product"], suites=["correctness"], profile="smoke", out=tmp_path).attrs["run_id"]
    stored = Store(tmp_path / "results.sqlite", readonly=True).settings(second)
    assert stored["suites"]["complexity"]["lengths"] == [32, 64, 128]
    csv = pd.read_csv(tmp_path / "results.csv")
    assert set(csv[csv.suite == "complexity"].run_id) == {first} and set(csv[csv.suite == "correctness"].run_id) == {second}
    other = zoo.run(["dot-product"], suites=["correctness"], profile="smoke", out=tmp_path, threads=2).attrs["run_id"]
    stored = Store(tmp_path / "results.sqlite", readonly=True).settings(other)
    assert stored["suites"]["complexity"]["lengths"] != [32, 64, 128]  # other run-wide settings: nothing borrowed
    third = zoo.run(["dot-product"], suites=["complexity"], profile="smoke", out=tmp_path).attrs["run_id"]
    stored = Store(tmp_path / "results.sqlite", readonly=True).settings(third)
    assert stored["suites"]["complexity"]["lengths"] != [32, 64, 128]  # a suite it measures: its own settings
    assert set(pd.read_csv(tmp_path / "results.csv").query("suite == 'complexity'").run_id) == {third}


def _refresh_command(readme: str, variant: str) -> list[str]:
    """The command the board gives for ``variant``'s rows of an older source, as words."""
    import shlex

    line = next(line for line in readme.split("### Results of an older source", 1)[1].splitlines()
                if line.startswith(f"- **{variant}**"))
    return shlex.split(line.rsplit("`", 2)[1])


def test_rows_of_an_older_source_neither_rank_nor_block_and_the_board_gives_the_command_that_refreshes_them(
        write_plugin, tmp_path):
    import zoo

    plugins = write_plugin("mine", good_plugin("mine"))
    first = zoo.run(["dot-product", "mine"], suites=["correctness", "complexity"], profile="smoke", out=tmp_path,
                    plugins_dirs=[plugins]).attrs["run_id"]
    (plugins / "mine.py").write_text((plugins / "mine.py").read_text() + "\n# edited after it was measured\n")
    zoo.run(["mine"], suites=["correctness"], profile="smoke", out=tmp_path, plugins_dirs=[plugins])
    readme = _leaderboard(tmp_path)
    mine = next(line for line in _ranked_tables(readme).splitlines() if "| mine" in line)
    assert "this run" in [cell.strip() for cell in mine.split("|")]  # ranked on its current source's rows only
    command = _refresh_command(readme, "mine")
    assert f"complexity (run {first})" in readme.split("### Results of an older source", 1)[1]
    assert command[:5] == ["zoo", "run", "mine", "--suite", "complexity"] and "--suite" not in command[5:]
    assert command[command.index("--out") + 1] == str(tmp_path)
    csv = pd.read_csv(tmp_path / "results.csv")
    assert set(csv[csv.variant == "mine"].suite) == {"correctness"}  # the old complexity rows are off the board

    done = run_zoo(*command[1:], "--plugins-dir", plugins)
    assert done.returncode == 0, done.stderr
    readme = _leaderboard(tmp_path)
    assert "### Results of an older source" not in readme
    assert {"correctness", "complexity"} <= set(pd.read_csv(tmp_path / "results.csv").query("variant == 'mine'").suite)

    (plugins / "mine.py").write_text((plugins / "mine.py").read_text() + "\n# edited again\n")
    zoo.run(["mine"], suites=["complexity"], profile="smoke", out=tmp_path, plugins_dirs=[plugins])
    readme = _leaderboard(tmp_path)
    assert "| mine" not in _ranked_tables(readme) and "| dot-product" in _ranked_tables(readme)
    assert "### Unranked: correctness of an older source" in readme
    done = run_zoo(*_refresh_command(readme, "mine")[1:], "--plugins-dir", plugins)
    assert done.returncode == 0, done.stderr
    assert "| mine" in _ranked_tables(_leaderboard(tmp_path))


def test_a_carried_suite_shows_each_variants_current_source_from_another_run_where_the_boards_own_are_stale(
        write_plugin, tmp_path):
    """The board's own quality rows of a variant measured an older source, and a run of other settings (two
    threads where the smoke profile uses one) trained its current one: the board shows that run's, labelled
    with it and its kind of machine, and names nothing to measure again for it; a variant whose every quality run measured an older
    source is still named, with its command."""
    import zoo

    plugins = write_plugin("mine", good_plugin("mine"))
    for name in ("other", "kept"):
        (plugins / f"{name}.py").write_text(good_plugin(name))
    both, every = ["mine", "other"], ["mine", "other", "kept"]
    zoo.run(every, suites=["quality"], profile="smoke", out=tmp_path, plugins_dirs=[plugins])
    for name in both:  # kept's rows stay on its current source: the board has quality rows of its own
        (plugins / f"{name}.py").write_text((plugins / f"{name}.py").read_text() + "\n# edited after it was measured\n")
    retrained = zoo.run(["mine"], suites=["quality"], profile="smoke", out=tmp_path, plugins_dirs=[plugins],
                        threads=2).attrs["run_id"]
    zoo.run(every, suites=["correctness"], profile="smoke", out=tmp_path, plugins_dirs=[plugins])  # the first's board
    readme = _leaderboard(tmp_path)
    quality = readme.split("## Quality", 1)[1]
    rows = {line.split("|")[1].strip() for line in quality.splitlines() if line.startswith("| ")}
    assert {"mine", "kept"} <= rows and "other" not in rows and retrained in quality.split("|", 1)[0]
    away = machine_text(Store(tmp_path / "results.sqlite", readonly=True).environment(retrained))
    assert "2 threads" in away and f" Run {retrained} was on {away}, not this board's kind of machine." in \
        quality.split("|", 1)[0]
    assert ("A variant's quality rows that these runs did not measure on its current source are its latest of that "
            "source from any run") in readme.split("|", 1)[0]  # the board's header says where they come from
    csv = pd.read_csv(tmp_path / "results.csv")
    assert set(csv[(csv.variant == "mine") & (csv.suite == "quality")].run_id) == {retrained}
    assert csv[(csv.variant == "other") & (csv.suite == "quality")].empty
    older = readme.split("### Results of an older source", 1)[1]
    assert "- **other**" in older and "- **mine**" not in older
    assert _refresh_command(readme, "other")[:5] == ["zoo", "run", "other", "--suite", "quality"]


def test_a_refresh_command_sets_only_the_suites_it_runs_and_the_board_keeps_the_others_settings(write_plugin,
                                                                                                  tmp_path):
    """A run refuses a setting of a suite it skips (it would change nothing it measures), so the command a board
    gives sets only the suites it measures; the board's own settings of the others come from the folder."""
    import zoo
    from zoo.contract import OptionError

    plugins = write_plugin("mine", good_plugin("mine"))
    lengths = {"complexity": {"lengths": (32, 64, 128)}}
    with pytest.raises(OptionError, match="--set complexity.lengths: the complexity suite is not in this run"):
        zoo.run(["mine"], suites=["correctness"], profile="smoke", out=tmp_path, plugins_dirs=[plugins],
                suite_settings=lengths)
    assert not (tmp_path / "results.sqlite").exists()  # refused before anything was written
    zoo.run(["mine"], suites=["correctness", "complexity"], profile="smoke", out=tmp_path, plugins_dirs=[plugins],
            suite_settings=lengths)
    (plugins / "mine.py").write_text((plugins / "mine.py").read_text() + "\n# edited after it was measured\n")
    measured = zoo.run(["mine"], suites=["complexity"], profile="smoke", out=tmp_path, plugins_dirs=[plugins],
                       suite_settings=lengths).attrs["run_id"]
    command = _refresh_command(_leaderboard(tmp_path), "mine")
    assert command[:5] == ["zoo", "run", "mine", "--suite", "correctness"] and "--set" not in command
    done = run_zoo(*command[1:], "--plugins-dir", plugins)
    assert done.returncode == 0, done.stderr
    csv = pd.read_csv(tmp_path / "results.csv").query("variant == 'mine'")
    assert set(csv[csv.suite == "complexity"].run_id) == {measured}  # its lengths' rows stay on the board
    assert "### Results of an older source" not in _leaderboard(tmp_path)


def test_held_back_reason_compares_the_cells_both_runs_timed_against_a_stated_rule():
    from zoo.leaderboard import HELD_BACK_FACTOR, HELD_BACK_FLOOR, held_back_reason

    cells = pd.MultiIndex.from_tuples([("a", "full", "fwd", 256), ("a", "full", "fwd", 512), ("b", "full", "fwd", 256)])
    board = pd.Series([0.02, 0.03, 0.02], index=cells)
    assert held_back_reason(board * 2, board) is None  # twice as noisy: a noisier board, not a replaced one
    assert held_back_reason(pd.Series(HELD_BACK_FLOOR * 0.9, index=cells), board * 0.01) is None  # under the floor
    why = held_back_reason(pd.Series([0.5, 0.6, 0.4], index=cells), board)
    assert why and "0.5 (median IQR/median over 3 cells), 25.0x the board's 0.02" in why and f"{HELD_BACK_FACTOR:g}x" in why
    # only the cells both timed count: a quiet cell the board never timed does not hide a noisy shared one
    other = pd.Series([0.6, 0.01, 0.01, 0.01], index=cells[:1].append(pd.MultiIndex.from_tuples(
        [("c", "full", "fwd", n) for n in (1, 2, 3)])))
    assert held_back_reason(other, board) and held_back_reason(pd.Series(dtype=float), board) is None
    # a machine busy for part of the run: the median as quiet as the board's, a tenth of the cells 50x noisier
    many = pd.MultiIndex.from_tuples([("v", "full", "fwd", n) for n in range(20)])
    quiet = pd.Series([0.05] * 20, index=many)
    tail = held_back_reason(pd.Series([0.04] * 17 + [1.0, 1.2, 2.0], index=many), quiet)
    assert tail and "(90th percentile of IQR/median over 20 cells)" in tail
    assert held_back_reason(pd.Series([0.04] * 19 + [2.0], index=many), quiet) is None  # one noisy cell: a note


def _shown_run(readme: str) -> str:
    import re

    return re.search(r"^\| run +\| (\S+)", readme, re.MULTILINE).group(1)


def test_a_run_far_noisier_than_the_board_is_written_beside_it_and_kept(tmp_path, capsys, monkeypatch):
    """A busy machine's run does not replace the board: its own board goes to held-back/, the run stays in the
    store and the export, ``zoo leaderboard`` keeps the board's run and ``--run`` publishes the held one."""
    import zoo
    from zoo import leaderboard

    first = zoo.run(["dot-product"], suites=["speed"], profile="smoke", out=tmp_path).attrs["run_id"]
    measured = leaderboard.run_noise
    monkeypatch.setattr(leaderboard, "run_noise", lambda store, run, suites: measured(store, run, suites) * 0 + (
        0.02 if run == first else 1.0))  # the same cells: the board's spread 2%, the new run's 100%
    warnings = []
    second = zoo.run(["dot-product"], suites=["speed"], profile="smoke", out=tmp_path, warn=warnings.append)
    second = second.attrs["run_id"]
    readme = _leaderboard(tmp_path)
    assert _shown_run(readme) == first
    held = (tmp_path / "held-back" / "README.md").read_text()
    assert _shown_run(held) == second and "this run did not replace its folder's board: its timings spread 1" in held
    assert len(warnings) == 1 and f"run {second} did not replace the board" in warnings[0] and "held-back" in warnings[0]
    exported = {json.loads(line)["run_id"] for line in (tmp_path / "runs.jsonl").read_text().splitlines()}
    assert {first, second} <= exported  # nothing lost

    status, lines = zoo_here(capsys, "leaderboard", "--out", tmp_path)
    assert status == 0 and any(f"run {second} is held back" in line for line in lines)
    assert _shown_run(_leaderboard(tmp_path)) == first
    assert zoo_here(capsys, "leaderboard", "--out", tmp_path, "--run", second)[0] == 0
    assert _shown_run(_leaderboard(tmp_path)) == second

    third = zoo.run(["dot-product"], suites=["correctness"], profile="smoke", out=tmp_path).attrs["run_id"]
    assert _shown_run(_leaderboard(tmp_path)) == third  # a later run's board never takes the held-back rows
    csv = pd.read_csv(tmp_path / "results.csv")
    assert set(csv[csv.suite == "speed"].run_id) == {first} and set(csv[csv.suite == "correctness"].run_id) == {third}


def test_a_noisy_first_run_on_another_kind_of_machine_is_judged_against_the_board_it_would_replace(tmp_path,
                                                                                                    monkeypatch):
    """A fresh clone's run-all on a busy machine of another kind has no earlier run of its machine to be judged by:
    it is judged by the board's cells, held back and kept; a quiet run there replaces the board."""
    import zoo
    from zoo import environment, leaderboard

    measured, here = leaderboard.run_noise, environment.fingerprint
    spreads = [0.02, 1.0, 0.03]  # in the order the runs started: the board's, a busy machine's, a quiet one's
    monkeypatch.setattr(leaderboard, "run_noise", lambda store, run, suites: measured(store, run, suites) * 0 + (
        spreads[list(store.runs().run_id).index(run)]))
    first = zoo.run(["dot-product"], suites=["speed"], profile="smoke", out=tmp_path).attrs["run_id"]
    monkeypatch.setattr(environment, "fingerprint", lambda *args: {**here(*args), "cpu": "Another CPU"})
    warnings = []
    second = zoo.run(["dot-product"], suites=["speed"], profile="smoke", out=tmp_path, warn=warnings.append)
    assert _shown_run(_leaderboard(tmp_path)) == first
    assert len(warnings) == 1 and f"run {second.attrs['run_id']} did not replace the board" in warnings[0]
    assert "50.0x the board's (measured on another kind of machine) 0.02" in warnings[0]
    assert _shown_run((tmp_path / "held-back" / "README.md").read_text()) == second.attrs["run_id"]
    third = zoo.run(["dot-product"], suites=["speed"], profile="smoke", out=tmp_path).attrs["run_id"]
    assert _shown_run(_leaderboard(tmp_path)) == third


def test_the_noise_rule_judges_other_settings_on_the_boards_machine_by_their_own_runs_and_sees_past_untimed_runs(
        tmp_path, monkeypatch):
    """A settings change on the board's machine measures spreads another way: its first run replaces the board
    however it compares. A run that timed nothing (quality alone) leaves the board's cells the reference: a busy
    run on another machine after it is still held back."""
    import zoo
    from zoo import environment, leaderboard

    measured, here = leaderboard.run_noise, environment.fingerprint
    spreads = [0.02, 0.5, None, 2.0]  # the board's; other settings, same machine; untimed; another machine, busy
    monkeypatch.setattr(leaderboard, "run_noise", lambda store, run, suites: (
        lambda spread: measured(store, run, suites).iloc[:0] if spread is None else
        measured(store, run, suites) * 0 + spread)(spreads[list(store.runs().run_id).index(run)]))
    first = zoo.run(["dot-product"], suites=["speed"], profile="smoke", out=tmp_path).attrs["run_id"]
    second = zoo.run(["dot-product"], suites=["speed"], profile="smoke", out=tmp_path,
                     suite_settings={"speed": {"repeats": 3}}).attrs["run_id"]
    assert _shown_run(_leaderboard(tmp_path)) == second and not (tmp_path / "held-back").exists()
    third = zoo.run(["dot-product"], suites=["correctness"], profile="smoke", out=tmp_path,
                    suite_settings={"correctness": {"cases": 2}}).attrs["run_id"]
    assert _shown_run(_leaderboard(tmp_path)) == third
    monkeypatch.setattr(environment, "fingerprint", lambda *args: {**here(*args), "cpu": "Another CPU"})
    fourth = zoo.run(["dot-product"], suites=["speed"], profile="smoke", out=tmp_path).attrs["run_id"]
    assert _shown_run(_leaderboard(tmp_path)) == third
    assert _shown_run((tmp_path / "held-back" / "README.md").read_text()) == fourth


def test_a_run_on_another_machine_does_not_replace_a_board_it_measured_less_of(tmp_path, capsys, monkeypatch):
    """One variant run on another kind of machine would make the board that machine's, with nothing else
    measured there (or what was, days ago): it is held back (its own board beside, the run kept); a run there of
    every variant replaces the board, and the held one stays out of it. Each run is judged alone: the first
    machine's earlier runs covering every variant do not let one variant run there take the board back. Other
    settings on the board's machine replace it as before (a board's own runs set different suites)."""
    import zoo
    from zoo import environment

    def run(names, cpu=None, **options):
        if cpu:
            monkeypatch.setattr(environment, "fingerprint", lambda *args: {**here(*args), "cpu": cpu})
        done = zoo.run(names, suites=["correctness"], profile="smoke", out=tmp_path, warn=warnings.append, **options)
        monkeypatch.setattr(environment, "fingerprint", here)
        return done.attrs["run_id"]

    here, warnings, both = environment.fingerprint, [], ["dot-product", "multi-head"]
    first = run(both)
    second = run(["dot-product"], cpu="Another CPU")
    assert _shown_run(_leaderboard(tmp_path)) == first
    assert len(warnings) == 1 and f"run {second} did not replace the board" in warnings[0]
    assert ("it ran on another kind of machine (cpu Another CPU, the board's " in warnings[0]
            and "and measured 1 of this board's 2 variants (not multi-head): measure them on the board's kind of "
                "machine, or all of them here (zoo run-all) to make the board this machine's" in warnings[0])
    assert _shown_run((tmp_path / "held-back" / "README.md").read_text()) == second
    exported = {json.loads(line)["run_id"] for line in (tmp_path / "runs.jsonl").read_text().splitlines()}
    assert {first, second} <= exported  # nothing lost
    status, lines = zoo_here(capsys, "leaderboard", "--out", tmp_path)
    assert status == 0 and _shown_run(_leaderboard(tmp_path)) == first
    assert any(f"run {second} is held back (it ran on another kind of machine" in line for line in lines)

    third = run(both, cpu="Another CPU")
    assert _shown_run(_leaderboard(tmp_path)) == third  # every variant there: the board moves
    assert second not in set(pd.read_csv(tmp_path / "results.csv").run_id)
    fourth = run(["dot-product"])  # the first machine again, one variant: its older runs do not count
    assert _shown_run(_leaderboard(tmp_path)) == third and f"run {fourth} did not replace" in warnings[-1]
    fifth = run(["dot-product"], cpu="Another CPU", suite_settings={"correctness": {"cases": 2}})
    assert _shown_run(_leaderboard(tmp_path)) == fifth  # other settings on the board's machine: as before


def test_a_causal_only_variant_is_measured_and_ranked_causal_beside_non_causal_ones(tmp_path):
    """forgetting computes only its causal form: every suite measures it causal (even where the profile asks for
    full mode only), and it is ranked by its causal ratio, marked so, in the same table as multi-head's full one."""
    done = run_zoo("run", "forgetting", "multi-head", "--suite", "correctness", "--suite", "complexity", "--suite",
                   "speed", "--profile", "smoke", "--set", 'speed.modes=["full"]', "--out", tmp_path)
    assert done.returncode == 0, done.stderr
    store = Store(tmp_path / "results.sqlite")
    results = store.results(store.latest_run())
    mine = results[(results.variant == "forgetting") & results["mode"].isin(["full", "causal"])]
    assert set(mine["mode"]) == {"causal"} and {"complexity", "speed"} <= set(mine.suite)
    cases = results[(results.variant == "forgetting") & (results.suite == "correctness")
                    & results.setting.str.contains("q_len=", na=False)]
    assert len(cases) > 20 and cases.setting.str.contains(" causal").all()  # every case called causal
    theirs = results[(results.variant == "multi-head") & (results.suite == "speed") & (results.check == "time")]
    assert set(theirs["mode"]) == {"full"}
    timed = results[(results.variant == "forgetting") & (results.suite == "speed") & (results.check == "time")]
    assert set(timed.n) == set(theirs.n) and len(set(timed.n)) == 3  # its primary mode: every length, as theirs
    assert gate(results)["forgetting"].ranked
    ranked = [line for line in _ranked_tables(_leaderboard(tmp_path)).splitlines() if line.startswith("| ")]
    assert any("forgetting" in line and "(causal" in line for line in ranked)
    assert any("multi-head" in line and "(causal" not in line for line in ranked)


def test_a_figures_interval_spans_the_same_figure_in_earlier_runs_of_its_source_and_no_other():
    """Three runs of one source: the board's ratio keeps its own value, its interval reaches the two earlier runs'
    figures (and no further back, nor to a run of another source), and says how many runs it spans."""
    from zoo.board import RERUNS, board_rows
    from zoo.checks import Result
    from zoo.profiles import get_profile

    store = Store.in_memory("reruns")
    settings = get_profile("quick").as_dict()

    def run(started, ratio, source):
        run_id = store.start_run(settings, {"cpu": "test"}, started)
        rows = [Result("time-ratio", "measured", "full fwd n=64", ratio, "ratio", n=64, mode="full", phase="fwd",
                       versus="torch-sdpa", low=ratio * 0.99, high=ratio * 1.01).as_dict(),
                Result("time-ratio", "measured", "full fwd n=128", ratio, "ratio", n=128, mode="full", phase="fwd",
                       versus="torch-sdpa").as_dict()]  # no interval stated: left as it is
        store.record_job(run_id, "dot-product", "speed", "done", 1.0, {"source_sha256": source}, rows)
        return run_id

    run("2026-01-01 00:00:00", 0.5, "aaa")  # the oldest run of this source: beyond RERUNS
    run("2026-01-01 01:00:00", 5.0, "bbb")  # another source: never spanned
    run("2026-01-01 02:00:00", 0.8, "aaa")
    run("2026-01-01 03:00:00", 1.2, "aaa")
    latest = run("2026-01-01 04:00:00", 1.0, "aaa")
    results, _ = board_rows(store, latest)
    ratio = results[results.n == 64].iloc[0]
    assert RERUNS == 2 and ratio.run_id == latest and ratio.value == 1.0
    assert (ratio.low, ratio.high, ratio.reruns) == (0.8, 1.2, 2)
    assert abs(ratio.between_runs - 0.4) < 1e-12
    bare = results[results.n == 128].iloc[0]
    assert bare.reruns == 0 and pd.isna(bare.low) and pd.isna(bare.between_runs)


def _ratio_run(store, started, environment, ratios, versus="torch-sdpa"):
    """A quick-profile run of ``environment`` on one source whose speed job of each variant stored one causal time
    ratio at n = 64 (``ratios``: variant -> value), its interval 1% either side; its id."""
    from zoo.checks import Result
    from zoo.profiles import get_profile

    run_id = store.start_run(get_profile("quick").as_dict(), {"cpu": "test", **environment}, started)
    for variant, ratio in ratios.items():
        row = Result("time-ratio", "measured", "causal fwd n=64", ratio, "ratio", n=64, mode="causal", phase="fwd",
                     versus=versus, low=ratio * 0.99, high=ratio * 1.01).as_dict()
        store.record_job(run_id, variant, "speed", "done", 1.0, {"source_sha256": "aaa"}, [row])
    return run_id


def test_a_figures_interval_spans_no_earlier_run_that_called_what_it_timed_differently():
    """Runs of one source before and after a change to how the harness calls what it times (``timing_form``): the
    latest figure spans only the run of its own form; runs that recorded no form are of the first one; a new run
    records this zoo's form."""
    from zoo.board import board_rows
    from zoo.checks import TIMING_FORM
    from zoo.environment import fingerprint
    from zoo.profiles import get_profile

    assert fingerprint(get_profile("smoke"), "cpu")["timing_form"] == TIMING_FORM
    store = Store.in_memory("timing forms")

    def run(started, ratio, environment):
        return _ratio_run(store, started, environment, {"multi-head": ratio}, versus="torch-mha-layer")

    run("2026-01-01 00:00:00", 0.5, {})  # before the change: nothing recorded
    first_form = run("2026-01-01 01:00:00", 0.55, {"timing_form": "1"})
    run("2026-01-01 02:00:00", 0.9, {"zoo_commit": "4cb1ce9d62ee"})  # the change's own commit: unrecorded, form 2
    latest = run("2026-01-01 03:00:00", 1.0, {"timing_form": "2"})
    ratio = board_rows(store, latest)[0].iloc[0]
    assert TIMING_FORM != "1" and ratio.run_id == latest
    assert (ratio.low, ratio.high, ratio.reruns) == (0.9, 1.01, 1)
    ratio = board_rows(store, first_form)[0].iloc[0]
    assert (ratio.low, ratio.high, ratio.reruns) == (0.5, 0.55 * 1.01, 1)


def test_a_figure_shown_from_an_earlier_form_still_spans_the_runs_of_that_form():
    """A run of the new form that timed one variant again: another variant's figure, shown from the old form's latest
    run, still spans its old-form rerun; the form that counts is that of the run the figure comes from."""
    from zoo.board import board_rows
    from zoo.checks import TIMING_FORM

    store = Store.in_memory("timing forms")
    _ratio_run(store, "2026-01-01 00:00:00", {}, {"multi-head": 0.5, "windowed": 2.0})
    _ratio_run(store, "2026-01-01 01:00:00", {}, {"multi-head": 0.55, "windowed": 2.2})
    latest = _ratio_run(store, "2026-01-01 02:00:00", {"timing_form": TIMING_FORM}, {"multi-head": 0.9})
    rows = board_rows(store, latest)[0].set_index("variant")
    assert rows.loc["multi-head"].reruns == 0
    assert (rows.loc["windowed"].value, rows.loc["windowed"].reruns, rows.loc["windowed"].low) == (2.2, 1, 2.0)


def _form_board(layers: dict[str, dict]):
    """A board of layers each from its own run (variant -> that run's environment), each timed at n = 64 with
    ratios of 0.9 to nn.MultiheadAttention and to a baseline, in both modes."""
    from zoo.board import Board
    from zoo.checks import Result
    from zoo.contract import MHA
    from zoo.leaderboard import registered_suites
    from zoo.profiles import get_profile

    store = Store.in_memory("timing forms")
    for hour, (variant, environment) in enumerate(layers.items()):
        run = store.start_run(get_profile("quick").as_dict(), {"cpu": "test", **environment},
                              f"2026-01-01 0{hour}:00:00")
        store.record_job(run, variant, "speed", "done", 1.0, {"card": {"kind": "layer", "best_known": "own-mha"}}, [
            row for mode in ("full", "causal") for row in (
                Result("time", "measured", f"{mode} fwd n=64", 1e-3, "s", n=64, mode=mode, phase="fwd").as_dict(),
                *(Result("time-ratio", "measured", f"{mode} fwd n=64", 0.9, "ratio", n=64, mode=mode, phase="fwd",
                         versus=versus, low=0.89, high=0.91).as_dict() for versus in (MHA, "own-mha")))])
    return Board.of(store, run, registered_suites())


def test_a_ratio_timed_before_its_comparators_call_changed_is_marked_and_the_board_says_what_changed():
    """A layer shown from a run of form 1 beside one of form 2: its causal ratio to nn.MultiheadAttention, whose
    causal call form 2 changed, is marked *earlier form* in the ranked cell, the per-length table and the variant's
    page, and named in the board's header with the change and the layer timed against the call as it is now; its
    non-causal ratio, its ratios to its own baseline, and the form-2 layer's are not marked."""
    from zoo.suites.speed import _forms_line, _ratio_cell, details, rank_intro, section

    board = _form_board({"old": {}, "new": {"timing_form": "2"}})

    def cell(variant, mode):
        return _ratio_cell(board, variant, "fwd", 64, mode=mode)[1]

    assert cell("old", "causal").endswith(", earlier form)"), cell("old", "causal")
    assert "earlier form" not in cell("old", "full") + cell("new", "causal") + cell("new", "full")
    line = _forms_line(board)
    assert line.startswith("Marked *earlier form*") and rank_intro(board)[-1] == line
    assert "the causal ratios to nn.MultiheadAttention of old were timed when it was handed the causal mask alone" \
           in line and "(as in the ratios of new here, not comparable with them)" in line, line
    per_length = {(row["variant"], row["mode"]): row["n=64"] for row in section(board).tables[0].rows}
    assert per_length[("old", "causal")].endswith("(0.9x, earlier form)"), per_length
    assert "earlier form" not in per_length[("old", "full")] + per_length[("new", "causal")]
    assert "; *earlier form*, a ratio timed before a change" in " ".join(section(board).text)
    page = {row["mode"]: row for row in details(board, "old")[0].rows}
    assert page["causal"]["x nn.MultiheadAttention"] == "0.9x (earlier form)" and \
        page["causal"]["x best known (own-mha)"] == "0.9x" and page["full"]["x nn.MultiheadAttention"] == "0.9x"


def test_a_board_of_earlier_form_runs_only_marks_them_and_compares_them_with_no_other():
    """A board whose every layer, its own run's included, was timed before the change: each causal ratio is marked,
    and the header names no layer timed against the call as it is now."""
    from zoo.suites.speed import _forms_line, _ratio_cell

    board = _form_board({"first": {}, "second": {"timing_form": "1"}})
    assert all(_ratio_cell(board, v, "fwd", 64, mode="causal")[1].endswith(", earlier form)")
               for v in ("first", "second"))
    assert "of first, second were timed when" in _forms_line(board) and "not comparable" not in _forms_line(board)
    assert _forms_line(_form_board({"now": {"timing_form": "2"}})) == ""


def test_a_noisy_run_all_is_judged_against_every_cell_of_the_board_not_the_last_runs_few(monkeypatch):
    """After a quiet run-all and a quiet rerun of one variant, a run-all whose other cells are noisy is held back:
    the reference is each cell's latest spread, not the one-variant run's two cells."""
    from types import SimpleNamespace

    from zoo import leaderboard

    cells = pd.MultiIndex.from_tuples([(v, "full", "fwd", n) for v in "abcdefghij" for n in (256, 1024)])
    noise = {"all": pd.Series(0.05, index=cells), "one": pd.Series(0.05, index=cells[:2]),
             "busy": pd.Series([0.05] * 16 + [1.0] * 4, index=cells)}
    store = SimpleNamespace(runs=lambda: pd.DataFrame({"run_id": ["all", "one", "busy"]}),
                            jobs=lambda run: pd.DataFrame({"variant": list("abcdefghij")}), environment=lambda run: {})
    monkeypatch.setattr(leaderboard, "run_noise", lambda store, run, suites: noise[run])
    monkeypatch.setattr(leaderboard, "board_group", lambda store, run: "quick")
    shown, held = leaderboard.board_run(store, {})
    assert shown == "one" and list(held) == ["busy"] and "over 20 cells" in held["busy"]


def _copy_with(store, run_id, target_dir, extra: dict[tuple[str, str], list[dict]]):
    """A copy of a stored run with ``extra`` rows added to (variant, suite) jobs (a new job where none was)."""
    target = Store(target_dir / "results.sqlite")
    copy = target.start_run(store.settings(run_id), store.environment(run_id), "2026-01-01 00:00:00")
    rows, jobs = store.results(run_id), store.jobs(run_id)
    for job in jobs.itertuples():
        mine = rows[(rows.variant == job.variant) & (rows.suite == job.suite)]
        records = [{k: (None if pd.isna(v) else v) if not isinstance(v, (list, dict)) else v for k, v in r.items()}
                   for r in mine.drop(columns=["variant", "suite"]).to_dict("records")]
        target.record_job(copy, job.variant, job.suite, job.status, job.seconds, job.provenance,
                          records + extra.pop((job.variant, job.suite), []))
    for (variant, suite), records in extra.items():  # with the provenance (its card) of the variant's other jobs
        provenance = jobs[jobs.variant == variant].provenance.iloc[0]
        target.record_job(copy, variant, suite, "done", 1.0, provenance, records)
    return target, copy


def test_a_wrong_flop_formula_is_shown_beside_the_rank_and_does_not_block_it(smoke_run, tmp_path):
    """The decision the board states: a FLOP formula that disagrees with the counted FLOPs is a claim violated (the
    outputs are not wrong), shown in the ranked row, not a reason to leave the variant out."""
    store, run_id = smoke_run
    wrong = {"check": "flops-formula", "status": "failed", "setting": "full fwd n=64", "n": 64, "mode": "full",
             "phase": "fwd", "detail": "the formula gives 3.0e6 FLOPs, 4.0e6 counted"}
    target, copy = _copy_with(store, run_id, tmp_path, {("dot-product", "complexity"): [wrong]})
    readme = render(target, copy, tmp_path / "board")[0].read_text()
    cores = readme.split("### Attention cores", 1)[1].split("###", 1)[0]
    row = next(line for line in cores.splitlines() if line.startswith("| ") and "dot-product" in line)
    assert "VIOLATED: the formula gives 3.0e6 FLOPs, 4.0e6 counted" in row
    assert gate(target.results(copy), registered_suites())["dot-product"].ranked


def test_the_accuracy_plot_puts_each_kind_on_the_axis_its_ranked_table_uses(smoke_run, tmp_path, monkeypatch):
    """Cores against torch SDPA, layers against nn.MultiheadAttention: one panel each, each point at its variant's
    ranking figure, as in the rank tables beneath."""
    from matplotlib.collections import PathCollection

    import zoo.plots as plots_

    store, run_id = smoke_run
    scores = {"dot-product": 0.9, "linear": 0.6, "multi-head": 0.8}
    extra = {(v, "quality"): [{"check": "accuracy", "status": "measured", "setting": "t", "value": a,
                               "params": {"task": "t"}}] for v, a in scores.items()}
    target, copy = _copy_with(store, run_id, tmp_path, extra)
    drawn = {}
    real_save = plots_.save
    monkeypatch.setattr(plots_, "save", lambda plt, fig, name: drawn.setdefault(name, [
        (ax.get_title(), ax.get_xlabel(), sorted((float(x), round(float(y), 6)) for c in ax.collections
                                                 if isinstance(c, PathCollection) for x, y in c.get_offsets()))
        for ax in fig.axes]) and real_save(plt, fig, name))
    readme = render(target, copy, tmp_path / "board")[0].read_text()
    panels = drawn["accuracy-vs-speed.png"]
    assert [title for title, _, _ in panels] == ["Attention cores (no parameters)", "Attention layers (with projections)"]
    (_, cores_label, cores), (_, layers_label, layers) = panels
    assert "torch SDPA" in cores_label and "nn.MultiheadAttention" in layers_label
    for heading, points, names in (("### Attention cores", cores, ("dot-product", "linear")),
                                   ("### Attention layers", layers, ("multi-head",))):
        ranked = readme.split(heading, 1)[1].split("###", 1)[0]
        assert {y for _, y in points} == {scores[name] for name in names}  # each kind on its own panel
        for name in names:  # the point sits at the ratio its ranked table shows, to 3 significant digits
            row = next(line for line in ranked.splitlines() if line.startswith("| ") and f" {name} " in line)
            x = next(x for x, y in points if y == scores[name])
            assert f"{fmt_x(x)} [" in row, (name, x, row)  # the unrounded point, formatted as the table formats it
