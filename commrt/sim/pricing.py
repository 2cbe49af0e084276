"""Closed forms of the all-reduce algorithms on one link class, and pricing with them:
:func:`estimate` (closed form where exact, else a replay) and :func:`price_all` (skips
candidates whose lower bound already loses).

The algorithms are schedules only; which closed form prices which of them is decided
here, by its type (:func:`closed_form`). :class:`~commrt.sim.network.Network` offers
:func:`estimate` and :func:`price_all` as methods, so ``auto`` prices its candidates on
the network it holds without importing the simulator.
"""

from __future__ import annotations

import math
from typing import Sequence

from commrt.algorithms.halving_doubling import HalvingDoubling
from commrt.algorithms.pipelined_torus import PipelinedTorus2D
from commrt.algorithms.recursive_doubling import RecursiveDoubling
from commrt.algorithms.registry import resolve
from commrt.algorithms.ring import Ring
from commrt.algorithms.torus import Torus2D
from commrt.schedule import Schedule
from commrt.sim.links import Link
from commrt.sim.replay import replay

__all__ = [
    "ring_time",
    "halving_doubling_time",
    "recursive_doubling_time",
    "torus_time",
    "pipelined_torus_time",
    "closed_form",
    "estimate",
    "price_all",
]


def ring_time(p: int, nbytes: float, link: Link, gamma: float = 0.0) -> float:
    """Ring all-reduce: 2(p−1)α + 2(p−1)/p · nβ + (p−1)/p · nγ (γ: seconds per byte added)."""
    if p <= 1:
        return 0.0
    return 2 * (p - 1) * link.alpha_s + (p - 1) / p * nbytes * (2 * link.beta_s_per_byte + gamma)


def halving_doubling_time(p: int, nbytes: float, link: Link, gamma: float = 0.0) -> float:
    """Halving-doubling: 2·log2(q)·α + 2(q−1)/q · nβ + (q−1)/q · nγ on the q = 2^⌊log2 p⌋

    core ranks, plus, when p > q, the fold-in and fold-out of the whole buffer (2α + 2nβ + nγ).
    """
    if p <= 1:
        return 0.0
    q = 1 << (p.bit_length() - 1)
    t = 2 * math.log2(q) * link.alpha_s + (q - 1) / q * nbytes * (2 * link.beta_s_per_byte + gamma)
    if p > q:
        t += 2 * link.time(nbytes) + nbytes * gamma
    return t


def recursive_doubling_time(p: int, nbytes: float, link: Link, gamma: float = 0.0) -> float:
    """Recursive doubling: log2(q)·(α + nβ + nγ) on the q = 2^⌊log2 p⌋ core ranks (the whole

    buffer each step), plus, when p > q, the fold-in and fold-out of halving-doubling
    (2α + 2nβ + nγ).
    """
    if p <= 1:
        return 0.0
    q = 1 << (p.bit_length() - 1)
    fold = p > q
    return (math.log2(q) + 2 * fold) * link.time(nbytes) + (math.log2(q) + fold) * nbytes * gamma


def torus_time(rows: int, cols: int, nbytes: float, link: Link, gamma: float = 0.0) -> float:
    """2D torus all-reduce on X·Y ranks: 2(X+Y−2)α + 2(p−1)/p · nβ + (p−1)/p · nγ."""
    p = rows * cols
    if p <= 1:
        return 0.0
    per_byte = 2 * link.beta_s_per_byte + gamma
    return 2 * (rows + cols - 2) * link.alpha_s + (p - 1) / p * nbytes * per_byte


def pipelined_torus_time(
    alg: PipelinedTorus2D, world_size: int, nbytes: float, link: Link, gamma: float = 0.0
) -> float:
    """The pipelined torus on one link class: one α per step of its pipeline, and the
    ring's bytes and additions (nothing overlaps when one port carries every message)."""
    rows, cols = alg.shape(world_size)
    if rows * cols <= 1:
        return 0.0
    steps = alg.depth(rows, cols) + (alg.segments or alg.DEFAULT_SEGMENTS) - 1
    # torus_time's α term is for its own 2(X+Y-2) steps: take it out, count ours
    base = torus_time(rows, cols, nbytes, link, gamma) - 2 * (rows + cols - 2) * link.alpha_s
    return base + steps * link.alpha_s


def closed_form(
    algorithm, world_size: int, nbytes: float, link: Link, gamma: float = 0.0
) -> float | None:
    """The α-β(-γ) closed form for ``algorithm`` on one link class, or None if it has none.

    ``algorithm`` is an instance or a name. Ring, halving-doubling, recursive
    doubling, the 2D torus and the pipelined torus (and their subclasses) have
    one. A :class:`~commrt.algorithms.Torus2D` without a shape is priced on the
    grid it picks without a communicator (the most square one).
    """
    alg = resolve(algorithm)
    if isinstance(alg, Ring):
        return ring_time(world_size, nbytes, link, gamma)
    if isinstance(alg, HalvingDoubling):
        return halving_doubling_time(world_size, nbytes, link, gamma)
    if isinstance(alg, RecursiveDoubling):
        return recursive_doubling_time(world_size, nbytes, link, gamma)
    if isinstance(alg, Torus2D):
        return torus_time(*alg.shape(world_size), nbytes, link, gamma)
    if isinstance(alg, PipelinedTorus2D):
        return pipelined_torus_time(alg, world_size, nbytes, link, gamma)
    return None


def estimate(algorithm, world_size: int, nbytes: int, network, *, itemsize: int = 4) -> float:
    """Predicted all-reduce time on ``network`` (a :class:`~commrt.sim.Network`): the
    closed form where one link class carries every message and the algorithm has one,
    else a replay of its schedule (:func:`commrt.sim.simulate`)."""
    link = network.single_class(world_size)
    # the closed forms are α-β: with per-step overheads only the replay prices right
    if link is not None and network.overhead is None and not isinstance(algorithm, Schedule):
        t = closed_form(algorithm, world_size, nbytes, link, network.gamma_s_per_byte)
        if t is not None:
            return t
    return replay(algorithm, world_size, nbytes, network, itemsize=itemsize).time_s


def price_all(
    algorithms: Sequence, world_size: int, nbytes: int, network, *, itemsize: int = 4, price=None
) -> list[float | None]:
    """:func:`estimate` for each algorithm, skipping those that cannot be the fastest.

    Returns one entry per algorithm: its predicted time, or None when a
    lower bound (its closed form on a link with the network's smallest α
    and smallest β: no message can be faster) already exceeds the best time
    found. On a one-class network every closed form is exact and cheap, so
    nothing is skipped; nor with per-step overheads, which no α-β bound
    holds. ``price(alg)`` replaces :func:`estimate` (e.g. to share a memo).
    """
    price = price or (lambda a: estimate(a, world_size, nbytes, network, itemsize=itemsize))
    out: list[float | None] = [None] * len(algorithms)
    if network.single_class(world_size) is not None or network.overhead is not None:
        return [price(a) for a in algorithms]
    fast = Link(
        min(network.intra.alpha_s, network.inter.alpha_s),
        min(network.intra.beta_s_per_byte, network.inter.beta_s_per_byte),
    )
    bounds = []
    for a in algorithms:
        lb = closed_form(a, world_size, nbytes, fast, network.gamma_s_per_byte)
        bounds.append(0.0 if lb is None else lb * (1 - 1e-3))  # margin: chunk sizes round
    best = math.inf
    for i in sorted(range(len(algorithms)), key=lambda i: (bounds[i], i)):
        if bounds[i] > best:
            continue
        out[i] = price(algorithms[i])
        best = min(best, out[i])
    return out
