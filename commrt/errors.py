"""Errors raised by commrt, and how they reach the user.

Every error that comes from waiting on another rank carries enough context to
find the culprit without a debugger: this rank, the peer, the algorithm, the
schedule step and (under GradientSync) the bucket.

An error that leaves commrt through a public call (:func:`api_boundary`) shows the
user's frames and commrt's message, as JAX and TensorFlow filter their own frames out of
their users' tracebacks: the twenty frames of commrt's progress thread, executor and
transport under ``sync.step(opt)`` say nothing a user can act on, and bury the message.
``COMMRT_TRACEBACK=full`` shows the error as raised, chain and all.
"""

from __future__ import annotations

import functools
import os
import types

from commrt import settings

#: the note a shortened error ends with, where more than a wrapper's frame was left out:
#: two lines, each within 80 columns, as every message commrt prints
SHORTENED = (
    "(commrt left out its own frames and the errors behind this one;\n"
    f" {settings.TRACEBACK.name}=full shows them)"
)


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
    keyword argument 'timout'; did you mean 'timeout'?`` (without the chain, and without
    this wrapper's frame). A call whose arguments bind costs one ``try`` more; any other
    error raised inside leaves as through :func:`api_boundary`.
    """
    import inspect

    func = target.__init__ if isinstance(target, type) else target
    name = target.__qualname__

    @functools.wraps(func)
    def call(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except TypeError as error:
            better = _keyword_error(inspect.signature(func), name, kwargs)
            if better is None:
                shorten(error)
                raise
            try:
                raise better from None
            except TypeError:
                # a bare raise adds no frame of its own: the user's call is the last one
                shorten(better)
                raise
        except Exception as error:
            shorten(error)
            raise

    if isinstance(target, type):
        target.__init__ = call
        return target
    return call


def _keyword_error(signature, name: str, kwargs: dict) -> TypeError | None:
    """The TypeError that names a keyword of ``kwargs`` that ``signature`` does not take,
    with the one it may have meant; None where every keyword is known (the TypeError came
    from inside) or the signature takes any keyword."""
    params = signature.parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    named = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    unknown = next((k for k in kwargs if k not in named), None)
    if unknown is None:
        return None
    hint = did_you_mean(unknown, [n for n in named if n != "self"])
    return TypeError(f"{name}() got an unexpected keyword argument {unknown!r}{hint}")


def api_boundary(func):
    """``func`` as a public call: an exception that leaves it is :func:`shorten`-ed first,
    so that the user sees the frames down to their own call of ``func`` and commrt's
    message, not the runtime underneath. Costs one frame per call; nothing while no error
    leaves."""

    @functools.wraps(func)
    def boundary(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except Exception as error:
            shorten(error)
            raise  # bare: it adds no frame of this wrapper's

    return boundary


def shorten(error: BaseException) -> None:
    """Leave commrt's frames out of ``error``'s traceback, and the errors behind it that
    commrt raised or passed through (a transport's ``ConnectionResetError`` under a
    :class:`CommError`), keeping the first of its chain that is the user's own. A line
    (:data:`SHORTENED`) says so, where more than a wrapper's frame went. Nothing changes
    under ``COMMRT_TRACEBACK=full``; idempotent, so nested public calls may each shorten."""
    try:
        mode = settings.TRACEBACK.get()
    except ValueError as e:  # a bad value must not hide the error being shown
        _note(error, f"({e}: the traceback is shown as raised)")
        return
    if mode != "short":
        return
    kept, hid_frames = _user_frames(error.__traceback__)
    error.__traceback__ = kept
    if _drop_commrt_chain(error) or hid_frames:
        _note(error, SHORTENED)


def _note(error: BaseException, line: str) -> None:
    if line not in getattr(error, "__notes__", ()):
        error.add_note(line)


def _user_frames(tb: types.TracebackType | None) -> tuple[types.TracebackType | None, bool]:
    """``tb`` without commrt's frames (the same object where it has none), and whether a
    frame other than a public call's wrapper was among those left out."""
    entries = []
    while tb is not None:
        entries.append(tb)
        tb = tb.tb_next
    if not any(_in_commrt(t.tb_frame.f_code.co_filename) for t in entries):
        return (entries[0] if entries else None), False
    out, hid = None, False
    for t in reversed(entries):
        code = t.tb_frame.f_code
        if _in_commrt(code.co_filename):
            hid = hid or code not in _WRAPPERS
        else:
            out = types.TracebackType(out, t.tb_frame, t.tb_lasti, t.tb_lineno)
    return out, hid


def _chained(error: BaseException) -> BaseException | None:
    """The error printed above ``error`` in a traceback (its cause, else its context)."""
    if error.__cause__ is not None:
        return error.__cause__
    return None if error.__suppress_context__ else error.__context__


def _drop_commrt_chain(error: BaseException) -> bool:
    """Unlink the errors chained under ``error`` whose tracebacks pass through commrt, up
    to the first that does not (the user's own error, which a failure in commrt's
    cleanup came during); whether any went."""
    first = kept = _chained(error)
    seen = set()
    while kept is not None and id(kept) not in seen and _through_commrt(kept):
        seen.add(id(kept))
        kept = _chained(kept)
    if kept is first:
        return False
    error.__cause__ = None
    if kept is not None:
        error.__context__ = kept
    error.__suppress_context__ = kept is None
    return True


def _through_commrt(error: BaseException) -> bool:
    tb = error.__traceback__
    while tb is not None:
        if _in_commrt(tb.tb_frame.f_code.co_filename):
            return True
        tb = tb.tb_next
    return False


@functools.lru_cache(maxsize=1)
def _commrt_dirs() -> tuple[str, ...]:
    """The folders of commrt's code: the package, and those of ``commrt.algorithms`` and
    ``commrt.kernels`` (found without importing them: in a source tree they lie beside
    it)."""
    import importlib.util

    dirs = [os.path.dirname(os.path.abspath(__file__))]
    for name in ("commrt.algorithms", "commrt.kernels"):
        spec = importlib.util.find_spec(name)
        dirs += list(spec.submodule_search_locations or ()) if spec is not None else []
    return tuple(os.path.realpath(d) + os.sep for d in dirs)


@functools.lru_cache(maxsize=1024)
def _in_commrt(filename: str) -> bool:
    """Whether code in ``filename`` is commrt's (an error leaves it through a public call)."""
    return not filename.startswith("<") and os.path.realpath(filename).startswith(_commrt_dirs())


def _nothing() -> None:
    pass


#: the wrappers' own code: leaving out only their frames is not worth a line
_WRAPPERS = frozenset({api_boundary(_nothing).__code__, named_keywords(_nothing).__code__})


class CommError(RuntimeError):
    """Base class for communication failures raised by commrt.

    ``verdict``: the stall verdict's text where one was formed before the error was
    raised (:mod:`commrt.diagnosis.stall`); it is part of the message too. ``peer``,
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


#: how a timeout error tells its reader to raise the timeout; a command line with a flag of
#: its own says that instead (``commrt train`` says ``--timeout``)
RAISE_TIMEOUT = "commrt.init(timeout=...)"


class CommTimeoutError(CommError, TimeoutError):
    """A wait on a peer did not finish within the communicator's timeout.

    Attributes mirror the message so that callers (and tests) can inspect
    them: ``rank``, ``peer``, ``algorithm``, ``step``, ``bucket``,
    ``timeout_s`` and ``what`` (``"send"``, ``"recv"`` or ``"barrier"``);
    ``where`` joins algorithm, step and bucket ("" where none is known). ``message``: what
    a subclass says instead of the wait's own line.
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
        message: str | None = None,
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
        self.where = ", ".join(where)  # (CommError declares it: a one-line report names it)
        peer_txt = f" {'to' if what == 'send' else 'from'} rank {peer}" if peer is not None else ""
        msg = (
            f"commrt: rank {rank} timed out after {timeout_s:g} s waiting for {what}{peer_txt}"
            + (f" ({', '.join(where)})" if where else "")
            + ". The peer may have crashed, stalled, or be running a different schedule; "
            f"raise the timeout with {RAISE_TIMEOUT} if it is just slow."
        )
        super().__init__(msg if message is None else message)


class RendezvousTimeoutError(CommTimeoutError):
    """The ranks did not all meet at the rendezvous (``commrt.init``) within the timeout.

    On the rank that hosts the store, ``joined`` of ``world_size`` ranks came; on another
    rank (``joined`` None) the host itself was not reached at ``address``. A rank that
    never came crashed or was stopped (SIGSTOP, a debugger) before it did, is still
    starting, or was pointed elsewhere (MASTER_ADDR, MASTER_PORT). ``what`` is
    ``"rendezvous"``; ``peer`` is None (the store does not say which rank is missing).
    """

    def __init__(self, *, rank: int, timeout_s: float, address: str, world_size: int, joined=None):
        self.address, self.world_size, self.joined = address, world_size, joined
        if joined is None:
            said = f"reaching the rendezvous store at {address}, which rank 0 or the launcher"
            said += " hosts: the host may have crashed or be stopped, or the address be wrong"
        else:
            said = f"at the rendezvous on {address}: {joined} of {world_size} ranks came;"
            said += " the others may have crashed, be stopped, still be starting or be"
            said += " pointed elsewhere"
        super().__init__(
            rank=rank,
            peer=None,
            what="rendezvous",
            timeout_s=timeout_s,
            message=f"commrt: rank {rank} timed out after {timeout_s:g} s {said} (MASTER_ADDR, "
            f"MASTER_PORT). Raise the timeout with {RAISE_TIMEOUT} if start-up is just slow.",
        )


class CollectiveMismatchError(CommError, ValueError):
    """Ranks called different collectives (found by the ``COMMRT_DEBUG`` check)."""


class ScheduleError(ValueError):
    """A schedule does not implement its collective, or is malformed."""


#: the number of each unit's first (a unit not here counts from 1, as "call 7" is the
#: seventh): GradientSync steps count from 0, as its stats, its trace and a loop over
#: range() count them, so that an error names the step the user's loop index names
FIRST_NUMBER = {"GradientSync step": 0}


class PeerClosedError(CommError):
    """A peer closed its communicator (or its process exited) before a call this rank
    waits in: it will never take part, so the wait is over.

    Attributes: ``rank`` (this rank), ``peer`` (the rank that left), ``how``
    (``"closed its communicator"`` or ``"exited"``), ``unit`` (``"collective call"`` or
    ``"GradientSync step"``), ``peer_done`` (the last of those the peer finished) and
    ``waiting_in`` (the one this rank waits in), numbered as :data:`FIRST_NUMBER` says,
    ``where`` (algorithm, schedule step and bucket, where known).
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
        first = FIRST_NUMBER.get(unit, 1)
        done = f"after {unit} {peer_done}" if peer_done >= first else f"before {unit} {first}"
        super().__init__(
            f"commrt: rank {peer} {how} {done} while rank {rank} waits in "
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
    the failure began at: ``peer`` itself where an error not commrt's ended it; None where
    unknown), ``unit`` and ``waiting_in`` (as
    :class:`PeerClosedError`'s), ``where``.
    """

    def __init__(
        self,
        *,
        rank: int,
        peer: int,
        cause: int | None,
        unit: str,
        waiting_in: int,
        where: str = "",
    ):
        self.rank, self.peer, self.cause, self.unit = rank, peer, cause, unit
        self.waiting_in, self.where = waiting_in, where
        began = f"at rank {peer} itself" if cause in (None, peer) else f"at rank {cause}"
        read = f"rank {cause if cause is not None else peer}'s output says why"
        super().__init__(
            f"commrt: rank {peer} ended after a failure that began {began}, while rank "
            f"{rank} waits in {unit} {waiting_in}" + (f" ({where})" if where else "") + f": {read}."
        )

    def at(self, where: str) -> "PeerFailedError":
        """The same error, naming where this rank waited (algorithm, step, bucket)."""
        if self.where or not where:
            return self
        return PeerFailedError(
            rank=self.rank,
            peer=self.peer,
            cause=self.cause,
            unit=self.unit,
            waiting_in=self.waiting_in,
            where=where,
        )
