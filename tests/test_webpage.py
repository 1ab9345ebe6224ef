"""The leaderboard's web page (index.html): self-contained, working in a real headless browser, and
showing any plugin or error text as text."""

import json
import re
import shutil
import tempfile
from html.parser import HTMLParser
from pathlib import Path
from typing import NamedTuple
from unittest import mock
from urllib.parse import unquote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import run_zoo
from zoo import webpage
from zoo.leaderboard import render
from zoo.store import Store

SCREENSHOTS = Path(__file__).resolve().parent.parent / "build" / "screenshots"


@pytest.fixture(scope="module")
def page_path(smoke_run, tmp_path_factory):
    """The page of the smoke run with a quality job of multi-head added to a copy of its folder (the smoke run
    leaves quality out for its time), so a variant page holds every suite's figures."""
    store, _ = smoke_run
    folder = tmp_path_factory.mktemp("with-quality") / "board"
    shutil.copytree(Path(store.path).parent, folder)
    done = run_zoo("run", "multi-head", "--profile", "smoke", "--suite", "quality", "--out", folder)
    assert done.returncode == 0, done.stderr
    store = Store(folder / "results.sqlite")
    out = tmp_path_factory.mktemp("board")
    written = render(store, store.latest_run(), out)
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


def test_the_page_sorts_filters_and_opens_a_variant_in_a_real_browser(page_path, browser):
    errors = []
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

    headings = page.eval_on_selector_all("#sections h2", "hs => hs.map(h => h.textContent)")
    assert headings[:3] == ["Correctness", "Complexity", "Speed"]  # every suite's section, as README.md has it
    assert page.eval_on_selector_all("#sections table", "ts => ts.length") >= 4

    page.click("#table-layer a.variant-link")
    assert page.inner_text("#variant-title") == "multi-head"
    panel = page.inner_text("#variant-panel")
    assert "Vaswani" in panel and "gradcheck" in panel and "passed" in panel
    assert "Claims and measurements" in panel and "FLOP exponent (full fwd)" in panel  # the complexity suite's
    assert "Departures from the paper" in panel and "nn.MultiheadAttention's layout" in panel  # the plugin's own
    assert re.search(r"Standing\s+ranked\s", panel) and re.search(r"Options\s+none\s", panel)  # it has no options
    times = page.eval_on_selector_all("#variant-panel h3", "hs => hs.map(h => h.textContent)")
    assert "Times per length" in times and "x nn.MultiheadAttention" in panel  # every timed cell, with its ratio
    assert "Quality (this run)" in times and re.search(r"long-range-copy\s+0\.\d+ ± 0\.\d+\s+0\.062", panel)
    page.screenshot(path=str(SCREENSHOTS / "variant-page.png"))
    page.evaluate("() => { location.hash = '#variant-linear'; }")
    page.wait_for_function("() => document.getElementById('variant-title')?.textContent === 'linear'")
    assert re.search(r"Options\s+option\s+value\s+chunk\s+\d+", page.inner_text("#variant-panel"))
    for typed in ("#variant-constructor", "#variant-%E0%A4%A", "#variant-no-such-variant"):  # a reader's typing
        page.evaluate("hash => { location.hash = hash; }", typed)
        page.wait_for_function("() => document.getElementById('variant-panel').hidden === true")
    page.close()
    assert errors == []


def test_the_plots_of_a_board_published_in_a_subfolder_are_on_the_same_page(smoke_run, page_path):
    store, run_id = smoke_run
    out = page_path.parent
    (out / "long-sequences").mkdir()
    shutil.copy(out / "time.png", out / "long-sequences" / "time.png")
    (out / "elsewhere").mkdir()  # a folder that holds no board
    shutil.copy(out / "time.png", out / "elsewhere" / "time.png")
    render(store, run_id, out)
    assert "time (from long-sequences/" not in (out / "index.html").read_text()  # a board folder has its runs.jsonl
    (out / "long-sequences" / "runs.jsonl").write_text("")
    render(store, run_id, out)
    text = (out / "index.html").read_text()
    assert text.count('src="data:image/png;base64,') == len(list(out.glob("*.png"))) + 1
    assert "time (from long-sequences/, a board of its own run: long-sequences/index.html)" in text


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


def as_shown(text: str) -> str:
    """What the page shows of plugin text (Markdown in the plugins): backticks in pairs mark code spans, shown as
    <code> without them; with an unpaired one the text is shown as it is."""
    parts = text.split("`")
    return "".join(parts) if len(parts) % 2 else text


