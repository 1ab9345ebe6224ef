"""Plugin text cannot break the Markdown tables or inject markup; ranking is correctness-gated."""

import pandas as pd

from zoo.leaderboard import cell, gate


def test_cell_escapes_pipes_newlines_backticks_and_html():
    text = cell("a|b\nc `code` <script>alert(1)</script>")
    assert "|" not in text and "\n" not in text and "`" not in text and "<script>" not in text
    assert "&lt;script&gt;" in text


def test_gate_lists_correctness_failures_and_errors_only():
    rows = pd.DataFrame([
        {"variant": "good", "suite": "correctness", "check": "x", "status": "passed", "detail": "", "setting": ""},
        {"variant": "good", "suite": "complexity", "check": "flops-exponent", "status": "failed", "detail": "claim", "setting": ""},
        {"variant": "bad", "suite": "correctness", "check": "causal-leak", "status": "failed", "detail": "leak", "setting": "s"},
        {"variant": "crashy", "suite": "speed", "check": "worker", "status": "error", "detail": "crashed", "setting": ""},
    ])
    failing = gate(rows)
    assert failing["good"] == []
    assert failing["bad"] == ["correctness/causal-leak: leak [s]"]
    assert failing["crashy"] == ["speed/worker: crashed"]
