"""The pipeline builder: partitioners, map(), and the errors that say what is wrong (no engine)."""

from __future__ import annotations

import pytest

from checkpoint_lib.pipeline import DeltaSink, DeltaSource, Pipeline

SCHEMA = {"id": "string", "account": "string", "amount": "long"}
OUT = (("id", "string"),)


class Stateless:
    def apply(self, records):
        return {"out": records}


class Keyed:
    state_schema = (("total", "long"),)
    order_by = ("src_version",)

    def apply(self, records, state, key):
        return records, {"out": records}


def base(parallelism: int = 2) -> Pipeline:
    return Pipeline("p").source(DeltaSource("in", SCHEMA), parallelism=parallelism)


def finish(p: Pipeline, op=None) -> Pipeline:
    return p.process(op or Stateless(), uid="op").sink("out", DeltaSink("out", OUT)).dead_letters("dlq")


@pytest.mark.parametrize("how", ["rebalance", "broadcast"])
def test_stateless_partitioners_set_the_operator_parallelism(how):
    p = finish(getattr(base(), how)(parallelism=5)).validate()
    assert (p.partitioning, p.keyed_parallelism, p.keyed) == (how, 5, False)
    assert p.operator_ids() == {"source": 2, "op": 5, "sink_out": 5}


def test_forward_takes_the_source_parallelism():
    p = finish(base(3).forward()).validate()
    assert (p.partitioning, p.keyed_parallelism) == ("forward", 3)


def test_forward_refuses_a_different_parallelism():
    p = finish(base(2).forward())
    p.keyed_parallelism = 4
    with pytest.raises(ValueError, match="forward\\(\\) needs the same parallelism on both sides: the source has 2"):
        p.validate()


def test_key_by_is_hash_and_keyed():
    p = finish(base().key_by("account", parallelism=3), Keyed()).validate()
    assert (p.partitioning, p.key, p.keyed) == ("hash", "account", True)


def test_keyed_state_needs_key_by():
    with pytest.raises(ValueError, match="keyed state is partitioned by key, so use key_by\\(\\) instead of rebalance"):
        base().rebalance(3).process(Keyed(), uid="op")


def test_process_needs_a_partitioner():
    with pytest.raises(ValueError, match="process\\(\\) needs a partitioner first"):
        base().process(Stateless(), uid="op")


def test_one_partitioner_per_pipeline():
    with pytest.raises(ValueError, match="already partitioned \\(rebalance\\)"):
        base().rebalance(2).key_by("account", 2)


def test_map_changes_the_record_schema_and_key_by_checks_it():
    p = base().map(lambda df: df, schema={"id": "string", "region": "string"})
    assert p.record_schema == {"id": "string", "region": "string"}
    with pytest.raises(ValueError, match="key 'account' is not a column of the records \\(\\['id', 'region'\\]\\)"):
        p.key_by("account", 2)
    assert base().map(lambda df: df).record_schema == SCHEMA  # no schema: same columns


def test_map_must_come_before_the_partitioner_and_be_callable():
    with pytest.raises(ValueError, match="map\\(\\) must come before the partitioner"):
        base().rebalance(2).map(lambda df: df)
    with pytest.raises(TypeError, match="map\\(\\) needs a function"):
        base().map("not a function")
    with pytest.raises(ValueError, match="map\\(\\) needs a source\\(\\) first"):
        Pipeline("p").map(lambda df: df)


def test_incomplete_pipeline_names_what_is_missing():
    with pytest.raises(ValueError, match="missing key_by\\(\\) or another partitioner, process\\(\\), dead_letters\\(\\), sink\\(\\)"):
        base().validate()


def test_with_parallelism_is_a_copy_and_forward_keeps_both_sides_equal():
    p = finish(base(2).key_by("account", 3), Keyed())
    q = p.with_parallelism(operator=5)
    assert p.parallelism_origin is None and q.parallelism_origin == "with_parallelism()"  # what a rescale names
    assert p.with_parallelism(operator=p.keyed_parallelism, origin="--parallelism 2").parallelism_origin is None
    assert (p.keyed_parallelism, q.keyed_parallelism, q.source_parallelism) == (3, 5, 2)
    assert q.sinks is not p.sinks and q.operator_ids()["sink_out"] == 5
    f = finish(base(2).forward()).with_parallelism(source=4)
    assert (f.source_parallelism, f.keyed_parallelism) == (4, 4)
    with pytest.raises(ValueError):
        p.with_parallelism(operator=0)


def test_two_sinks_on_one_table_are_refused():
    """Each sink rolls its target back on its own (a RESTORE per sink, the second computed after the
    first), which could bring back the other sink's later rows for the replay to duplicate: a table
    is the target of one sink, and never also the source or the dead letters."""
    p = base().key_by("account").process(Keyed(), uid="op").sink("a", DeltaSink("gold/out", OUT))
    with pytest.raises(ValueError, match=r"sinks 'a' and 'b' both write gold/out"):
        p.sink("b", DeltaSink("gold/./out", OUT))
    with pytest.raises(ValueError, match=r"the dead letters and sink 'a' both write gold/out"):
        p.dead_letters("gold/out")
    loop = base().key_by("account").process(Keyed(), uid="op").sink("a", DeltaSink("in", OUT)).dead_letters("dlq")
    with pytest.raises(ValueError, match=r"sink 'a' writes in, the pipeline's own source"):
        loop.validate()
