"""Flink's AlignedCheckpointsMassiveRandomTest, in every mode, with the coordinator's aborts.

Flink drives an aligned handler with two channels that each emit barriers on their own (one every
N buffers, the other at random), so the channels are far apart, and checks that it survives two
million events. Here each channel's barrier ids also skip now and then (its sender abandoned a
checkpoint), the channels are read at random speeds, time passes (with and without the timer),
and the coordinator aborts checkpoints at random moments: before their first barrier, during the
alignment, after the snapshot, more than once, or never (an abort that is lost). Every run is
checked with ``flink_gate.violations``: each record delivered once and in order, no snapshot after
its abort, and in the exactly-once modes consistent cuts (n >= m per channel; the channel state of
an unaligned snapshot is records m+1..n; an aligned one holds no record after a channel's barrier).
"""

from __future__ import annotations

import random

import pytest

from checkpoint_lib.core.barriers import Deliver, LogChannelState
from flink_gate import ALL_MODES, Gate, violations

SEEDS = range(40)


def channel_stream(rng: random.Random, channel: int, length: int) -> list[str]:
    """One channel's tokens: records and barriers (ids increasing, now and then skipping one)."""
    every = rng.randint(3, 30) if channel == 0 else None  # Flink's CountBarrier / RandomBarrier
    chance = rng.uniform(0.02, 0.3)
    tokens, cid = [], 0
    for i in range(1, length + 1):
        if (every and i % every == 0) or (not every and rng.random() < chance):
            cid += rng.choice((1, 1, 1, 2))
            tokens.append(f"{cid}@{channel}")
        else:
            tokens.append(str(channel))
    return tokens + [f"E{channel}"]


def random_script(rng: random.Random, channels: int, length: int) -> list[str]:
    """The channels' streams read at random speeds, with time passing and aborts in between."""
    streams = [channel_stream(rng, k, length) for k in range(channels)]
    speeds = [rng.uniform(0.05, 1.0) for _ in streams]
    script, newest = [], 0
    while any(streams):
        k = rng.choices(range(channels), [s if streams[i] else 0 for i, s in enumerate(speeds)])[0]
        token = streams[k].pop(0)
        script.append(token)
        if "@" in token:
            newest = max(newest, int(token.split("@")[0]))
        roll = rng.random()
        if roll < 0.04:
            script.append(f"X{rng.randint(1, newest + 3)}")  # early, late, repeated or never
        elif roll < 0.10:
            script.append(f"{rng.choice('Tt')}{rng.choice((0.01, 0.05, 0.2))}")
    return script


def run(mode: str, seed: int) -> Gate:
    rng = random.Random(seed)
    channels = rng.choice((2, 2, 3, 4))
    timeout = rng.choice((0.0, 0.05, 0.3)) if mode == "aligned_with_timeout" else None
    g = Gate(channels, mode, timeout=timeout, max_tracked=rng.choice((2, 50)))
    g.feed(" ".join(random_script(rng, channels, rng.randint(50, 300))))
    return g


@pytest.mark.parametrize("mode", ALL_MODES)
def test_with_two_channels_and_random_barriers(mode):
    """Flink: AlignedCheckpointsMassiveRandomTest.testWithTwoChannelsAndRandomBarriers.

    Random streams (two to four channels, far apart) in every mode: every run is consistent, and
    the runs do exercise what they should (snapshots, aborts, channel state).

    Differs: Flink runs one aligned handler for two million events and checks only that it keeps
    going; we run 40 smaller streams per mode (in milliseconds) and check every snapshot's cut."""
    runs = [run(mode, seed) for seed in SEEDS]
    for seed, g in zip(SEEDS, runs):
        assert violations(g) == [], f"seed {seed}"
        assert g.h.finished and g.h.held == 0 and g.h.blocked == set()
    assert sum(len(g.acknowledged) for g in runs) > 100
    assert sum(1 for g in runs for c in g.aborted_at if c in g.triggered) > 0  # aborted after a snapshot
    if mode in ("unaligned", "aligned_with_timeout"):
        assert sum(len(v) for g in runs for v in g.in_flight.values()) > 50
    if mode in ("aligned", "aligned_with_timeout"):
        assert sum(len(g.declined) for g in runs) > 10  # alignments abandoned for newer barriers


def _tampered(mode: str, seed: int, kind: type) -> list[str]:
    """``violations`` of a random run with its last effect of type ``kind`` removed, or, for a
    delivery, moved to the very start (before the snapshots of barriers it came after)."""
    g = run(mode, seed)
    found = [i for i, (_, e) in enumerate(g.log) if isinstance(e, kind)]
    if found:
        moved = g.log.pop(found[-1])
        if kind is Deliver:
            g.log.insert(0, moved)
    return violations(g)


@pytest.mark.parametrize(
    "mode,kind,breach",
    [("unaligned", LogChannelState, "channel state"), ("aligned", Deliver, "only")],
)
def test_the_checker_catches_an_inconsistent_cut(mode, kind, breach):
    """The witness can fail: a record missing from the channel state, or a record taken before a
    snapshot it came after, is reported."""
    reports = [v for seed in range(10) for v in _tampered(mode, seed, kind)]
    assert any(breach in v for v in reports)
