"""The leaderboard's web page (index.html): self-contained, working in a real headless browser, and
showing any plugin or error text as text."""

import re
import shutil
from pathlib import Path

import pytest

from zoo.leaderboard import render
from zoo.store import Store

SCREENSHOTS = Path(__file__).resolve().parent.parent / "build" / "screenshots"


@pytest.fixture(scope="module")
def page_path(smoke_run, tmp_path_factory):
    store, run_id = smoke_run
    out = tmp_path_factory.mktemp("board")
    written = render(store, run_id, out)
    assert out / "index.html" in written
    return out / "index.html"


def test_the_page_is_self_contained(page_path):
    text = page_path.read_text()
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", text)  # nothing fetched from a network
    assert "<link" not in text and 'src="data:image/png;base64,' in text  # plots inlined
    for variant in ("dot-product", "linear", "multi-head"):
        assert f'"{variant}"' in text


def _browser():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    pytest.skip("no Chromium on this machine (.ci/run installs Debian's chromium package)")


def test_the_page_sorts_filters_and_opens_a_variant_in_a_real_browser(page_path):
    executable = _browser()
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is in the dev extras")
    errors = []
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(page_path.as_uri())

        def visible(table):
            return page.eval_on_selector_all(f"#table-{table} tbody tr:not([hidden])", "rows => rows.map(r => r.dataset.variant)")

        cores, layers = visible("core"), visible("layer")
        assert sorted(cores) == ["dot-product", "linear"] and layers == ["multi-head"]
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / "leaderboard.png"))  # for a person to look at

        page.click("#table-core th button[data-column='variant']")  # sort by name, then the other way
        assert visible("core") == ["dot-product", "linear"]
        page.click("#table-core th button[data-column='variant']")
        assert visible("core") == ["linear", "dot-product"]

        page.select_option("#family-filter", "linear")
        assert visible("core") == ["linear"] and visible("layer") == []
        assert page.inner_text("#visible-count") == "1 ranked variant(s) shown"
        page.select_option("#family-filter", "")
        page.select_option("#approximation-filter", "exact")
        assert visible("core") == ["dot-product"] and visible("layer") == ["multi-head"]

        page.click("#table-layer a.variant-link")
        assert page.inner_text("#variant-title") == "multi-head"
        panel = page.inner_text("#variant-panel")
        assert "Vaswani" in panel and "gradcheck" in panel and "passed" in panel
        page.screenshot(path=str(SCREENSHOTS / "variant-page.png"))
        browser.close()
    assert errors == []


def test_the_long_sequence_plot_is_on_the_same_page_when_its_board_is_published_beside(smoke_run, page_path):
    store, run_id = smoke_run
    out = page_path.parent
    (out / "long-sequences").mkdir()
    shutil.copy(out / "time.png", out / "long-sequences" / "time.png")
    render(store, run_id, out)
    text = (out / "index.html").read_text()
    assert text.count('src="data:image/png;base64,') == len(list(out.glob("*.png"))) + 1
    assert "time up to long sequences (from long-sequences/" in text


PLUGIN_TEXT_FIELDS = ("summary", "citation", "family", "option", "target note", "setting", "detail", "unit",
                      "error", "command", "cpu", "location", "plugin")
"""Every text a plugin (its card, its check rows, where it was loaded from), an error or the run's command
line puts on the board."""

NASTY = "<!--<script> </script> \u2028"
"""Opens HTML's double-escaped script state (no ``-->`` follows to leave it), which swallowed the page's
own script into the data block."""


def plugin_text_board(path: Path, text: dict[str, str]) -> tuple[Store, str, dict]:
    """A store holding one run with ``text`` (keyed by :data:`PLUGIN_TEXT_FIELDS`) in every such field: a
    ranked core, a ranked layer and an unranked core whose correctness check failed with the error text.
    Returns (store, run id, {variant: the texts its page shows: summary, check setting, check detail})."""
    store = Store(path)
    run = store.start_run({"name": "smoke", "reference_length": 64},
                          {"device": "cpu", "cpu": text["cpu"], "command": text["command"]}, "2026-01-01 00:00:00")
    pages = {}
    for variant, kind, approximates, status in (("plain", "core", None, "passed"), ("projected", "layer", "softmax", "passed"),
                                                ("broken", "core", None, "failed")):
        pages[variant] = {"summary": f"{variant}: {text['summary']}", "setting": f"{text['setting']} rank={text['option']}",
                          "detail": text["error"] if status == "failed" else text["detail"]}
        card = {"summary": pages[variant]["summary"], "citation": text["citation"], "family": text["family"], "kind": kind,
                "approximates": approximates, "tags": {"has_parameters": kind == "layer"},
                "options": {"rank": text["option"]},
                "targets": [{"check": "x-torch-sdpa", "at_most": 1.0, "mode": "full", "phase": "fwd+bwd", "n": 64,
                             "note": text["target note"]}]}
        provenance = {"plugin": text["plugin"], "kind": "file", "location": text["location"], "card": card}
        store.record_job(run, variant, "correctness", "done", 0.1, provenance, [
            {"check": "reference-float64", "status": status, "setting": pages[variant]["setting"], "unit": text["unit"],
             "detail": pages[variant]["detail"]}])
    return store, run, pages


def test_plugin_text_that_opens_comments_and_scripts_leaves_every_row_and_variant_page_working(tmp_path):
    executable = _browser()
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is in the dev extras")
    store, run, pages = plugin_text_board(tmp_path / "results.sqlite",
                                          {field: f"{field} {NASTY}" for field in PLUGIN_TEXT_FIELDS})
    render(store, run, tmp_path / "board")
    errors = []
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        page = browser.new_page()
        page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto((tmp_path / "board" / "index.html").as_uri())
        ranked = page.eval_on_selector_all("table[id^=table-] tbody tr", "rows => rows.map(r => r.dataset.variant)")
        assert sorted(ranked) == ["plain", "projected"]
        assert page.inner_text("#visible-count") == "2 ranked variant(s) shown"
        for variant, shown in pages.items():  # from its ranked row's link, or from the list of unranked ones
            page.locator(f"a[href='#variant-{variant}']").first.click()
            assert page.inner_text("#variant-title") == variant
            assert page.text_content("#variant-panel p") == shown["summary"]  # the first paragraph, verbatim
            checks = page.eval_on_selector_all("#variant-panel td", "cells => cells.map(c => c.textContent)")
            assert shown["setting"] in checks and shown["detail"] in checks
        browser.close()
    assert errors == []
