"""The maintainers' scripts: scripts/reproducibility reads a folder's last runs as their boards stood."""

from pathlib import Path

from conftest import run_python
from zoo.store import Store

REPO = Path(__file__).resolve().parent.parent
CARD = {"plugin": "test", "card": {"summary": "s", "family": "softmax", "kind": "core", "tags": {}}}


def _run(store: Store, started: str, ratios: dict[str, float], width: float, **environment) -> str:
    """A stored run: each variant passed correctness and was timed at n = 64 at ``ratios`` x torch SDPA, its
    interval ``width`` of its value."""
    run = store.start_run({"name": "quick", "reference_length": 64}, {"device": "cpu", "cpu": "test", **environment},
                          started)
    for variant, ratio in ratios.items():
        store.record_job(run, variant, "correctness", "done", 0.1, CARD,
                         [{"check": "reference-float64", "status": "passed", "setting": "s", "value": 1e-16}])
        cell = {"n": 64, "mode": "full", "phase": "fwd+bwd"}
        store.record_job(run, variant, "speed", "done", 0.1, CARD, [
            {"check": "time-ratio", "status": "measured", "value": ratio, "versus": "torch-sdpa",
             "low": ratio * (1 - width / 2), "high": ratio * (1 + width / 2), **cell},
            {"check": "time", "status": "measured", "value": 0.01 * ratio, "low": 0.01 * ratio * (1 - width / 2),
             "high": 0.01 * ratio * (1 + width / 2), **cell}])
    store.finish_run(run, started)
    return run


def _reproducibility(folder: Path) -> str:
    done = run_python(REPO / "scripts" / "reproducibility", "--out", folder, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_reproducibility_names_a_cell_that_moved_unmarked_and_a_reversed_order(tmp_path):
    store = Store(tmp_path / "results.sqlite")
    for started, ratios in (("2026-01-01 00:00:00", {"dot-product": 1.0, "linear": 1.5}),
                            ("2026-01-01 01:00:00", {"dot-product": 1.0, "linear": 1.5}),
                            ("2026-01-01 02:00:00", {"dot-product": 1.6, "linear": 1.5})):
        _run(store, started, ratios, width=0.02)
    out = _reproducibility(tmp_path)
    assert ("speed time-ratio: 2 cells in every run; CV median 0.118, largest 0.236; 1 cells more than 5% from the "
            "median of the runs, 1 of them unmarked on some board") in out
    assert "0.600 off: dot-product torch-sdpa full fwd+bwd 64; marked [False, False, False]" in out
    assert "tied on neither: [(1, 3, 'dot-product', 'linear'), (2, 3, 'dot-product', 'linear')]" in out


def test_reproducibility_counts_a_marked_move_apart_and_keeps_ties(tmp_path):
    store = Store(tmp_path / "results.sqlite")
    for started, ratio in (("2026-01-01 00:00:00", 1.0), ("2026-01-01 01:00:00", 1.0), ("2026-01-01 02:00:00", 1.2)):
        _run(store, started, {"dot-product": ratio, "linear": 1.1}, width=0.5)  # wide: marked varies, tied
    out = _reproducibility(tmp_path)
    assert "1 cells more than 5% from the median of the runs, 0 of them unmarked on some board" in out
    assert "tied on neither: none" in out


def test_reproducibility_says_when_its_runs_timed_in_different_forms(tmp_path):
    """Runs on both sides of a change to how the harness calls what it times disagree by the change: it says so."""
    store = Store(tmp_path / "results.sqlite")
    _run(store, "2026-01-01 00:00:00", {"dot-product": 1.0}, width=0.02)
    _run(store, "2026-01-01 01:00:00", {"dot-product": 1.0}, width=0.02, timing_form="1")
    same = _reproducibility(tmp_path)
    _run(store, "2026-01-01 02:00:00", {"dot-product": 1.0}, width=0.02, timing_form="2")
    differ = _reproducibility(tmp_path)
    assert "different forms" not in same
    runs = list(store.runs().sort_values("started").run_id)
    assert (f"these runs timed in different forms (zoo.checks.TIMING_FORM): {runs[0]} 1, {runs[1]} 1, {runs[2]} 2; "
            "where that changed a figure, they disagree by the change, not by noise") in differ


def test_measure_again_makes_each_board_as_it_was_made_and_only_the_suites_asked_for():
    """Block-sparse is on both committed boards, rotary on the main one only: the long board's runs name block-sparse
    alone, with its settings, suite by suite; both boards are drawn again last, the long one first."""
    done = run_python(REPO / "scripts" / "measure-again", "block-sparse", "rotary", "--dry-run", timeout=300)
    assert done.returncode == 0, done.stderr
    long = "--profile full --lengths 4096,8192,16384 --processes 1"
    assert done.stdout.splitlines() == [
        "zoo run block-sparse rotary --out leaderboard",
        "zoo run block-sparse rotary --suite quality --out leaderboard",
        f"zoo run block-sparse {long} --suite correctness --suite speed --repeats 3 --out leaderboard/long-sequences",
        f"zoo run block-sparse {long} --suite complexity --out leaderboard/long-sequences",
        f"zoo run block-sparse {long} --suite inference --repeats 3 --out leaderboard/long-sequences",
        f"zoo run block-sparse {long} --suite quality --repeats 3 --set quality.steps=300 "
        "--set quality.recall_steps=600 --set quality.seeds=2 --set quality.task_max_gflop=5000 "
        "--out leaderboard/long-sequences",
        "zoo leaderboard --out leaderboard/long-sequences",
        "zoo leaderboard --out leaderboard"]
    only = run_python(REPO / "scripts" / "measure-again", "rotary", "--suite", "complexity", "--dry-run", timeout=300)
    assert only.returncode == 0 and only.stdout.splitlines()[0] == "zoo run rotary --suite complexity --out leaderboard"
    assert len(only.stdout.splitlines()) == 3  # no long-board run: rotary is not there
    unknown = run_python(REPO / "scripts" / "measure-again", "nope", "--dry-run", timeout=300)
    assert unknown.returncode == 2 and "not a registered variant: nope" in unknown.stderr
    typo = run_python(REPO / "scripts" / "measure-again", "rotary", "--suite", "sped", "--dry-run", timeout=300)
    assert typo.returncode == 2 and "--suite sped: the boards' suites are" in typo.stderr and not typo.stdout
