"""The reference pipelines, registered by name (``ckpt run payments``)."""

from __future__ import annotations

from typing import Callable

from ..pipeline import Pipeline


def _payments() -> Pipeline:
    from .payments import build

    return build()


def _transfers() -> Pipeline:
    from .transfers import build

    return build()


REGISTRY: dict[str, Callable[[], Pipeline]] = {"payments": _payments, "transfers": _transfers}


def get(name: str) -> Pipeline:
    try:
        factory = REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown pipeline {name!r}; known: {', '.join(sorted(REGISTRY))}") from None
    return factory().validate()
