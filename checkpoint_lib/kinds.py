"""One convention for "a kind of X is one file": declarations' types mapped to the factory of what
runs them (a source's reader, a sink's writer), the most specific registered type winning, so a
subclass of a declaration can have its own."""

from __future__ import annotations

from typing import Any, Callable, Generic, TypeVar

Built = TypeVar("Built")


class Kinds(Generic[Built]):
    """``noun`` names what is declared (``"source"``), ``role`` what the factory builds
    (``"reader"``), ``register`` the function a user calls (for the error message)."""

    def __init__(self, noun: str, role: str, register: str):
        self.noun, self.role, self.register_name = noun, role, register
        self._factories: dict[type, Callable[[Any, Any], Built]] = {}

    def register(self, declaration: type, factory: Callable[[Any, Any], Built]) -> None:
        self._factories[declaration] = factory

    def build(self, declaration: Any, site: Any, owner: str) -> Built:
        """``factory(declaration, site)`` of the most specific type of ``declaration`` registered;
        a TypeError naming ``owner``, the type and the known kinds otherwise."""
        for kind in type(declaration).__mro__:
            if kind in self._factories:
                return self._factories[kind](declaration, site)
        known = ", ".join(sorted(k.__name__ for k in self._factories))  # whatever order modules were imported in
        raise TypeError(f"{owner}: no {self.role} for a {self.noun} of type {type(declaration).__name__} "
                        f"(known: {known}; see {self.register_name})")
