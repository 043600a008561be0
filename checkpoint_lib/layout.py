"""Where a pipeline's checkpoint data lives in a warehouse, and the rule for the names that become
path segments: the one definition every module, the CLI, the DAGs and the Airflow plugin use.

Pure: no Spark, no Delta. ::

    <warehouse>/_checkpoints/<pipeline>/   the control plane:
        checkpoints, epochs, acks,         the checkpoint store's tables (delta/store.py),
          sessions
        validations                        the validation log (quality/records.py),
        _ids/                              checkpoint-id reservation markers (delta/store.py),
        requests/                          checkpoint requests (checkpoint_requests.py),
        control/paused.json                the pause flag (control.py); and the
        channels/<sender>_<receiver>       data plane: the channel logs (spark/channels.py;
          or <s>.<output>-<r>.<input>        the qualified name: channel_names()),
        state/<operator>                   keyed state (spark/state.py),
        channel_state                      in-flight records of unaligned checkpoints,
        transactions/<sink>                what each sink transaction wrote (delta/pending.py),
        sources/manifest                   the files a landing folder registered (spark/landing.py)
    <warehouse>/_quality/<pipeline>/       GX context, Data Docs, report (quality/paths.py)
"""

from __future__ import annotations

import os
import re
from collections import Counter
from pathlib import Path
from typing import Any, Iterable

from .objectstore import ObjectUri, is_remote

NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
"""Pipeline, operator and sink names: each becomes a path segment and part of a Delta app id."""
CHECKPOINTS = "_checkpoints"


def check_name(kind: str, value: Any) -> str:
    """``value`` if it is a well-formed name (``^[a-z][a-z0-9_]{0,62}$``), else ValueError naming ``kind``."""
    if not isinstance(value, str) or not NAME.match(value):
        shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
        raise ValueError(f"{kind} {shown} must be lower-case letters, digits and _, starting with a letter "
                         "(at most 63)")
    return value


def check_pipeline_name(name: Any) -> str:
    """A well-formed pipeline name; :func:`checkpoint_lib.pipelines.get` says whether it is registered."""
    return check_name("pipeline name", name)


MAX_ID_DIGITS = 18
"""A checkpoint id fits in a Delta ``long``; longer input is refused before any int() of it."""
LATEST_WORDS = frozenset({"", "latest"})


def parse_checkpoint_id(value: Any) -> int | None:
    """A checkpoint id from user input: None for the latest (None, "", "latest"), else an int >= 1.

    >>> parse_checkpoint_id("7"), parse_checkpoint_id(7), parse_checkpoint_id("latest")
    (7, 7, None)

    Raises ``ValueError`` with a message fit for a form: not a number, path-like, too long,
    zero or negative, a bool. Whether the id exists is the store's question.
    """
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"checkpoint id must be 'latest' or a positive whole number, got {value!r}")
    if isinstance(value, int):
        if value < 1:
            raise ValueError(f"checkpoint id must be >= 1, got {value}")
        if len(str(value)) > MAX_ID_DIGITS:
            raise ValueError(f"checkpoint id is too long (at most {MAX_ID_DIGITS} digits)")
        return value
    if not isinstance(value, str):
        raise ValueError(f"checkpoint id must be 'latest' or a positive whole number, got {type(value).__name__}")
    text = value.strip()
    if text.lower() in LATEST_WORDS:
        return None
    if len(text) > MAX_ID_DIGITS:
        raise ValueError(f"checkpoint id is too long ({len(text)} characters; at most {MAX_ID_DIGITS} digits)")
    if any(c in text for c in "/\\") or ".." in text or text.startswith("~"):
        raise ValueError(f"checkpoint id {text!r} looks like a path: give 'latest' or a checkpoint number")
    if not text.isascii() or not text.isdigit():
        raise ValueError(f"checkpoint id {text!r} is not a number: give 'latest' or a checkpoint number")
    number = int(text)
    if number < 1:
        raise ValueError(f"checkpoint id must be >= 1, got {number}")
    return number


