"""The leaderboard's web page (index.html): self-contained, and working in a real headless browser."""

import re
import shutil
from pathlib import Path

import pytest

from zoo.leaderboard import render

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
