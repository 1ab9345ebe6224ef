"""A plot drawn from the same inputs by the same code is taken from the board's folder instead of drawn again."""

import io

import pandas as pd
from PIL import Image

from zoo import plots
from zoo.leaderboard import _as_drawn_before

DRAWN = []


@plots.drawn_once
def _line(rows: pd.DataFrame, greyed: frozenset, name: str = "line.png"):
    DRAWN.append(name)
    plt = plots.pyplot()
    fig, ax = plt.subplots(figsize=(2, 2))
    ax.plot(rows.n, rows.value, color="0.5" if "b" in greyed else "C0")
    return plots.save(plt, fig, name)


ROWS = pd.DataFrame({"n": [256, 512, 1024], "value": [1.0, 2.0, 4.0]})


def test_a_plot_of_the_same_inputs_is_the_folders_and_other_inputs_draw_anew(tmp_path):
    DRAWN.clear()
    name, png = _line(ROWS, frozenset({"a", "b"}))
    assert DRAWN == ["line.png"] and Image.open(io.BytesIO(png)).text[plots.INPUTS_KEY]
    (tmp_path / name).write_bytes(png)
    with plots.reusing(tmp_path):
        assert _line(ROWS.copy(), frozenset({"b", "a"})) == (name, png)  # the same content, another object
        assert DRAWN == ["line.png"]
        _, moved = _line(ROWS.assign(value=[1.0, 2.0, 5.0]), frozenset({"a", "b"}))
        _line(ROWS, frozenset({"a"}))
        _line(ROWS, frozenset({"a", "b"}), name="other.png")
    assert DRAWN == ["line.png"] * 3 + ["other.png"]
    assert moved != png
    _line(ROWS, frozenset({"a", "b"}))  # outside reusing: drawn
    assert len(DRAWN) == 5


def test_a_plot_drawn_from_other_inputs_replaces_the_folders_even_where_its_pixels_are_the_same(tmp_path):
    _, png = _line(ROWS, frozenset())
    _, same_pixels = _line(ROWS, frozenset({"c"}))  # "c" changes no colour: only the inputs differ
    (tmp_path / "line.png").write_bytes(png)
    assert same_pixels != png
    assert _as_drawn_before(tmp_path / "line.png", same_pixels) == same_pixels
    assert _as_drawn_before(tmp_path / "line.png", png) == png


def test_a_plot_function_whose_source_cannot_be_read_is_drawn_every_time(tmp_path, monkeypatch):
    import inspect

    DRAWN.clear()
    name, png = _line(ROWS, frozenset())
    (tmp_path / name).write_bytes(png)
    monkeypatch.setattr(inspect, "getsourcefile", lambda _: None)  # as in a frozen or zipped install
    with plots.reusing(tmp_path):
        assert _line(ROWS, frozenset())[0] == name
    assert DRAWN == ["line.png"] * 2
