"""A completed checkpoint's acknowledgements as the JSON of its ``completed`` row (``acks_json``):
subtasks keyed ``"operator[index]"``, with a digest, and every structural check a restorable
checkpoint passes when it is read back (:func:`decode_acks` raises :class:`Corrupt`)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from typing import Any, Mapping

from ..core.checkpoints import CompletedCheckpoint
from ..core.errors import FailureReason
from ..core.recovery import SINK_STATE_KEY
from ..core.twophase import SinkSnapshot
from ..core.types import CheckpointKind, SubtaskAck, SubtaskId

ACKS_FORMAT_VERSION = 1
_SUBTASK = re.compile(r"^(.+)\[(\d+)\]$")


class Corrupt(ValueError):
    """A stored row or ack that does not decode."""


def ack_fields(ack: SubtaskAck) -> dict[str, Any]:
    """Every field of ``ack`` (its state as a plain dict)."""
    return {**dataclasses.asdict(ack), "state": dict(ack.state)}


def _digest(acks: Any, ack_times: Any) -> str:
    """SHA-256 of the acks as JSON: a row whose acks were edited or damaged into other valid JSON
    (e.g. an ack dropped) no longer matches it."""
    text = json.dumps({"acks": acks, "ack_times": ack_times}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def encode_acks(checkpoint: CompletedCheckpoint) -> str:
    """The checkpoint's ``acks`` and ``ack_times`` as JSON, subtasks keyed ``"operator[index]"``,
    with their ``digest``."""
    acks = {str(subtask): ack_fields(ack) for subtask, ack in checkpoint.acks.items()}
    ack_times = {str(subtask): t for subtask, t in checkpoint.ack_times.items()}
    try:
        return json.dumps(
            {"version": ACKS_FORMAT_VERSION, "acks": acks, "ack_times": ack_times,
             "digest": _digest(acks, ack_times)},
            sort_keys=True,
        )
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"checkpoint {checkpoint.checkpoint_id}: acks are not JSON-serialisable: {exc}"
        ) from exc


ACK_FIELDS = {f.name for f in dataclasses.fields(SubtaskAck)}


def subtask_id(text: Any) -> SubtaskId:
    m = _SUBTASK.match(text) if isinstance(text, str) else None
    if m is None:
        raise Corrupt(f"bad subtask key {text!r}")
    return SubtaskId(m.group(1), int(m.group(2)))


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise Corrupt(f"{what} is not an integer: {value!r}")
    return value


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Corrupt(f"{what} is not a number: {value!r}")
    return value


def decode_acks(text: Any) -> tuple[dict[SubtaskId, SubtaskAck], dict[SubtaskId, float]]:
    """Inverse of :func:`encode_acks`; raises ``ValueError`` on anything malformed."""
    if not isinstance(text, str):
        raise Corrupt("acks_json is missing")
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise Corrupt(f"acks_json does not parse: {exc}") from None
    if not isinstance(doc, dict) or doc.get("version") != ACKS_FORMAT_VERSION:
        raise Corrupt(f"acks_json has no known format version: {str(doc)[:80]!r}")
    raw_acks, raw_times = doc.get("acks"), doc.get("ack_times")
    if not isinstance(raw_acks, dict) or not isinstance(raw_times, dict):
        raise Corrupt("acks_json lacks 'acks' or 'ack_times'")
    if "digest" in doc and doc["digest"] != _digest(raw_acks, raw_times):
        raise Corrupt("acks_json does not match its digest (edited or damaged after it was written)")
    acks: dict[SubtaskId, SubtaskAck] = {}
    for key, a in raw_acks.items():
        if not isinstance(a, dict) or not isinstance(a.get("state"), dict):
            raise Corrupt(f"ack of {key!r} is malformed")
        unaligned = a.get("unaligned")
        if not isinstance(unaligned, bool):
            raise Corrupt(f"ack of {key!r}: unaligned is not a boolean")
        acks[subtask_id(key)] = SubtaskAck(
            state=a["state"],
            state_size_bytes=_int(a.get("state_size_bytes"), "state_size_bytes"),
            channel_state_rows=_int(a.get("channel_state_rows"), "channel_state_rows"),
            channel_state_bytes=_int(a.get("channel_state_bytes"), "channel_state_bytes"),
            alignment_ms=_number(a.get("alignment_ms"), "alignment_ms"),
            unaligned=unaligned,
            duration_ms=_number(a.get("duration_ms"), "duration_ms"),
        )
    times = {subtask_id(key): _number(t, "ack time") for key, t in raw_times.items()}
    _check_structure(acks)
    return acks, times


def _check_structure(acks: Mapping[SubtaskId, SubtaskAck]) -> None:
    """What every restorable checkpoint satisfies, digest or not: each 2PC sink ack holds a
    transaction snapshot that parses (with its ``current`` transaction), and each keyed operator's
    ``key_groups`` ranges tile ``0..n`` with no gap and no overlap (restore would otherwise leave
    some keys without state, silently)."""
    ranges: dict[str, list[Any]] = {}
    for subtask, ack in acks.items():
        if SINK_STATE_KEY in ack.state or subtask.sink is not None:
            try:
                SinkSnapshot.from_dict(ack.state[SINK_STATE_KEY])
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                raise Corrupt(f"ack of {subtask}: its sink transactions are missing or malformed ({exc!r})") from None
        if "key_groups" in ack.state:
            ranges.setdefault(subtask.operator, []).append(ack.state["key_groups"])
    for operator, spans in ranges.items():
        try:
            bounds = sorted((_int(lo, "key group"), _int(hi, "key group")) for lo, hi in spans)
        except (TypeError, ValueError):
            raise Corrupt(f"operator {operator!r}: malformed key_groups {spans!r}") from None
        expected = 0
        for lo, hi in bounds:
            if lo != expected or hi < lo:
                raise Corrupt(
                    f"operator {operator!r}: its subtasks' key groups {bounds} leave a gap or overlap "
                    f"at key group {expected}: restoring would lose or double keyed state"
                )
            expected = hi + 1


def failure_reason(value: Any) -> FailureReason | None:
    try:
        return FailureReason(value)
    except ValueError:
        return None


def decode_row(row: Mapping[str, Any]) -> CompletedCheckpoint:
    try:
        kind = CheckpointKind(row["kind"])
    except ValueError:
        raise Corrupt(f"unknown kind {row['kind']!r}") from None
    if row["completion_time"] is None:
        raise Corrupt("a completed checkpoint without completion_time")
    acks, ack_times = decode_acks(row["acks_json"])
    return CompletedCheckpoint(
        checkpoint_id=row["checkpoint_id"],
        kind=kind,
        trigger_time=row["trigger_time"],
        completion_time=row["completion_time"],
        acks=acks,
        ack_times=ack_times,
    )
