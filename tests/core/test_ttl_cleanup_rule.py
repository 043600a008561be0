"""The TTL cleanup of keyed state kept as runs (``spark/state.py::TtlMarks``) equals the cleanup a
MERGE per flush did, as a model in plain Python (milliseconds; the Spark tests in
tests/spark/test_state_ttl.py and test_graph_ttl.py run the real thing on a few cases).

MERGE: a flush resets or adds to its keys' rows, then deletes every row of another key written
``cleanup`` before the newest write so far. Runs: a flush appends its keys' rows; a row from a run
before the last flush's, written ``cleanup`` before the newest write as of that flush, is hidden;
compactions (anywhere) drop hidden rows. Whatever the flushes, what the operator sees at every
flush and the state after the last one are the same."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

TTL, CLEANUP = 30, 60  # minutes: expiry, and ttl + lateness

flush = st.dictionaries(st.sampled_from("abcdef"), st.tuples(st.integers(1, 3), st.integers(0, 400), st.integers(0, 40)),
                        min_size=1, max_size=4)  # key -> (records, first record's time, spread to the last)


def _flush(f, state, newest):
    """One flush of ``f`` on ``state`` (key -> (value, written, ...)), the same in both models:
    what the operator sees per key, each key's new (value, written), and the newest write after."""
    view, written = {}, {}
    for k, (n, first, spread) in f.items():
        row = state.get(k)
        alive = row is not None and not row[1] + TTL < first  # expired: the key starts again
        view[k] = row[0] if alive else None
        last = first + spread
        written[k] = (row[0] + n, max(row[1], last)) if alive else (n, last)
    return view, written, max([t for t in [newest] + [a + s for _, a, s in f.values()] if t is not None])


def _merge_model(flushes):
    state, newest, seen = {}, None, []
    for f in flushes:
        view, written, newest = _flush(f, state, newest)
        state.update(written)
        state = {k: r for k, r in state.items() if k in f or not r[1] < newest - CLEANUP}
        seen.append(view)
    return seen, state


def _runs_model(flushes, compact_after):
    rows, marks, seen = [], (None, -1), []  # rows: (key, value, written, run); marks: (newest, run)

    def visible():
        newest, last = marks
        latest = {}
        for k, v, w, run in rows:  # in run order: the newest run wins
            latest[k] = (v, w, run)
        cut = None if newest is None else newest - CLEANUP
        return {k: r for k, r in latest.items() if not (cut is not None and r[2] < last and r[1] < cut)}

    for run, f in enumerate(flushes):
        view, written, newest = _flush(f, visible(), marks[0])
        rows += [(k, v, w, run) for k, (v, w) in written.items()]
        marks = (newest, run)
        if run in compact_after:  # a fold: the visible state, each row keeping its run
            rows = [(k, v, w, r) for k, (v, w, r) in sorted(visible().items(), key=lambda i: i[1][2])]
        seen.append(view)
    return seen, {k: (v, w) for k, (v, w, _r) in visible().items()}


@settings(max_examples=400, deadline=None)
@given(st.lists(flush, min_size=1, max_size=12), st.sets(st.integers(0, 11)))
def test_runs_with_marks_clean_up_what_a_merge_per_flush_deleted(flushes, compact_after):
    assert _runs_model(flushes, compact_after) == _merge_model(flushes)


def test_a_late_key_rewritten_in_the_last_flush_stays_visible_one_flush_more():
    """A late record's key rewritten by flush f is kept by f's MERGE (it matched), and deleted by
    the next flush that does not touch it: the run rule hides it only from a flush after that."""
    flushes = [{"a": (1, 0, 0)}, {"b": (1, 200, 0), "a": (1, 10, 0)}, {"a": (1, 20, 0)}, {"c": (1, 300, 0)}, {"a": (1, 25, 0)}]
    assert _runs_model(flushes, set()) == _merge_model(flushes)
    assert _merge_model(flushes)[0][2]["a"] == 2  # flush 2 still sees a's row written by flush 1
