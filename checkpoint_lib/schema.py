"""The one schema notation of a pipeline declaration. Pure: imports no engine.

Wherever a pipeline declares columns (a source, a ``map()``, a sink, an operator's state), it may
write them the way Spark users do:

- a Spark DDL string: ``"order_id string, amount decimal(18,2), tags map<string,long>"``;
- a ``pyspark.sql.types.StructType`` (any object with ``fields`` of ``name`` and ``dataType``);
- a mapping ``{"order_id": "string"}`` or ``(name, type)`` pairs.

:func:`columns` turns each into ``(name, type)`` pairs of Spark SQL type strings, which is what the
rest of the library reads.

>>> columns("id string, amount decimal(18,2), tags map<string, long>")
(('id', 'string'), ('amount', 'decimal(18,2)'), ('tags', 'map<string, long>'))
>>> columns({"id": "string"})
(('id', 'string'),)
"""

from __future__ import annotations

import re
from typing import Any, Mapping

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

_DDL_COLUMN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\s*(?::\s*|\s+)(\S.*)$", re.S)

Columns = tuple[tuple[str, str], ...]


def _split_top_level(text: str) -> list[str]:
    """``text`` split at the commas outside ``<...>`` and ``(...)``."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced {ch!r} in schema {text!r}")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"unbalanced brackets in schema {text!r}")
    parts.append(text[start:])
    return parts


def _pair(name: Any, type_: Any, where: str) -> tuple[str, str]:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"{where}: {name!r} is not a column name (letters, digits and _)")
    if not isinstance(type_, str) or not type_.strip():
        raise ValueError(f"{where}: column {name!r} needs a type, e.g. 'string' or 'long'")
    return name, type_.strip()


def columns(spec: Any, where: str = "schema") -> Columns:
    """``spec`` (a DDL string, a StructType, a mapping or pairs) as ``(name, type)`` pairs.
    Raises ValueError naming ``where`` on a malformed or empty schema or a repeated column."""
    if isinstance(spec, str):
        pairs = []
        for part in _split_top_level(spec):
            text = part.strip()
            if not text:
                continue
            m = _DDL_COLUMN.match(text)
            if not m:
                raise ValueError(f"{where}: {text!r} needs a name and a type, e.g. 'amount long'")
            name, type_ = m.group(1), m.group(2)
            pairs.append(_pair(name, type_, where))
    elif hasattr(spec, "fields") and not isinstance(spec, Mapping):  # a Spark StructType
        pairs = [_pair(f.name, f.dataType.simpleString(), where) for f in spec.fields]
    elif isinstance(spec, Mapping):
        pairs = [_pair(n, t, where) for n, t in spec.items()]
    else:
        try:
            pairs = [_pair(n, t, where) for n, t in spec]
        except (TypeError, ValueError) as exc:
            if isinstance(exc, ValueError) and where in str(exc):
                raise
            raise ValueError(f"{where}: {spec!r} is not a schema (a DDL string, a StructType, a mapping "
                             "or (name, type) pairs)") from None
    if not pairs:
        raise ValueError(f"{where}: the schema lists no column")
    seen: set[str] = set()
    for name, _ in pairs:
        if name.lower() in seen:
            raise ValueError(f"{where}: column {name!r} is declared twice")
        seen.add(name.lower())
    return tuple(pairs)


def as_dict(spec: Any, where: str = "schema") -> dict[str, str]:
    """:func:`columns` as a mapping name -> type (the form of source schemas)."""
    return dict(columns(spec, where))


class SchemaMismatchError(ValueError):
    """A source table's schema does not have the columns and types the pipeline needs."""
