import pytest
from hypothesis import given
from hypothesis import strategies as st

from checkpoint_lib.core.keygroups import KeyGroupRange, range_for_subtask, subtask_for_key_group


@given(st.integers(1, 128), st.integers(1, 128))
def test_ranges_partition_the_key_groups_and_invert(parallelism, max_parallelism):
    if parallelism > max_parallelism:
        return
    ranges = [range_for_subtask(i, parallelism, max_parallelism) for i in range(parallelism)]
    covered = [kg for r in ranges for kg in range(r.start, r.end + 1)]
    assert covered == list(range(max_parallelism))  # contiguous, disjoint, complete
    for i, r in enumerate(ranges):
        assert all(subtask_for_key_group(kg, parallelism, max_parallelism) == i for kg in range(r.start, r.end + 1))


def test_flink_layout_for_3_of_128():
    assert [range_for_subtask(i, 3).to_list() for i in range(3)] == [[0, 42], [43, 85], [86, 127]]


def test_validation():
    with pytest.raises(ValueError, match="parallelism must be in 1..128, got 0"):
        range_for_subtask(0, 0)
    with pytest.raises(ValueError, match="subtask index 3 out of range for parallelism 3"):
        range_for_subtask(3, 3)
    with pytest.raises(ValueError, match="key group 128 out of range 0..127"):
        subtask_for_key_group(128, 2)
    assert 5 in KeyGroupRange(0, 5) and 6 not in KeyGroupRange(0, 5) and len(KeyGroupRange(3, 2)) == 0
