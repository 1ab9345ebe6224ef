"""An export copies the runs that did not change since the last one from the file's own bytes, and only those."""

import pytest

from zoo.export import RunRecords, export_bytes
from zoo.folder import BoardFolder
from zoo.store import Store


def _add_run(store: Store, second: int, jobs: int = 2) -> str:
    run = store.start_run({"name": "test"}, {"machine": "m"}, f"2026-01-01 00:00:{second:02d}")
    for index in range(jobs):
        rows = [{"check": "c", "status": "measured", "value": float(index + row), "n": row} for row in range(3)]
        store.record_job(run, f"v{index}", "s", "done", 0.1, {"plugin": "p"}, rows)
    return run


@pytest.fixture
def serialised(monkeypatch):
    """The ids of the runs whose lines are serialised (not copied) from here on."""
    ids = []
    lines = RunRecords.lines

    def noting(self):
        ids.append(self.run_id)
        return lines(self)

    monkeypatch.setattr(RunRecords, "lines", noting)
    return ids


def _whole(store: Store) -> bytes:
    """The export every run serialised anew would be."""
    return export_bytes(store.records().values())


def test_an_export_copies_the_runs_unchanged_since_the_last_and_serialises_the_rest(tmp_path, serialised):
    folder = BoardFolder(tmp_path)
    store = folder.for_writing()
    first, second = _add_run(store, 1), _add_run(store, 2)
    folder.publish({}, store=store)
    assert set(serialised) == {first, second} and set(store.exported_spans()) == {first, second}

    serialised.clear()
    third = _add_run(store, 3)
    store.finish_run(second, "2026-01-01 00:01:00")  # a write to a run: its copy in the export is stale
    assert set(store.exported_spans()) == {first}
    folder.publish({}, store=store)
    assert sorted(serialised) == sorted([second, third])
    assert folder.export.read_bytes() == _whole(store)
    assert set(store.exported_spans()) == {first, second, third}


def test_a_run_whose_bytes_changed_on_disk_is_serialised_again(tmp_path, serialised):
    folder = BoardFolder(tmp_path)
    store = folder.for_writing()
    _add_run(store, 1), _add_run(store, 2)
    folder.publish({}, store=store)
    spans = store.exported_spans()
    leading = min(spans, key=lambda run_id: spans[run_id][1])  # the run whose lines the file holds first
    _, start, length = spans[leading]
    data = folder.export.read_bytes()
    edited = data.replace(b'"value": 1.0', b'"value": 7.0', 1)  # in the leading run's lines, its length kept
    assert start <= edited.index(b'"value": 7.0') < start + length
    folder.export.write_bytes(edited)
    serialised.clear()
    folder._export(store, on_disk=edited)  # as publish hands it the bytes it read under the lock
    assert serialised == [leading]
    assert folder.export.read_bytes() == _whole(store)


def test_a_fresh_database_joined_from_an_export_copies_its_runs_from_there_where_the_zoo_wrote_them(tmp_path,
                                                                                                     serialised):
    source = Store(tmp_path / "source.sqlite")
    first, second = _add_run(source, 1), _add_run(source, 2)
    data = _whole(source)
    second_line = next(line for line in data.split(b"\n") if second.encode() in line and b'"table": "jobs"' in line)
    folder = BoardFolder(tmp_path / "board")
    folder.path.mkdir()
    folder.export.write_bytes(data.replace(second_line, second_line.replace(b": ", b":  ", 1)))  # still valid JSON
    store = folder.for_writing()
    assert set(store.exported_spans()) == {first}  # the run written otherwise than the zoo writes it has none

    serialised.clear()
    folder.publish({}, store=store)
    assert serialised == [second]
    assert folder.export.read_bytes() == data  # every run as the zoo writes it
    assert set(store.exported_spans()) == {first, second}
