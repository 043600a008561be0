"""Unit tests for checkpoint_lib.core.acks: each typed ack state writes exactly the dict the store
keeps (spelled out here key by key, so renaming a key fails) and reads it back, older stored forms
included."""

from __future__ import annotations

import json

import pytest

from checkpoint_lib.core.acks import (
    KeyedAckState,
    KeyedPosition,
    PinnedState,
    SinkAckState,
    SourceAckState,
    SourcePosition,
)
from checkpoint_lib.core.keygroups import KeyGroupRange
from checkpoint_lib.core.twophase import SinkSnapshot, Transaction


def stored(state: dict) -> dict:
    """What a state reads back as after the store's JSON round trip."""
    return json.loads(json.dumps(state))


# --- the source ------------------------------------------------------------------------------------


def test_source_state_writes_todays_dict_and_reads_it_back():
    state = SourceAckState(version=7, next_seq=12, barrier_seq=11, barrier_seqs={0: 9, 1: 11},
                           event_time_reference=1700000000.5)
    today = {"version": 7, "next_seq": 12, "barrier_seq": 11, "barrier_seqs": {"0": 9, "1": 11},
             "event_time_reference": 1700000000.5}
    assert state.to_state() == today
    assert SourceAckState.from_state(stored(today)) == state


def test_source_state_without_a_time_reference_still_writes_its_key():
    today = {"version": 3, "next_seq": 4, "barrier_seq": 3, "barrier_seqs": {"0": 3}, "event_time_reference": None}
    state = SourceAckState.from_state(stored(today))
    assert state == SourceAckState(3, 4, 3, {0: 3}, None)
    assert state.to_state() == today


@pytest.mark.parametrize("old", [
    {"version": 5, "next_seq": 8, "barrier_seq": 7},  # before lagging subtasks and StateTtl.max_ahead
    {"version": 5, "next_seq": 8, "barrier_seq": 7, "barrier_seqs": {"0": 7, "1": 7}},  # before max_ahead
])
def test_older_source_states_still_read(old):
    state = SourceAckState.from_state(stored(old))
    assert (state.version, state.next_seq, state.barrier_seq, state.event_time_reference) == (5, 8, 7, None)
    assert state.barrier_seqs == ({0: 7, 1: 7} if "barrier_seqs" in old else None)
    assert state.to_state() == {**old, "event_time_reference": None}


def test_a_source_state_gives_the_position_a_restore_resumes_from():
    state = SourceAckState(version=7, next_seq=12, barrier_seq=11, barrier_seqs={0: 11}, event_time_reference=2.5)
    assert state.position == SourcePosition(offset=7, next_seq=12, time_reference=2.5)
    assert SourcePosition() == SourcePosition(offset=-1, next_seq=0, time_reference=None)  # from scratch


# --- the keyed operator -------------------------------------------------------------------------------


def test_keyed_state_writes_todays_dict_and_reads_it_back():
    state = KeyedAckState(cursor=41, pinned=PinnedState(table_version=9, key_groups=KeyGroupRange(0, 42)))
    today = {"table_version": 9, "key_groups": [0, 42], "cursor": 41}
    assert state.to_state() == today
    assert KeyedAckState.from_state(stored(today)) == state


def test_keyed_state_in_a_cycle_has_its_feedback_barrier():
    state = KeyedAckState(cursor=41, pinned=PinnedState(9, KeyGroupRange(43, 85)), feedback_barrier_seq=6)
    today = {"table_version": 9, "key_groups": [43, 85], "cursor": 41, "feedback_barrier_seq": 6}
    assert state.to_state() == today
    assert KeyedAckState.from_state(stored(today)) == state


def test_a_gate_subtask_acks_where_the_barrier_was_on_each_of_its_channels():
    state = KeyedAckState(cursor=-1, pinned=PinnedState(9, KeyGroupRange(0, 42)), barrier_seqs={3: 12, 0: 7})
    today = {"table_version": 9, "key_groups": [0, 42], "cursor": -1, "barrier_seqs": {"0": 7, "3": 12}}
    assert state.to_state() == today  # JSON keys: the channel numbers as text, in order
    assert KeyedAckState.from_state(stored(today)) == state
    assert KeyedAckState.from_state({"cursor": 4}).barrier_seqs is None  # stored before gates recorded them


def test_the_keyed_state_an_operator_subtask_pins():
    pinned = PinnedState(table_version=9, key_groups=KeyGroupRange(0, 42))
    assert pinned.to_state() == {"table_version": 9, "key_groups": [0, 42]}
    assert PinnedState.held_in({"table_version": 9, "key_groups": [0, 42], "cursor": 41}) == pinned
    assert PinnedState.held_in({"cursor": 41}) is None  # a stateless operator's
    assert PinnedState.held_in({}) is None


def test_a_stateless_operator_acks_its_cursor_only():
    state = KeyedAckState(cursor=17)
    assert state.to_state() == {"cursor": 17}
    assert KeyedAckState.from_state({"cursor": 17}) == state
    assert state.pinned is None and state.feedback_barrier_seq is None


# --- a sink --------------------------------------------------------------------------------------------


def test_sink_state_writes_todays_dict_and_reads_it_back():
    pending = Transaction(3, "p.ledger-0-3", 2, checkpoint_id=5)
    current = Transaction(4, "p.ledger-0-4", 2)
    state = SinkAckState(SinkSnapshot(current, (pending,), 5))
    today = {"twophase": {
        "current": {"seq": 4, "txn_id": "p.ledger-0-4", "epoch": 2, "checkpoint_id": None},
        "pending": [{"seq": 3, "txn_id": "p.ledger-0-3", "epoch": 2, "checkpoint_id": 5}],
        "next_seq": 5,
    }}
    assert state.to_state() == today
    assert SinkAckState.from_state(stored(today)) == state
    assert SinkAckState.held_in(stored(today)) == state


def test_only_a_sink_subtasks_state_holds_a_sink_state():
    assert SinkAckState.held_in({"table_version": 9, "key_groups": [0, 42], "cursor": 41}) is None
    with pytest.raises(KeyError):
        SinkAckState.from_state({"cursor": 41})


def test_a_keyed_position_lists_each_sink_subtasks_snapshot():
    snap = SinkSnapshot(Transaction(0, "p.ledger-0-0", 1), (), 1)
    position = KeyedPosition(cursor=11, state_version=3, sinks={"ledger": (snap, None)})
    assert position.sinks["ledger"] == (snap, None)
    assert KeyedPosition(cursor=-1, state_version=-1).sinks == {}


def test_a_source_states_offset_reads_alone_and_no_other_state_has_one():
    assert SourceAckState.offset_in(SourceAckState(4, 12, 11).to_state()) == 4
    assert SourceAckState.offset_in({"version": 3}) == 3  # the offset alone is enough to show it
    assert SourceAckState.offset_in(KeyedAckState(5, PinnedState(2, KeyGroupRange(0, 9))).to_state()) is None
    assert SourceAckState.offset_in(KeyedAckState(5).to_state()) is None
    assert SourceAckState.offset_in({}) is None