def location(path: str | os.PathLike[str]) -> Path | ObjectUri:
    """A location in a warehouse: a :class:`~pathlib.Path` on a filesystem, an
    :class:`~checkpoint_lib.objectstore.ObjectUri` on an object store (``s3://``, ``gs://``, ``az://``);
    both join with ``/``."""
    return ObjectUri(str(path)) if is_remote(str(path)) else Path(path)


def warehouse_location(warehouse: str | os.PathLike[str]) -> str:
    """The one normal form of a warehouse root (and of any folder given by a user: a landing
    folder, its manifest): an object-store URI as given (no trailing ``/``), a local path absolute
    (``~`` expanded)."""
    if is_remote(str(warehouse)):
        return str(ObjectUri(str(warehouse)))
    return os.path.abspath(os.path.expanduser(warehouse))


def below(path: str | os.PathLike[str], base: str | os.PathLike[str]) -> str:
    """The part of ``path`` under the folder ``base``, ``/``-joined (``s3://b/w/t/x`` under
    ``s3://b/w`` is ``t/x``; the same for local paths, taken as written); ValueError if ``path``
    is not under ``base``."""
    prefix = str(base).rstrip("/") + "/"
    if not str(path).startswith(prefix):
        raise ValueError(f"{path} is not under {base}")
    return str(path)[len(prefix):]


def app_prefix(pipeline: str) -> str:
    """What every Delta application id of ``pipeline`` starts with (sink stamps, the state table's fence)."""
    return f"{_APP_PREFIX}{pipeline}"


def pipeline_of(prefix: str) -> str:
    """The pipeline whose :func:`app_prefix` is ``prefix``."""
    return prefix.removeprefix(_APP_PREFIX)


_APP_PREFIX = "checkpoint_lib/"


def stamp_prefix(pipeline: str, sink: str) -> str:
    """What every commit stamp of ``pipeline``'s sink ``sink`` starts with (the current application
    id and the older per-epoch ones): the one definition, for the sink and for readers of its log."""
    return f"{app_prefix(pipeline)}/{sink}/"


KEY_GROUP = "key_group"
"""The keyed state tables' column holding each row's key group."""


def checkpoint_root(warehouse: str | os.PathLike[str], pipeline: str) -> Path | ObjectUri:
    """``<warehouse>/_checkpoints/<pipeline>`` (absolute when local), for a well-formed pipeline name."""
    return location(warehouse_location(warehouse)) / CHECKPOINTS / check_pipeline_name(pipeline)


CONTROL_TABLES = ("checkpoints", "acks", "sessions", "epochs", "validations")
"""The control plane's Delta tables under a checkpoint root: the checkpoint store's four
(``delta/store.py``) and the validation log (``quality/records.py``)."""


def control_table(root: str | os.PathLike[str], name: str) -> Path | ObjectUri:
    """Control table ``name`` (one of :data:`CONTROL_TABLES`) under the checkpoint root ``root``."""
    if name not in CONTROL_TABLES:
        raise ValueError(f"{name!r} is not a control table ({', '.join(CONTROL_TABLES)})")
    return location(root) / name


def reservation_markers(root: str | os.PathLike[str], namespace: str) -> Path | ObjectUri:
    """The folder of the create-if-absent markers of ``namespace`` (``ids``: every checkpoint id
    handed out; ``epochs`` and ``sessions``: an older version's, no longer written)."""
    return location(root) / f"_{namespace}"


def requests_folder(root: str | os.PathLike[str]) -> Path | ObjectUri:
    """The checkpoint requests (one file per request and per outcome: ``checkpoint_requests.py``)."""
    return location(root) / "requests"


def pause_flag(root: str | os.PathLike[str]) -> Path | ObjectUri:
    """The pipeline's pause flag, which its DAG tasks honour (``control.py``)."""
    return location(root) / "control" / "paused.json"


CHANNELS = "channels"
"""The folder of the channel logs under a checkpoint root (one Delta table per cut edge)."""


EDGE_STATE = "edge_state"
"""The folder of a graph's channel-state tables, one per cut edge (:func:`channel_state_table`)."""


DATA_PLANE = (CHANNELS, "state", "channel_state", EDGE_STATE, "transactions", "staging")
"""The data plane's folders under a checkpoint root (``staging``: sink staging tables of older versions)."""


