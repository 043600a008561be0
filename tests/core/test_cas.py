"""The one compare-and-swap loop (checkpoint_lib/core/cas.py): a commit lands on the snapshot that
decided it, a lost race decides again on the next snapshot, a refusal is not retried, and the
number of races is bounded."""

from __future__ import annotations

import pytest

from checkpoint_lib.core.cas import commit_on_snapshot


class Lost(Exception):
    pass


class Table:
    """A versioned value whose commit succeeds only on top of the version it was read at."""

    def __init__(self) -> None:
        self.version, self.rows, self.interlopers = 0, [], 0

    def read(self) -> int:
        return self.version

    def commit_on(self, seen: int, row: str) -> None:
        if self.interlopers:  # another writer commits between our read and our commit
            self.interlopers -= 1
            self.version += 1
            self.rows.append("theirs")
        if seen != self.version:
            raise Lost()
        self.version += 1
        self.rows.append(row)


def test_a_lost_race_decides_again_on_the_new_snapshot():
    t, decided_on = Table(), []
    t.interlopers = 2

    def attempt(seen: int) -> int:
        decided_on.append(seen)
        t.commit_on(seen, f"ours@{seen}")
        return seen

    result, retries = commit_on_snapshot(t.read, attempt, lost=Lost, attempts=5, exhausted=RuntimeError,
                                         sleep=lambda s: None)
    assert (result, retries) == (2, 2) and decided_on == [0, 1, 2]
    assert t.rows == ["theirs", "theirs", "ours@2"]  # one commit of ours, on the snapshot that decided it


def test_nothing_to_do_and_a_refusal_are_not_retried():
    t = Table()
    assert commit_on_snapshot(t.read, lambda seen: None, lost=Lost, attempts=3, exhausted=RuntimeError) == (None, 0)
    calls = []

    def refuse(seen: int) -> None:
        calls.append(seen)
        raise PermissionError("fenced")

    with pytest.raises(PermissionError, match="fenced"):
        commit_on_snapshot(t.read, refuse, lost=Lost, attempts=3, exhausted=RuntimeError)
    assert calls == [0]


def test_races_are_bounded_and_backed_off():
    t, pauses = Table(), []
    t.interlopers = 10

    def attempt(seen: int) -> None:
        t.commit_on(seen, "ours")

    with pytest.raises(RuntimeError, match="3 attempts"):
        commit_on_snapshot(t.read, attempt, lost=Lost, attempts=3, sleep=pauses.append,
                           exhausted=lambda n: RuntimeError(f"{n} attempts lost"))
    assert "ours" not in t.rows and len(pauses) == 3 and pauses[0] <= 0.0075 <= pauses[2]  # growing, jittered
    with pytest.raises(ValueError):
        commit_on_snapshot(t.read, attempt, lost=Lost, attempts=0, exhausted=RuntimeError)


def test_a_race_lost_while_reading_is_retried_too():
    """Two first writers creating the table: the loser's read raises the lost race (the store's
    ``_ensure_table``), and it reads again."""
    reads = []

    def read() -> int:
        reads.append(1)
        if len(reads) == 1:
            raise Lost()
        return len(reads)

    assert commit_on_snapshot(read, lambda seen: seen, lost=Lost, attempts=3, exhausted=RuntimeError,
                              sleep=lambda s: None) == (2, 1)
