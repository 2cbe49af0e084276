"""Errors raised by commrt.

Every error that comes from waiting on another rank carries enough context to
find the culprit without a debugger: this rank, the peer, the algorithm, the
schedule step and (under GradientSync) the bucket.
"""

from __future__ import annotations


def did_you_mean(name, choices) -> str:
    """``"; did you mean 'ring'?"`` for the choice closest to a misspelt ``name``
    (difflib's), or ``""`` where none is close: the one hint of every "unknown algorithm"
    and "unknown backend" error, in the library and on the command line."""
    import difflib

    close = difflib.get_close_matches(str(name).lower(), [str(c) for c in choices], n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def named_keywords(target):
    """A function, or a class's ``__init__``, that answers a misspelt keyword argument as
    the command line answers a misspelt flag: ``TypeError: init() got an unexpected
    keyword argument 'timout'; did you mean 'timeout'?`` (without the chain). A call
    whose arguments bind costs one ``try`` more; a TypeError raised inside is untouched.
    """
    import functools
    import inspect

    func = target.__init__ if isinstance(target, type) else target
    name = target.__qualname__

    @functools.wraps(func)
    def call(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except TypeError:
            params = inspect.signature(func).parameters.values()
            if any(p.kind is p.VAR_KEYWORD for p in params):
                raise
            named = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
            unknown = next((k for k in kwargs if k not in named), None)
            if unknown is None:
                raise
            hint = did_you_mean(unknown, [n for n in named if n != "self"])
            raise TypeError(
                f"{name}() got an unexpected keyword argument {unknown!r}{hint}"
            ) from None

    if isinstance(target, type):
        target.__init__ = call
        return target
    return call


class CommError(RuntimeError):
    """Base class for communication failures raised by commrt.

    ``verdict``: the stall verdict's text where one was formed before the error was
    raised (:mod:`commrt.runtime.stall`); it is part of the message too. ``peer``,
    ``peers`` and ``where`` say what a one-line report (``commrt train``) and the
    abort-on-error hook name, where the failure knows it.
    """

    verdict: str | None = None
    #: the one peer rank the failure is about (the one a wait waited on, the one that left)
    peer: int | None = None
    #: the peer ranks of the failed operation (an engine's error names no single one)
    peers: list[int] | None = None
    #: where this rank waited: algorithm, schedule step and bucket ("" where unknown)
    where: str = ""

    def add_verdict(self, text: str) -> None:
        """Append the stall verdict ``text`` to this error's message (once)."""
        if self.verdict is None and self.args:
            self.verdict = text
            self.args = (f"{self.args[0]}\n{text}",) + self.args[1:]


class CommTimeoutError(CommError, TimeoutError):
    """A wait on a peer did not finish within the communicator's timeout.

    Attributes mirror the message so that callers (and tests) can inspect
    them: ``rank``, ``peer``, ``algorithm``, ``step``, ``bucket``,
    ``timeout_s`` and ``what`` (``"send"``, ``"recv"`` or ``"barrier"``).
    """

    def __init__(
        self,
        *,
        rank: int,
        peer: int | None,
        what: str,
        timeout_s: float,
        algorithm: str | None = None,
        step: int | None = None,
        num_steps: int | None = None,
        bucket: int | None = None,
    ):
        self.rank, self.peer, self.what = rank, peer, what
        self.timeout_s, self.algorithm = timeout_s, algorithm
        self.step, self.num_steps, self.bucket = step, num_steps, bucket
        where = []
        if algorithm is not None:
            where.append(f"algorithm {algorithm}")
        if step is not None:
            where.append(f"step {step}" + (f" of {num_steps}" if num_steps else ""))
        if bucket is not None:
            where.append(f"bucket {bucket}")
        peer_txt = f" {'to' if what == 'send' else 'from'} rank {peer}" if peer is not None else ""
        msg = (
            f"commrt: rank {rank} timed out after {timeout_s:g} s waiting for {what}{peer_txt}"
            + (f" ({', '.join(where)})" if where else "")
            + ". The peer may have crashed, stalled, or be running a different schedule; "
            "raise the timeout with commrt.init(timeout=...) if it is just slow."
        )
        super().__init__(msg)


class CollectiveMismatchError(CommError, ValueError):
    """Ranks called different collectives (found by the ``COMMRT_DEBUG`` check)."""


class ScheduleError(ValueError):
    """A schedule does not implement its collective, or is malformed."""


class PeerClosedError(CommError):
    """A peer closed its communicator (or its process exited) before a call this rank
    waits in: it will never take part, so the wait is over.

    Attributes: ``rank`` (this rank), ``peer`` (the rank that left), ``how``
    (``"closed its communicator"`` or ``"exited"``), ``unit`` (``"collective call"`` or
    ``"GradientSync step"``), ``peer_done`` (how many of those the peer finished, counted
    from 1) and ``waiting_in`` (the one this rank waits in), ``where`` (algorithm,
    schedule step and bucket, where known).
    """

    def __init__(
        self,
        *,
        rank: int,
        peer: int,
        how: str,
        unit: str,
        peer_done: int,
        waiting_in: int,
        where: str = "",
    ):
        self.rank, self.peer, self.how, self.unit = rank, peer, how, unit
        self.peer_done, self.waiting_in, self.where = peer_done, waiting_in, where
        super().__init__(
            f"commrt: rank {peer} {how} after {unit} {peer_done} while rank {rank} waits in "
            f"{unit} {waiting_in}" + (f" ({where})" if where else "") + f": rank {peer} will "
            "not take part again. Make every rank run the same number of steps, or wrap the "
            "training loop in GradientSync.join(optimizer) (under DDP: `with ddp_model.join():`) "
            "so that ranks which run out of data shadow the others' steps."
        )

    def at(self, where: str) -> "PeerClosedError":
        """The same error, naming where this rank waited (algorithm, step, bucket)."""
        if self.where or not where:
            return self
        return PeerClosedError(
            rank=self.rank,
            peer=self.peer,
            how=self.how,
            unit=self.unit,
            peer_done=self.peer_done,
            waiting_in=self.waiting_in,
            where=where,
        )


class PeerFailedError(CommError):
    """A peer ended after an error (its farewell says so) while this rank waits on it: it
    will finish nothing more. Where the peer knew which rank its failure began at (the
    stall verdict's root, or the peer its own error named), ``cause`` names that rank, so
    that an error follows the chain to it rather than blaming the rank that left.

    Attributes: ``rank`` (this rank), ``peer`` (the rank that failed), ``cause`` (the rank
    the failure began at, or None where unknown), ``unit`` and ``waiting_in`` (as
    :class:`PeerClosedError`'s), ``where``.
    """

    def __init__(
        self, *, rank: int, peer: int, cause: int | None, unit: str, waiting_in: int,
        where: str = "",
    ):  # fmt: skip
        self.rank, self.peer, self.cause, self.unit = rank, peer, cause, unit
        self.waiting_in, self.where = waiting_in, where
        began = f"at rank {cause}" if cause is not None else f"at rank {peer} itself"
        read = f"rank {cause if cause is not None else peer}'s output says why"
        super().__init__(
            f"commrt: rank {peer} ended after a failure that began {began}, while rank "
            f"{rank} waits in {unit} {waiting_in}" + (f" ({where})" if where else "")
            + f": {read}."
        )  # fmt: skip

    def at(self, where: str) -> "PeerFailedError":
        """The same error, naming where this rank waited (algorithm, step, bucket)."""
        if self.where or not where:
            return self
        return PeerFailedError(
            rank=self.rank, peer=self.peer, cause=self.cause, unit=self.unit,
            waiting_in=self.waiting_in, where=where,
        )  # fmt: skip