def _every_row_and_variant_page_works(browser, index: Path, pages: dict) -> None:
    """In the browser: the two ranked rows are listed and counted, and each variant's page (from its ranked
    row's link, or from the list of unranked ones) shows its summary, check setting and detail verbatim."""
    errors = []
    page = browser.new_page()
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(index.as_uri())
    ranked = page.eval_on_selector_all("table[id^=table-] tbody tr", "rows => rows.map(r => r.dataset.variant)")
    assert sorted(ranked) == ["plain", "projected"]
    assert page.inner_text("#visible-count") == "2 ranked variant(s) shown"
    for variant, shown in pages.items():
        page.locator(f"a[href='#variant-{variant}']").first.click()  # the panel follows on hashchange: wait for it
        page.wait_for_function("name => document.getElementById('variant-title')?.textContent === name", arg=variant)
        assert page.text_content("#variant-panel p") == as_shown(shown["summary"])  # the first paragraph
        spans = shown["summary"].split("`")
        codes = page.eval_on_selector_all("#variant-panel p:first-of-type code", "cs => cs.map(c => c.textContent)")
        assert codes == (spans[1::2] if len(spans) % 2 else [])  # each `span` a <code>, its text verbatim
        checks = page.eval_on_selector_all("#variant-panel td", "cells => cells.map(c => c.textContent)")
        assert as_shown(shown["setting"]) in checks and as_shown(shown["detail"]) in checks
    page.close()
    assert errors == []


@pytest.fixture(scope="module")
def browser():
    """One Chromium for the module's page tests (launching it is the slow part)."""
    executable = _browser()
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is in the dev extras")
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        yield launched
        launched.close()


def test_plugin_text_that_opens_comments_and_scripts_leaves_every_row_and_variant_page_working(tmp_path, browser):
    store, run, pages = plugin_text_board(tmp_path / "results.sqlite",
                                          {field: f"{field} `code` {NASTY}" for field in PLUGIN_TEXT_FIELDS})
    render(store, run, tmp_path / "board")
    _every_row_and_variant_page_works(browser, tmp_path / "board" / "index.html", pages)


FRAGMENTS = ("<!--", "<script>", "</script>", "</SCRIPT ", "-->", "<", ">", "&", "&amp;", '"', "'", "`", "|", "%",
             "\\", "\u2028", "\u2029", "\x00", "\r\n")
"""Pieces that end or open something in HTML, JSON, JavaScript, URLs or Markdown, so that generated text
holds them far more often than uniformly random characters would."""

plugin_texts = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(st.characters(exclude_categories=["Cs"]))),
                        max_size=6).map("".join)
"""Any text (control characters included) but lone surrogates: UTF-8, SQLite and Python's strings in a page
cannot hold those, so no plugin text can carry one to the board."""

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | plugin_texts,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(plugin_texts, children, max_size=3), max_leaves=8)

PAGE_SETTINGS = settings(derandomize=True, database=None, deadline=None, suppress_health_check=[HealthCheck.too_slow])
"""The same examples on every run and no time limit per example: a busy 2-core CI machine passes it too."""


@settings(PAGE_SETTINGS, max_examples=6)
@given(text=st.fixed_dictionaries({field: plugin_texts for field in PLUGIN_TEXT_FIELDS}))
def test_generated_plugin_text_leaves_every_row_and_variant_page_working_in_a_real_browser(browser, text):
    """The same as with NASTY, for texts drawn as the parser-level test draws them, read by Chromium itself."""
    with tempfile.TemporaryDirectory() as folder:
        store, run, pages = plugin_text_board(Path(folder) / "results.sqlite", text)
        render(store, run, Path(folder) / "board")
        _every_row_and_variant_page_works(browser, Path(folder) / "board" / "index.html", pages)


class Element(NamedTuple):
    tag: str
    attributes: dict
    text: list[str]


class Elements(HTMLParser):
    """A page's elements in document order, as an HTML parser reads them, each with the text inside it."""

    VOID = ("meta", "img")

    def __init__(self, page: str) -> None:
        super().__init__()
        self.elements: list[Element] = []
        self.open: list[Element] = []
        self.feed(page)
        self.close()
        assert not self.open

    def handle_starttag(self, tag, attrs):
        element = Element(tag, dict(attrs), [])
        self.elements.append(element)
        if tag not in self.VOID:
            self.open.append(element)

    def handle_endtag(self, tag):
        assert self.open.pop().tag == tag  # each element ends where the template ends it

    def handle_data(self, data):
        for element in self.open:
            element.text.append(data)


def _no_constant(name):
    raise AssertionError(f"{name} is not JSON that JSON.parse reads")


