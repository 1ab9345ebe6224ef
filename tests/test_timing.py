"""Timing figures from several processes, the order rounds take, tied places, and what `zoo compare` calls a change."""

import statistics
from types import SimpleNamespace

import pandas as pd

from zoo.compare import timing_changes
from zoo.ranking import places
from zoo.timing import figure, rounds, strays


def test_a_figure_pools_every_process_and_its_interval_reaches_each_process_median():
    fast, slow = [1.0, 1.1, 0.9, 1.0], [1.5, 1.4, 1.6, 1.5]
    result = figure([fast, slow])
    assert result.samples == fast + slow and result.value == statistics.median(fast + slow)
    assert result.low <= statistics.median(fast) and result.high >= statistics.median(slow)
    assert result.between == (1.5 - 1.0) / result.value and result.processes == 2


def test_one_process_states_no_spread_between_processes_and_its_interval_is_the_rounds_quartiles():
    result = figure([[1.0, 2.0, 3.0, 4.0, 5.0]])
    assert result.between is None and result.processes == 1
    assert (result.low, result.high) == (2.0, 4.0) and result.iqr == 2.0


def test_a_skewed_spread_never_gives_a_negative_end():
    """A busy machine's rounds: one huge outlier widens the IQR past the median; the interval stays positive."""
    result = figure([[0.2, 0.21, 0.22, 3.0], [0.25, 0.23, 2.5, 0.24]])
    assert result.low > 0 and result.low <= min(0.215, 0.245) and result.high >= result.value


def test_agreeing_processes_get_an_interval_no_narrower_than_their_rounds_spread():
    result = figure([[1.0, 1.2, 0.8], [1.0, 1.2, 0.8]])
    assert result.between == 0.0 and result.low < 1.0 < result.high


def test_a_figure_at_one_end_of_an_interval_narrower_than_the_threshold_is_still_marked():
    """What a reader needs is how far a rerun may land from the figure shown, not how wide its interval is: 1.0
    with an earlier run at 1.07 strays under a threshold of 0.1 (an interval 7% wide); in the middle of an interval
    as wide, it does not, and past 10% wide it does wherever it sits."""
    assert strays(1.0, 1.0, 1.07, 0.1) and strays(1.0, 0.93, 1.0, 0.1)
    assert not strays(1.0, 0.965, 1.035, 0.1) and not strays(1.0, 0.96, 1.04, 0.1)
    assert strays(1.0, 0.94, 1.06, 0.1) and not strays(1.0, 1.0, 1.07, 0.2)


def test_rounds_alternate_the_order_of_the_callables():
    calls = []

    class Timer:
        def __init__(self, label):
            self.label = label

        def timeit(self, number):
            calls.append(self.label)
            return 0.001 * number

    samples = rounds({"a": Timer("a"), "b": Timer("b")}, {"a": 2, "b": 3}, repeats=4)
    assert calls == ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert samples == {"a": [0.001] * 4, "b": [0.001] * 4}


def test_overlapping_intervals_share_a_place_and_the_tie_carries_along_a_chain():
    figure_ = lambda value, low, high: SimpleNamespace(value=value, low=low, high=high)
    figures = [figure_(1.0, 0.9, 1.1), figure_(1.05, 1.0, 1.2), figure_(1.15, 1.12, 1.3), figure_(2.0, 1.9, 2.1),
               figure_(3.0, None, None), figure_(None, None, None)]
    assert places(figures) == [1, 1, 1, 4, 5, 6]


def _time(value, samples, low=None, high=None):
    return pd.DataFrame([{"variant": "v", "check": "time", "versus": "", "mode": "full", "phase": "fwd", "n": 64,
                          "unit": "s", "status": "measured", "value": value, "samples": samples, "low": low,
                          "high": high}])


def test_compare_reports_a_change_only_where_the_stated_intervals_do_not_overlap():
    """Rounds that agree closely within each run would make a bootstrap call a 10% move a change; the stated
    intervals (what the processes spread over) overlap, so it is not one; disjoint intervals are."""
    before, after = _time(1.0, [1.0, 1.0, 1.01], 0.9, 1.2), _time(1.1, [1.1, 1.1, 1.11], 1.0, 1.25)
    assert timing_changes(before, after).empty
    moved = timing_changes(before, _time(1.5, [1.5, 1.5, 1.51], 1.4, 1.6))
    assert list(moved.change) == ["slower"] and moved.test.iloc[0].startswith("stated intervals")
    assert moved.interval.iloc[0] == f"{1.4 / 1.2:.3g}-{1.6 / 0.9:.3g}"


def test_a_cell_of_slow_calls_takes_fewer_rounds_in_a_process_but_never_none():
    from zoo.timing import rounds_within

    settings = SimpleNamespace(repeats=4, cell_seconds=1.0)
    assert [rounds_within(settings, cost) for cost in (0.1, 0.4, 5.0)] == [4, 2, 1]
    assert rounds_within(SimpleNamespace(repeats=4, cell_seconds=None), 5.0) == 4


def test_runs_timed_in_one_process_are_compared_by_the_bootstrap_over_rounds():
    """Two single-process runs: the interval of value -/+ IQR/2 is no uncertainty between processes, so compare
    keeps the bootstrap over rounds (and its 10% threshold) even where rows carry intervals."""
    before, after = _time(1.0, [1.0, 1.0, 1.01], 0.99, 1.01), _time(1.07, [1.07, 1.07, 1.08], 1.06, 1.08)
    assert list(timing_changes(before, after).change) == ["slower"]  # disjoint intervals, 7% > 5%
    assert timing_changes(before, after, intervals=False).empty  # 7% is under the bootstrap's 10%


def test_a_run_stored_before_timings_were_repeated_reads_as_one_process():
    from zoo.profiles import Profile, get_profile

    stored = get_profile("quick").as_dict()
    del stored["processes"]
    assert Profile.from_dict(stored).processes == 1 and get_profile("quick").processes == 2
