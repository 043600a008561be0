"""Key groups: how keyed state is split among parallel subtasks (Flink's KeyGroupRangeAssignment).

A key hashes to one of ``max_parallelism`` key groups; subtask ``i`` of ``p`` owns a contiguous
range of them. State is stored by key group, so a checkpoint taken at parallelism ``p`` can be
restored at any other parallelism up to ``max_parallelism`` by re-assigning ranges.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MAX_PARALLELISM = 128


@dataclass(frozen=True)
class KeyGroupRange:
    start: int
    end: int
    """Inclusive, as in Flink; empty when end < start."""

    def __contains__(self, key_group: int) -> bool:
        return self.start <= key_group <= self.end

    def __len__(self) -> int:
        return max(0, self.end - self.start + 1)

    def to_list(self) -> list[int]:
        return [self.start, self.end]


def check_parallelism(parallelism: int, max_parallelism: int = DEFAULT_MAX_PARALLELISM) -> None:
    if not 1 <= parallelism <= max_parallelism:
        raise ValueError(f"parallelism must be in 1..{max_parallelism}, got {parallelism}")


def range_for_subtask(index: int, parallelism: int, max_parallelism: int = DEFAULT_MAX_PARALLELISM) -> KeyGroupRange:
    """The key groups subtask ``index`` of ``parallelism`` owns."""
    check_parallelism(parallelism, max_parallelism)
    if not 0 <= index < parallelism:
        raise ValueError(f"subtask index {index} out of range for parallelism {parallelism}")
    start = (index * max_parallelism + parallelism - 1) // parallelism
    end = ((index + 1) * max_parallelism - 1) // parallelism
    return KeyGroupRange(start, end)


def subtask_for_key_group(key_group: int, parallelism: int, max_parallelism: int = DEFAULT_MAX_PARALLELISM) -> int:
    """The subtask that owns ``key_group`` (the inverse of :func:`range_for_subtask`)."""
    check_parallelism(parallelism, max_parallelism)
    if not 0 <= key_group < max_parallelism:
        raise ValueError(f"key group {key_group} out of range 0..{max_parallelism - 1}")
    return key_group * parallelism // max_parallelism
