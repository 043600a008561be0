"""Planning a graph's step across its sources (``graph/steps.py``): one commit time cuts them all."""

from __future__ import annotations

from checkpoint_lib.delta.log import AddedFile
from checkpoint_lib.graph.steps import Proposal, plan_step


def files(*versions: int) -> tuple[AddedFile, ...]:
    return tuple(AddedFile(v, f"part-{v}.parquet", 10, 1) for v in versions)


def test_every_source_is_cut_at_the_earliest_end_of_a_full_proposal():
    a = Proposal(files(1, 2), 2, True, {1: 10, 2: 20})  # full: more landed after version 2
    b = Proposal(files(5, 6, 7), 7, False, {5: 5, 6: 15, 7: 25})  # all it has
    assert plan_step({"a": a, "b": b, "c": None}) == {"a": (list(a.step), 2), "b": (list(b.step[:2]), 6)}


def test_whole_versions_in_order_stop_at_the_first_one_after_the_cut():
    a = Proposal(files(1), 1, True, {1: 10})
    b = Proposal(files(3, 4, 5), 5, False, {3: 5, 4: 12, 5: 8})  # 5 committed "before" 4: not read before 4
    assert plan_step({"a": a, "b": b}) == {"a": (list(a.step), 1), "b": (list(b.step[:1]), 3)}


def test_without_a_full_proposal_or_without_commit_times_every_source_reads_what_it_proposed():
    a = Proposal(files(1, 2), 2, False, {1: 10, 2: 20})
    b = Proposal(files(3), 3, True, None)  # its kind does not say when versions were committed
    assert plan_step({"a": a, "b": b}) == {"a": (list(a.step), 2), "b": (list(b.step), 3)}
    c = Proposal(files(7), 7, True, {7: 1})
    assert plan_step({"a": a, "b": b, "c": c})["b"] == (list(b.step), 3)


def test_a_source_with_nothing_before_the_cut_waits_and_the_cut_always_moves_something():
    a = Proposal(files(1), 1, True, {1: 10})
    b = Proposal(files(2), 2, False, {2: 30})
    assert plan_step({"a": a, "b": b}) == {"a": (list(a.step), 1)}
    skewed = Proposal(files(4, 5), 5, True, {4: 50, 5: 40})  # out of order: its own end precedes its start
    assert plan_step({"s": skewed}) == {"s": (list(skewed.step), 5)}
