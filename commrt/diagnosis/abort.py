"""Ending the whole job when a rank fails: the abort-on-error hook and :func:`end_job`.

"No process outlives its error": a rank that dies of an uncaught commrt
error ends every rank (``MPI_Abort`` under MPI, exit status 1 otherwise), so
a stalled peer never leaves the others stuck in shutdown. Before it does, a
communicator's stall watch (:mod:`commrt.diagnosis.stall`) has every rank print
the one verdict of who is stuck and where. Re-exported by
:mod:`commrt.runtime.communicator`, where these names were first.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import traceback
import weakref

from commrt import settings
from commrt.diagnosis.departures import FAILED
from commrt.errors import (
    CollectiveMismatchError,
    CommError,
    CommTimeoutError,
    PeerClosedError,
    PeerFailedError,
    shorten,
)
from commrt.transports.processes import MPICH_SHM, unlink_mapped

ABORT_GRACE_S = settings.Seconds(
    0.5,
    "how long an aborting rank waits for the launcher to forward its last output",
    "the abort-on-error hook",
    settings.STALLS,
)


class _AbortOnError:
    """A ``sys.excepthook`` that ends the whole job when an exception escapes.

    Without it, a rank that dies of an uncaught error (a CommTimeoutError
    because a peer stopped, say) leaves the job hanging: MPI's shutdown
    waits for the stopped peer forever, and gloo peers wait for messages
    that never come until their own timeout. After the usual traceback,
    under MPI this calls ``MPI_Abort`` (as ``python -m mpi4py`` does),
    which makes the launcher kill every rank; otherwise the process exits
    at once with status 1, without running exit handlers that could block
    on the dead job. Installed once per process by :func:`init` and active
    while a multi-rank communicator that asked for it is open.
    """

    def __init__(self, previous):
        self.previous = previous
        self.comms: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # comm: advice

    #: the hook installed last in this process, or None. Process-wide because what it
    #: mirrors is: ``sys.excepthook`` is one per process, whatever the communicators. It is
    #: kept here because a hook installed after it (torch.distributed's) may wrap it, so
    #: ``sys.excepthook`` no longer is it, and :func:`end_job_after` runs on a call thread
    #: that holds no communicator to ask for it
    installed: "_AbortOnError | None" = None

    @classmethod
    def install(cls, comm, advice: str) -> None:
        hook = sys.excepthook
        if not isinstance(hook, cls):
            hook = sys.excepthook = cls.installed = cls(hook)
        hook.comms[comm] = advice  # how to keep it running: fits how comm was made

    def __call__(self, kind, value, tb) -> None:
        if issubclass(kind, KeyboardInterrupt):
            self.interrupted()
        if value is not None and tb is value.__traceback__:
            shorten(value)  # an error no public call shortened: raised under a `with`, say
            tb = value.__traceback__
        self.await_verdict()
        live = [c for c in self.comms if not c.closed]
        if not live:
            self.show(kind, value, tb)
            return
        comm = live[0]
        # the traceback just printed holds the message: this line names the rank and the
        # exit without saying it again (each rank prints its error once)
        what = f"the uncaught {kind.__name__} above"
        reason = str(value).splitlines()[0] if str(value) else what
        self.fail(value, reason, then=lambda: self.show(kind, value, tb))
        end_job(
            f"commrt: rank {comm.rank}: {what}; ending the whole job "
            f"({self.comms.get(comm, 'COMMRT_ABORT_ON_ERROR=0')} to keep it running)"
        )

    def show(self, kind, value, tb) -> None:
        """The traceback, as the hook before this one shows it."""
        self.previous(kind, value, tb)
        if sys.stderr is not sys.__stderr__ and sys.__stderr__ is not None:
            # a hook installed after this one (torch.distributed's prefixes "[rankN]:") may
            # be capturing stderr to print it after us: we end the process first, so print
            # the traceback where it is seen
            traceback.print_exception(kind, value, tb, file=sys.__stderr__)

    def interrupted(self) -> None:
        """A Ctrl-C: one line naming the rank, and exit status 130 (the shell's for it, as
        ``commrt train``'s), at once. No traceback: the user knows where they were, and
        the terminal signals every process of the job (torchrun and mpiexec pass it on).
        A farewell tells a peer that was not interrupted (its error then names this rank,
        whose line says why)."""
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # torchrun's second SIGINT, say
        ranks = [c.rank for c in self.comms]
        for comm in [c for c in self.comms if not c.closed]:
            comm.departures.announce(FAILED)
        try:
            sys.stdout.flush()  # what the program printed: os._exit leaves buffers behind
        except (OSError, ValueError):  # a reader that left, a closed stream
            pass
        rank = f" rank {ranks[0]}:" if ranks else ""
        say(f"commrt:{rank} interrupted (Ctrl-C or SIGINT); ending this rank")
        unlink_mpich_segments()
        os._exit(130)

    def await_verdict(self) -> None:
        """Where a stall verdict is being given in this process, let it end the job (an
        error of the verdict's own ending: a peer left), saying nothing more."""
        judging = [c.stall for c in self.comms if c.stall is not None and c.stall.judging]
        if judging:
            judging[0].diagnose("", failed=True)
            os._exit(1)

    def fail(self, error: BaseException, reason: str, then=None) -> None:
        """Before this process ends the job for ``error``: the stall verdict where the error
        is worth one (which ends the job, with a farewell naming the verdict's root), else
        a farewell on every open communicator naming the rank the error points at
        (:mod:`commrt.diagnosis.departures`), so that the peers' errors follow the chain.
        ``then()`` (the error's own text) runs after the verdict: the verdict comes first,
        within a moment of the failure, before a launcher (torchrun) can stop the process."""
        live = [c for c in self.comms if not c.closed]
        for comm in live:
            if comm.stall is not None and stall_worth_a_verdict(error):
                comm.stall.diagnose(reason, failed=True, then=then)
                then = None
                break
        if then is not None:
            then()
        for comm in live:  # an error not commrt's (DDP's own check, say) began here
            own = comm.rank if not isinstance(error, CommError) else None
            comm.departures.announce(FAILED, cause_of(error) if own is None else own)


def end_job(message: str) -> None:
    """Print ``message`` and end the whole job now: ``MPI_Abort`` under MPI (mpiexec then
    kills every rank), else exit status 1 at once, without exit handlers that could block
    on a dead peer. The abort-on-error hook's last act, and the process group's answer to
    an error that has nobody to raise to (:mod:`commrt.distributed.work`)."""
    say(message)
    sys.stdout.flush()
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        # MPI_Abort makes mpiexec kill every rank at once, and hydra drops whatever output
        # its proxy has not forwarded yet (a traceback can be cut in half): give the
        # forwarder a moment first
        time.sleep(ABORT_GRACE_S)
        unlink_mpich_segments()
        mpi.COMM_WORLD.Abort(1)
    os._exit(1)


def say(text: str) -> None:
    """``text`` and its newline on the process's stderr in one write: ranks whose output a
    launcher merges (torchrun) fail at the same moment, and another rank's line landing
    between a text and its newline would run two lines into one."""
    stream = sys.__stderr__ or sys.stderr
    stream.write(text + "\n")
    stream.flush()


def unlink_mpich_segments() -> None:
    """Unlink the ``/dev/shm/mpich_shm_*`` files this process maps: mpich's segment for
    the ranks of a node, which ``MPI_Abort`` would leave behind (a few MB per job). The
    other ranks of the node map the same file; their mappings outlive its name. Only
    files this process maps are touched, never another job's."""
    unlink_mapped(MPICH_SHM)


def end_job_after(error: BaseException, message: str) -> None:
    """:func:`end_job` for an ``error`` that has nobody to raise to (a torch.distributed
    call whose future alone DDP holds): as for an uncaught error, the stall verdict
    first (then ``message``) or ``message`` and a farewell that names where the failure
    began."""
    hook = _AbortOnError.installed
    if hook is None:
        say(message)
    else:
        hook.await_verdict()
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        hook.fail(error, reason, then=lambda: say(message))
    end_job("commrt: ending the whole job after the error above")


def cause_of(error: BaseException) -> int | None:
    """The rank ``error`` points at as where a failure began, where it names one: a failed
    peer's cause (else the peer), the peer a timeout waited on, the one peer of an engine
    error; None otherwise."""
    if isinstance(error, PeerFailedError):
        return error.peer if error.cause is None else error.cause
    if isinstance(error, CommTimeoutError):
        return error.peer
    peers = error.peers if isinstance(error, CommError) else None
    return peers[0] if peers is not None and len(peers) == 1 else None


def install_abort_hook(comm, advice: str = f"{settings.ABORT_ON_ERROR.name}=0") -> None:
    """Install the abort-on-error hook (see :class:`_AbortOnError`) for ``comm``."""
    _AbortOnError.install(comm, advice)


def abort_on_error_wanted() -> bool:
    """Whether ``COMMRT_ABORT_ON_ERROR`` leaves the abort-on-error hook on (the default)."""
    return settings.ABORT_ON_ERROR.get()


def stall_worth_a_verdict(error: BaseException) -> bool:
    """Whether an uncaught ``error`` calls for the stall verdict: a commrt wait that timed
    out or broke (a peer died), not an error that names its cause on every rank already (a
    peer that closed, ranks that called different collectives)."""
    named = (PeerClosedError, CollectiveMismatchError)
    if isinstance(error, PeerFailedError) and error.cause == error.peer:
        return False  # the peer failed of its own error, which its output and this name
    return isinstance(error, CommError) and not isinstance(error, named)
