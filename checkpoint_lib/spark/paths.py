"""Paths as Spark takes them and as it reports them: one definition for every reader.

- Spark globs every path it is given: :func:`spark_path` escapes the glob characters, so a file
  named ``a[1].parquet`` is that file.
- Spark reports a row's file URI-encoded (``_metadata.file_path``: ``file:/w/t/export%202.parquet``,
  non-ASCII left as it is): :func:`decoded_metadata` decodes it, and :func:`path_below` gives the
  file's path relative to a table root, decoded, as ``unquote(add.path)`` of a Delta log gives
  it. A file is identified by that whole relative path, never by its base name: one flush of an
  append sink writes the same ``part-00000-<uuid>.c000.snappy.parquet`` into many folders.
"""

from __future__ import annotations

import os
import re
from urllib.parse import quote, urlparse

from pyspark.sql import Column
from pyspark.sql import functions as F

_GLOB_CHARS = re.compile(r"([\\\[\]{}*?])")
_SCHEME_AND_AUTHORITY = r"^[A-Za-z][A-Za-z0-9+.\-]*:(//[^/]*)?"


_URI_PATH_SAFE = "/!'()*,;:$&+=@"
"""What ``java.net.URI`` leaves unquoted in a path besides letters, digits and ``_-.~`` (its
unreserved and punctuation characters): Hadoop's ``Path`` builds a file's URI with it."""


def reported_path(path: str) -> str:
    """``_metadata.file_path`` as Spark reports it for the file at ``path`` (a local path, or a URI),
    spelled on the driver, so that a scan can match its rows to their files by comparing strings
    rather than decoding every row's path (:func:`path_below`, a regular expression and a URL
    decoding per row, cost a step of 1M rows about a quarter of its time). Right for the names
    Spark's own writers and Delta give their files; a name with characters ``java.net.URI`` leaves
    as they are and Python quotes (non-ASCII) is spelled otherwise, and its rows are then matched
    by :func:`path_below`."""
    m = re.match(_SCHEME_AND_AUTHORITY, path)
    if m is None:
        return "file:" + quote(os.path.abspath(path), safe=_URI_PATH_SAFE)
    prefix = "file:" if m.group(0) in ("file:", "file://") else m.group(0)
    return prefix + quote(re.sub("/+", "/", path[m.end():]) or "/", safe=_URI_PATH_SAFE)


def spark_path(path: str) -> str:
    """``path`` with Hadoop glob characters escaped: Spark globs every path it is given."""
    return _GLOB_CHARS.sub(r"\\\1", path)


def decoded_metadata(field: str) -> Column:
    """``_metadata.<field>`` (``file_name`` or ``file_path``) decoded. URI encoding never produces
    ``+``, so a ``+`` is literal and must survive ``url_decode`` (which would make it a space)."""
    return F.url_decode(F.replace(F.col(f"_metadata.{field}"), F.lit("+"), F.lit("%2B")))


def root_path(root: str) -> str:
    """The path part of a table root (a local path, made absolute as Spark qualifies it, or a URI's
    path), without a trailing slash: what :func:`path_below` strips."""
    if "://" in root:
        return urlparse(root).path.rstrip("/")
    return os.path.abspath(root).rstrip("/")


def path_below(root: str) -> Column:
    """Each row's file relative to ``root`` (decoded), or null for a file not below it: the scheme
    and authority Spark qualified the path with are dropped, whichever they are (``file:``,
    ``s3a://bucket``)."""
    path = F.regexp_replace(decoded_metadata("file_path"), _SCHEME_AND_AUTHORITY, "")
    prefix = root_path(root) + "/"
    return F.when(path.startswith(prefix), path.substr(F.lit(len(prefix) + 1), F.lit(1 << 30)))
