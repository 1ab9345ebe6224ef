"""`zoo run-all` end to end on the smoke profile: results, leaderboard files, and isolation of bad plugins."""

import subprocess
import sys

import pandas as pd
import pytest

from conftest import good_plugin

LEAKS_FUTURE = good_plugin("leaks-future").replace(
    "attn_mask, is_causal))", "attn_mask, False))  # ignores is_causal: a deliberate bug")

CRASHES = good_plugin("crashes").replace(
    "        h = self.num_heads\n        return", "        import os\n        os._exit(3)\n        return")

HANGS = good_plugin("hangs").replace(
    "        h = self.num_heads\n        return", "        import time\n        time.sleep(600)\n        return")

FACTORY_RAISES = good_plugin("factory-raises").replace(
    "        self.num_heads = num_heads", "        raise RuntimeError('cannot build')")


def run_all(tmp_path, *args, timeout=300):
    return subprocess.run([sys.executable, "-m", "zoo", "run-all", "--profile", "smoke", "--out", str(tmp_path / "out"),
                           *map(str, args)], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """One smoke run: dot-product, a variant that leaks the future, and three that misbehave."""
    tmp_path = tmp_path_factory.mktemp("run")
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    for name, source in {"leaks": LEAKS_FUTURE, "crashes": CRASHES, "hangs": HANGS, "raises": FACTORY_RAISES}.items():
        (plugins / f"{name}.py").write_text(source)
    out = run_all(tmp_path, "--plugins-dir", plugins, "--timeout", 25,
                  *[arg for name in ("dot-product", "leaks-future", "crashes", "hangs", "factory-raises")
                    for arg in ("--filter", name)])
    return out, tmp_path / "out"


def test_run_completes_and_writes_the_three_kinds_of_output(finished_run):
    out, folder = finished_run
    assert out.returncode == 0, out.stderr
    assert (folder / "README.md").exists() and (folder / "results.csv").exists()
    assert {p.name for p in folder.glob("*.png")} == {"time.png", "flops.png", "memory.png"}
    results = pd.read_csv(folder / "results.csv")
    assert {"variant", "suite", "check", "setting", "status", "value", "unit", "detail"} <= set(results.columns)
    assert set(results.variant) == {"dot-product", "leaks-future", "crashes", "hangs", "factory-raises"}


def test_broken_variant_fails_with_its_reason_while_the_good_one_ranks(finished_run):
    _, folder = finished_run
    results = pd.read_csv(folder / "results.csv")
    leak = results[(results.variant == "leaks-future") & (results.check == "causal-leak")]
    assert (leak.status == "failed").any() and leak.detail.str.contains("future tokens").any()
    good = results[(results.variant == "dot-product") & (results.suite == "correctness")]
    assert set(good.status) <= {"passed", "skipped"}
    readme = (folder / "README.md").read_text()
    ranked = readme.split("## Leaderboard")[1].split("### Not ranked")[0]
    assert "| dot-product" in ranked and "leaks-future" not in ranked
    assert "**leaks-future**" in readme and "causal-leak" in readme


@pytest.mark.parametrize("variant, reason", [
    ("crashes", "worker exited with status 3"),
    ("hangs", "timed out"),
    ("factory-raises", "cannot build"),
])
def test_misbehaving_plugins_get_error_rows_with_a_reason(finished_run, variant, reason):
    _, folder = finished_run
    results = pd.read_csv(folder / "results.csv")
    errors = results[(results.variant == variant) & (results.status == "error")]
    assert not errors.empty and errors.detail.str.contains(reason).any(), errors.detail.tolist()


def test_leaderboard_rerenders_from_the_database(finished_run):
    _, folder = finished_run
    (folder / "README.md").unlink()
    out = subprocess.run([sys.executable, "-m", "zoo", "leaderboard", "--out", str(folder)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and (folder / "README.md").exists()