def assert_page_shows(page: str, data: dict, captions: list[str]) -> None:
    """``page`` holds ``data`` as a browser reads it: the data block, from its start tag to the first
    ``</script`` (where a browser ends it), parses back to exactly ``data`` and is followed by the page's own
    script, intact; there are no other script elements; every text and attribute shows its data verbatim."""
    start = '<script type="application/json" id="board-data">'
    block = page.split(start, 1)[1].split("</script", 1)[0]
    assert "<" not in block  # no "<!--" or "<script": the tokenizer never leaves plain script data
    assert not {">", "&", "\u2028", "\u2029"} & set(block) and block.isascii()  # no markup at all; no line breaks JS sees
    assert json.loads(block, parse_constant=_no_constant) == data
    assert page.endswith(f"{start}{block}</script>\n<script>{webpage.SCRIPT}</script>\n</body></html>\n")
    assert len(re.findall("<script", page, re.IGNORECASE)) == 2

    elements = Elements(page).elements
    texts = {tag: ["".join(e.text) for e in elements if e.tag == tag] for tag in ("p", "h3", "li", "th", "td", "figcaption")}
    unranked, stale = data["unranked"], data["stale"]
    assert [e.attributes["id"] for e in elements if "id" in e.attributes] == [
        *(["advice"] if data["advice"] else []), "family-filter", "capability-filter", "approximation-filter", "visible-count",
        *[f"table-{group['kind']}" for group in data["groups"]], *(["unranked"] if unranked else []),
        *(["stale"] if stale else []), "variant-panel", "sections", "board-data"]
    assert data["run"] in texts["p"][0] and texts["p"][1] == data["intro"].replace("*", "")
    assert texts["h3"] == [group["title"] for group in data["groups"]] + (["Not ranked"] if unranked else []) + (
        ["Results of an older source, left off"] if stale else [])
    assert texts["li"] == data["advice"] + data["notes"] + [f"{u['variant']}: {u['why']}" for u in unranked] + [
        f"{u['variant']}: {u['suites']}: {u['command']}" for u in stale]
    assert ["".join(e.text) for e in elements if e.tag == "code"] == ["zoo", *[u["command"] for u in stale]]
    assert [unquote(e.attributes["href"]) for e in elements if e.tag == "a"] == [
        f"#variant-{u['variant']}" for u in unranked + stale]
    assert texts["th"] == list(data["environment"]) and texts["td"] == list(data["environment"].values())
    assert texts["figcaption"] == captions == [e.attributes["alt"] for e in elements if e.tag == "img"]


@settings(PAGE_SETTINGS, max_examples=15)
@given(text=st.fixed_dictionaries({field: plugin_texts for field in PLUGIN_TEXT_FIELDS}))
def test_any_plugin_text_reaches_the_page_and_readme_as_text(text):
    with tempfile.TemporaryDirectory() as folder:
        store, run, pages = plugin_text_board(Path(folder) / "results.sqlite", text)
        with mock.patch.object(webpage, "page", wraps=webpage.page) as page_of:
            readme, page = (path.read_bytes().decode() for path in render(store, run, Path(folder) / "board")[:2])
    data = page_of.call_args.args[0]
    assert_page_shows(page, data, captions=[])
    for variant, shown in pages.items():  # the texts did reach the page's data
        card = data["variants"][variant]
        assert card["summary"] == shown["summary"] and card["checks"][0]["detail"] == shown["detail"]
        assert card["checks"][0]["setting"] == shown["setting"] and card["targets"][0]["target"] == text["target note"]
        assert (card["family"], card["citation"], card["provenance"]["plugin"]) == (text["family"], text["citation"], text["plugin"])
    assert data["environment"]["command"] == text["command"] and data["environment"]["cpu"] == text["cpu"]

    assert "<" not in readme  # cell() escaped every text; no raw "|" splits a table row
    tables = re.findall(r"(?:^\|.*\n)+", readme, re.MULTILINE)
    assert tables and all(len({line.count("|") for line in table.splitlines()}) == 1 for table in tables)


@settings(PAGE_SETTINGS, max_examples=40)
@given(data=st.fixed_dictionaries({
    "run": plugin_texts, "intro": plugin_texts, "advice": st.lists(plugin_texts, max_size=2), "environment": st.dictionaries(plugin_texts, plugin_texts, max_size=3),
    "groups": st.lists(st.fixed_dictionaries({"kind": plugin_texts, "title": plugin_texts,
                                              "columns": st.lists(plugin_texts, max_size=3),
                                              "rows": st.lists(st.dictionaries(plugin_texts, json_values, max_size=3), max_size=2)}),
                       max_size=2),
    "notes": st.lists(plugin_texts, max_size=3), "capabilities": st.lists(plugin_texts, max_size=3),
    "unranked": st.lists(st.fixed_dictionaries({"variant": plugin_texts, "why": plugin_texts}), max_size=2),
    "stale": st.lists(st.fixed_dictionaries({"variant": plugin_texts, "suites": plugin_texts, "command": plugin_texts}),
                      max_size=2),
    "sections": st.lists(json_values, max_size=2),
    "variants": st.dictionaries(plugin_texts, json_values, max_size=3)}), captions=st.lists(plugin_texts, max_size=2))
def test_every_text_the_page_writes_stays_in_its_html_context(data, captions):
    page = webpage.page(data, [(b"\x89PNG not drawn", caption) for caption in captions])
    assert_page_shows(page, data, captions)  # its own line ends, "\r" kept
