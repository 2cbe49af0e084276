"""Algorithm names for the simulator, without importing :mod:`commrt.algorithms`.

The algorithms depend on the simulator (``auto`` prices its candidates here), so
the simulator may not import them back, not even lazily: the registry
(:mod:`commrt.algorithms.registry`) hands its resolver in with
:func:`use_resolver` when it is imported, and ``import commrt`` always imports it.
Instances pass through untouched; the simulator asks them only for what it
prices (``select``, and ``closed_form`` or ``on_network`` where they have one).
"""

from __future__ import annotations

from typing import Callable

__all__ = ["use_resolver", "as_algorithm"]

_resolver: Callable[[str], object] | None = None


def use_resolver(resolve: Callable[[str], object]) -> None:
    """Let the simulator turn names (``"ring"``, ``"hd"``, ...) into algorithm instances."""
    global _resolver
    _resolver = resolve


def as_algorithm(algorithm):
    """``algorithm`` itself, or the instance its name stands for (the registry's
    resolver also rejects what is neither, with its own TypeError)."""
    if _resolver is not None:
        return _resolver(algorithm)
    if isinstance(algorithm, str):
        raise RuntimeError(
            f"commrt.sim cannot resolve the name {algorithm!r}: import "
            f"commrt.algorithms first, or pass an algorithm instance"
        )
    return algorithm