PENDING_FOLDER = "ckpt"
"""Inside a table we append to by adding files (an append sink, the dead-letter table): the folder
Spark writes those files to before the commit that adds them (not hidden: once a file is no longer
part of the table, e.g. after an OPTIMIZE, or was never committed, VACUUM deletes it)."""


def channel_name(sender: str, receiver: str, output: str | None = None, input: int | None = None) -> str:
    """The folder name of an edge's channel log: ``<sender>_<receiver>`` (the short form: today's
    ``source_<uid>`` and a cycle's ``<uid>_<uid>``), or, given the sender's ``output`` and the
    receiver's ``input``, the qualified form ``<sender>.<output>-<receiver>.<input>``, which no
    other edge spells alike (names have neither ``.`` nor ``-``). Which form an edge of a graph
    gets is :func:`channel_names`' rule.

    >>> channel_name("source", "balance"), channel_name("orders", "join", "records", 2)
    ('source_balance', 'orders.records-join.2')
    """
    check_name("channel sender", sender)
    check_name("channel receiver", receiver)
    if output is None and input is None:
        return f"{sender}_{receiver}"
    if output is None or input is None:
        raise ValueError(f"channel {sender} -> {receiver}: give both the output and the input, or neither")
    check_name("channel output", output)
    if isinstance(input, bool) or not isinstance(input, int) or input < 1:
        raise ValueError(f"channel {sender} -> {receiver}: input must be a whole number >= 1, got {input!r}")
    return f"{sender}.{output}-{receiver}.{input}"


def channel_names(edges: Iterable[tuple[str, str, str, int]]) -> tuple[str, ...]:
    """The channel-log name of each edge ``(sender, output, receiver, input)`` of one graph, in
    order: the short form ``<sender>_<receiver>`` unless another edge spells it too (a second edge
    between the same two vertices, or names that meet at an ``_``: ``a_b -> c`` and ``a -> b_c``);
    then every edge spelling it gets the qualified form (:func:`channel_name`). So a linear
    pipeline keeps exactly the names its warehouses hold, and a name depends on the graph's edges
    alone: never on their order, on how the graph is split into processes, or on what lags. ValueError if
    two edges are the same channel (same four parts)."""
    edges = [tuple(e) for e in edges]
    for edge, n in Counter(edges).items():
        if n > 1:
            sender, output, receiver, input = edge
            raise ValueError(f"{n} edges are the channel {sender}.{output} -> {receiver}.{input}: one edge per "
                             "output and input")
    short = [channel_name(sender, receiver) for sender, _, receiver, _ in edges]
    spelled = Counter(short)
    return tuple(name if spelled[name] == 1 else channel_name(sender, receiver, output, input)
                 for name, (sender, output, receiver, input) in zip(short, edges))


def channel_log(root: str | os.PathLike[str], sender: str, receiver: str, output: str | None = None,
                input: int | None = None) -> Path | ObjectUri:
    """The channel log of the edge ``sender -> receiver`` (operator uids; ``source`` for a linear
    pipeline's sources), named by :func:`channel_name` (``output`` and ``input``: the qualified
    form, for an edge :func:`channel_names` qualifies)."""
    return location(root) / CHANNELS / channel_name(sender, receiver, output, input)


def state_table(root: str | os.PathLike[str], operator: str) -> Path | ObjectUri:
    """The keyed state table of operator ``operator``."""
    return location(root) / "state" / operator


def channel_state_table(root: str | os.PathLike[str], edge: str | None = None) -> Path | ObjectUri:
    """The in-flight records every unaligned checkpoint logged (by checkpoint id): a linear
    pipeline's, or (``edge``: a cut edge's channel-log name, :func:`channel_names`) those one edge
    of a graph carried, each edge its own table as its records have their own columns."""
    if edge is None:
        return location(root) / "channel_state"
    return location(root) / EDGE_STATE / edge


def sink_transactions(root: str | os.PathLike[str], sink: str) -> Path | ObjectUri:
    """What the transactions of sink ``sink`` wrote and not yet committed or aborted."""
    return location(root) / "transactions" / sink


def source_manifest(root: str | os.PathLike[str]) -> Path | ObjectUri:
    """The manifest table of a landing folder source (its version is the source offset)."""
    return location(root) / "sources" / "manifest"
