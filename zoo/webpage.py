"""The leaderboard as one self-contained web page (``index.html``): the board's data as JSON, the plots
inlined, and a little script that sorts, filters and opens a panel per variant. No network, no CDN: it
works opened from disk. The Markdown board (README.md) stays the one to read on a forge.
"""

from __future__ import annotations

import base64
import html
import json
import math
from urllib.parse import quote

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 1.5em auto; max-width: 1300px; padding: 0 1em; color: #222; }
h1 { font-size: 1.6em; margin-bottom: .2em; } h2 { margin-top: 1.6em; }
table { border-collapse: collapse; margin: .6em 0 1.2em; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: .25em .5em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; } th button { font: inherit; font-weight: 600; border: 0; background: none; cursor: pointer; padding: 0; }
th[aria-sort=ascending] button::after { content: " \\25B2"; } th[aria-sort=descending] button::after { content: " \\25BC"; }
.filters { display: flex; gap: 1.2em; flex-wrap: wrap; align-items: center; background: #fafafa; padding: .6em; border: 1px solid #ddd; }
#variant-panel { border: 2px solid #4a7; padding: .2em 1em 1em; margin: 1em 0; background: #fbfffb; }
.status-failed, .status-error { color: #b00; font-weight: 600; } .status-passed { color: #070; }
.verdict-met { color: #070; } .verdict-not-met { color: #b00; font-weight: 600; } .verdict-within-noise { color: #a60; }
img { max-width: 100%; border: 1px solid #ddd; margin: .4em 0; } .muted { color: #666; } code { background: #f3f3f3; }
"""

SCRIPT = r"""
const data = JSON.parse(document.getElementById("board-data").textContent);
const sortState = {};

function sortKey(text) {  // "0.194x", "8.11 ms", "1.98 s", "0.93", "not timed [1]"
  const m = String(text).match(/^\s*(-?[\d.]+(?:e[+-]?\d+)?)\s*(ms|s|µs)?/i);
  if (!m) return null;
  const scale = {ms: 1e-3, s: 1, "µs": 1e-6}[m[2]] || 1;
  return parseFloat(m[1]) * scale;
}

function compare(a, b) {
  const x = sortKey(a), y = sortKey(b);
  if (x !== null && y !== null) return x - y;
  if (x !== null) return -1;
  if (y !== null) return 1;
  return String(a).localeCompare(String(b));
}

function variantLink(name) {
  const a = document.createElement("a");
  a.href = "#variant-" + encodeURIComponent(name);
  a.textContent = name;
  a.className = "variant-link";
  return a;
}

function renderTable(group) {
  const table = document.getElementById("table-" + group.kind);
  const rows = group.rows.slice();
  const state = sortState[group.kind];
  if (state) {
    rows.sort((a, b) => compare(a[state.column], b[state.column]) * (state.descending ? -1 : 1));
  }
  table.replaceChildren();
  const head = table.createTHead().insertRow();
  group.columns.forEach(column => {
    const th = document.createElement("th");
    if (state && state.column === column) th.setAttribute("aria-sort", state.descending ? "descending" : "ascending");
    const button = document.createElement("button");
    button.textContent = column;
    button.dataset.column = column;
    button.addEventListener("click", () => {
      const same = sortState[group.kind] && sortState[group.kind].column === column;
      sortState[group.kind] = {column, descending: same ? !sortState[group.kind].descending : false};
      renderTable(group);
      applyFilters();
    });
    th.appendChild(button);
    head.appendChild(th);
  });
  const body = table.createTBody();
  rows.forEach(row => {
    const tr = body.insertRow();
    tr.dataset.variant = row.variant;
    group.columns.forEach(column => {
      const td = tr.insertCell();
      if (column === "variant") td.appendChild(variantLink(row.variant));
      else fill(td, row[column]);
    });
  });
}

function applyFilters() {
  const family = document.getElementById("family-filter").value;
  const capability = document.getElementById("capability-filter").value;
  const approximation = document.getElementById("approximation-filter").value;
  let visible = 0;
  document.querySelectorAll("tr[data-variant]").forEach(tr => {
    const v = data.variants[tr.dataset.variant];
    const show = (!family || v.family === family)
      && (!capability || v.capabilities[capability])
      && (!approximation || (approximation === "exact") === (v.approximates === null));
    tr.hidden = !show;
    if (show) visible += 1;
  });
  document.getElementById("visible-count").textContent = visible + " ranked variant(s) shown";
}

function fillSelect(id, values) {
  const select = document.getElementById(id);
  values.forEach(value => {
    const option = document.createElement("option");
    option.value = value; option.textContent = value;
    select.appendChild(option);
  });
  select.addEventListener("change", applyFilters);
}

function table(rows, columns, classes) {
  const t = document.createElement("table");
  const head = t.createTHead().insertRow();
  columns.forEach(c => { const th = document.createElement("th"); th.textContent = c; head.appendChild(th); });
  const body = t.createTBody();
  rows.forEach(r => {
    const tr = body.insertRow();
    columns.forEach(c => {
      const td = tr.insertCell(); fill(td, r[c]);
      if (classes && classes[c]) td.className = classes[c](r[c]);
    });
  });
  return t;
}

function section(panel, title, content) {
  const h = document.createElement("h3"); h.textContent = title; panel.appendChild(h);
  panel.appendChild(content);
}

function fill(node, value) {  // text whose `code` spans (plugin text is Markdown) show as code, never parsed as HTML
  const parts = (value === undefined || value === null ? "" : String(value)).split("`");
  if (parts.length % 2 === 0) { node.textContent = parts.join("`"); return; }  // an unpaired backtick: plain text
  parts.forEach((part, i) => {
    if (i % 2) { const code = document.createElement("code"); code.textContent = part; node.appendChild(code); }
    else if (part) node.appendChild(document.createTextNode(part));
  });
}

function text(value) { const p = document.createElement("p"); fill(p, value); return p; }

function showVariant(name) {
  const panel = document.getElementById("variant-panel");
  const v = Object.hasOwn(data.variants, name) ? data.variants[name] : null;
  if (!v) { panel.hidden = true; return; }
  panel.replaceChildren();
  const h = document.createElement("h2"); h.id = "variant-title"; h.textContent = name; panel.appendChild(h);
  panel.appendChild(text(v.summary));
  panel.appendChild(text("Citation: " + v.citation));
  panel.appendChild(text("Kind: " + v.kind + "; family: " + v.family + "; "
    + (v.approximates === null ? "exact for its own function" : "approximates " + v.approximates)));
  section(panel, "Standing", text(v.standing));
  const options = Object.entries(v.options || {});
  section(panel, "Options", options.length ? table(options.map(([option, value]) => ({option, value})), ["option", "value"])
    : text("none"));
  if (v.stale.length) section(panel, "Results of an older source (left off)", table(v.stale, ["suite", "runs", "command"]));
  section(panel, "Capabilities", table(Object.entries(v.capabilities).map(([k, on]) => ({capability: k, "": on ? "yes" : "no"})), ["capability", ""]));
  section(panel, "Departures from the paper", v.departures === null ? text("not recorded (a run from before plugins stated them)")
    : v.departures.length ? table(v.departures, ["kind", "text"]) : text("none stated: it follows the paper as written"));
  v.details.forEach(d => section(panel, d.title, table(d.rows, d.columns)));
  const status = s => "status-" + s;
  section(panel, "Checks (" + v.checks.length + " rows)", table(v.checks, ["suite", "check", "setting", "status", "detail"], {status}));
  const verdict = s => "verdict-" + String(s).replace(/ /g, "-");
  section(panel, "Targets", v.targets.length ? table(v.targets, ["target", "where", "goal", "measured", "verdict"], {verdict}) : text("none declared"));
  section(panel, "Provenance", table(Object.entries(v.provenance).map(([k, value]) => ({field: k, value})), ["field", "value"]));
  panel.hidden = false;
}

function route() {  // any hash a reader types: a variant's page, or nothing
  let hash;
  try { hash = decodeURIComponent(location.hash.slice(1)); } catch (error) { return; }
  if (hash.startsWith("variant-")) {
    showVariant(hash.slice("variant-".length));
    document.getElementById("variant-panel").scrollIntoView();
  }
}

function renderSections() {  // each suite's part of the board, as README.md has it
  const holder = document.getElementById("sections");
  data.sections.forEach(s => {
    const h = document.createElement("h2"); h.textContent = s.title; holder.appendChild(h);
    s.text.forEach(p => holder.appendChild(text(p)));
    s.tables.forEach(t => {
      if (t.title) { const h3 = document.createElement("h3"); h3.textContent = t.title; holder.appendChild(h3); }
      t.note.forEach(p => holder.appendChild(text(p)));
      holder.appendChild(t.rows.length ? table(t.rows, t.columns) : text("(none)"));
      if (t.footnotes.length) {
        const list = document.createElement("ol");
        t.footnotes.forEach(f => { const li = document.createElement("li"); fill(li, f); list.appendChild(li); });
        holder.appendChild(list);
      }
    });
  });
}

data.groups.forEach(renderTable);
renderSections();
fillSelect("family-filter", [...new Set(Object.values(data.variants).map(v => v.family))].sort());
fillSelect("capability-filter", data.capabilities);
document.getElementById("approximation-filter").addEventListener("change", applyFilters);
applyFilters();
window.addEventListener("hashchange", route);
route();
"""


SCRIPT_JSON_ESCAPES = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026"})
"""Written as JSON escapes in the data block: with no ``<`` in it, plugin text can neither end the block
early (``</script``) nor open HTML's double-escaped script state (``<!--<script>``), which swallowed the
page's own script; ``>`` and ``&`` so no markup of any kind is left. Every other character outside ASCII
(U+2028 and U+2029 included) and every control character json.dumps already escapes."""


def script_json(data: dict) -> str:
    """``data`` as JSON text that an HTML parser reads as one script element's content and that
    JSON.parse (and json.loads) read back to the same data."""
    return json.dumps(_finite(data), default=str, ensure_ascii=True).translate(SCRIPT_JSON_ESCAPES)


def _finite(value):
    """NaN and infinities as null: JSON has no word for them, and JSON.parse refuses Python's."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def variant_href(name: str) -> str:
    """The link that opens ``name``'s page, encoded as the script's ``encodeURIComponent`` does."""
    return "#variant-" + quote(name, safe="-_.!~*'()")


def page(data: dict, plots: list[tuple[bytes, str]]) -> str:
    """The page for ``data`` (what :mod:`zoo.leaderboard` collects) with ``plots`` (PNG bytes, caption) inlined.
    Data reaches the page only as escaped HTML text and attributes and as :func:`script_json`."""
    payload = script_json(data)
    figures = "\n".join(
        f'<figure><img alt="{html.escape(caption)}" src="data:image/png;base64,'
        f'{base64.b64encode(image).decode()}"><figcaption>{html.escape(caption)}</figcaption></figure>'
        for image, caption in plots)
    tables = "\n".join(f'<h3>{html.escape(g["title"])}</h3>\n<table id="table-{html.escape(g["kind"])}"></table>'
                       for g in data["groups"])
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in data["notes"])
    unranked = "".join(f"<li><a href=\"{html.escape(variant_href(u['variant']))}\">{html.escape(u['variant'])}</a>: "
                       f"{html.escape(u['why'])}</li>" for u in data["unranked"])
    stale = "".join(f"<li><a href=\"{html.escape(variant_href(u['variant']))}\">{html.escape(u['variant'])}</a>: "
                    f"{html.escape(u['suites'])}: <code>{html.escape(u['command'])}</code></li>" for u in data["stale"])
    answers = "".join(f"<li>{html.escape(line)}</li>" for line in data["advice"])
    environment = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>"
                          for k, v in data["environment"].items())
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Attention zoo leaderboard</title>
<meta name="viewport" content="width=device-width, initial-scale=1"><style>{STYLE}</style></head>
<body>
<h1>Attention zoo leaderboard</h1>
<p class="muted">Generated by <code>zoo</code> from run {html.escape(data["run"])}; every figure is from a run
(the Markdown board, README.md, has every table; this page has the ranking, each variant's page and the plots).</p>
<p>{html.escape(data["intro"].replace("*", ""))}</p>
{"<h2>Which should I use?</h2><p>" + html.escape(data.get("advice_intro", "")) + "</p><ul id='advice'>" + answers
 + "</ul>" if answers else ""}
<div class="filters">
  <label>Family <select id="family-filter"><option value="">all</option></select></label>
  <label>Capability <select id="capability-filter"><option value="">any</option></select></label>
  <label>Approximation <select id="approximation-filter"><option value="">all</option>
    <option value="exact">exact only</option><option value="approximation">approximations only</option></select></label>
  <span id="visible-count"></span>
</div>
{tables}
{"<p>Empty cells:</p><ol>" + notes + "</ol>" if notes else ""}
{"<h3>Not ranked</h3><ul id='unranked'>" + unranked + "</ul>" if unranked else ""}
{"<h3>Results of an older source, left off</h3><p>Measured before the variant's source changed; each command "
 "measures them again.</p><ul id='stale'>" + stale + "</ul>" if stale else ""}
<section id="variant-panel" hidden></section>
<div id="sections"></div>
<h2>Plots</h2>
{figures}
<h2>Environment</h2>
<table>{environment}</table>
<script type="application/json" id="board-data">{payload}</script>
<script>{SCRIPT}</script>
</body></html>
"""
