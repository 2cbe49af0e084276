"""Every key backup workers use in the control store, in one place.

Each :class:`~commrt.sync.backup.BackupPolicy` on a communicator gets its
own key space (:meth:`Keys.space`), so two GradientSyncs never read each
other's tickets. Inside it:

=========================  =====================================================
``a/{g}``                  ticket counter of global step g (atomic ``add``); in
                           redo round k >= 1 of that step: ``a/{g}/{k}``
``s/{g}/{i}``              name under ticket i+1 of step g: ``"{rank}"``, or
                           ``"x{rank}"`` for a rank that closes there; in redo
                           round k: ``s/{g}/{k}/{i}``
``ok/{g}/{k}``             how many participants finished round k's reduction of
                           step g (atomic ``add``)
``o/{g}/{k}``              round k's outcome: ``commit`` or ``redo`` (the first
                           ``compare_set`` wins)
``broken``                 the group made at setup failed: later rounds run on
                           groups made for their participants
``w/{g}/{k}/``             the rendezvous of the gloo group of round k of step g
                           (``w/setup/``: the group of every rank, made at setup;
                           ``w/c/{i}/``: the pair of catch-up request i, when
                           one end rejoined)
``nreq``                   catch-up request counter
``q/{i}``                  request i: ``"{rank} {global step it holds}"``
``c/{i}``                  claims on request i (the first claimer serves it)
``r/{i}``                  response to request i: server, step, final, layout
``k/{i}``                  the late rank posted its receive for request i
``d/{i}``                  the late rank received request i's snapshot
``hb/{r}``                 rank r's heartbeat counter (``add`` 1 per beat); of
                           its incarnation j >= 1 (a replacement): ``hb/{r}/{j}``
``dead/{r}``               rank r was recorded dead: ``"{checker}"`` (incarnation
                           j >= 1: ``dead/{r}/{j}``)
``inc/{r}``                incarnations of rank r that rejoined (atomic ``add``)
``ndead``                  counts the membership log's entries ``died/{i}``
``died/{i}``               the i-th entry: a death ``"{rank} {checker} {j}"``, or a
                           replacement back ``"{rank} back {j}"``
``fin/{r}``                rank r holds the final state: its step and counts
``bye/{r}``                rank r is done with the store
=========================  =====================================================
"""

from __future__ import annotations

#: the name a closing rank writes under its ticket starts with this
CLOSING = "x"


def rank_of(name: str) -> int:
    """The rank that wrote the ticket name ``name`` (``"{rank}"``, ``"{rank}.{incarnation}"``
    for a replacement, either after :data:`CLOSING` for a rank that closes)."""
    return int(name.lstrip(CLOSING).split(".")[0])


def incarnation_of(name: str) -> int:
    """The incarnation of the rank that wrote the ticket name ``name`` (0: the first)."""
    _, _, inc = name.lstrip(CLOSING).partition(".")
    return int(inc or 0)


class Keys:
    """Names of the store keys (relative to a policy's key space)."""

    #: counts catch-up requests (``add`` returns the next request's number + 1)
    REQUESTS = "nreq"
    #: counts the membership log's entries, deaths and rejoins (every rank reads it once per
    #: heartbeat period)
    DEATHS = "ndead"

    @staticmethod
    def space(instance: int) -> str:
        """The prefix of the ``instance``-th backup policy made on a communicator."""
        return f"commrt/backup/{instance}"

    # ------------------------------------------------------------ arrival
    @staticmethod
    def tickets(step: int, round: int = 0) -> str:
        return f"a/{step}" if round == 0 else f"a/{step}/{round}"

    @staticmethod
    def ticket(step: int, index: int, round: int = 0) -> str:
        """Who holds ticket ``index + 1`` of global step ``step`` (in redo round ``round``)."""
        return f"s/{step}/{index}" if round == 0 else f"s/{step}/{round}/{index}"

    # ------------------------------------------------------------ commit or redo
    #: set once the group made at setup failed (never unset)
    BROKEN = "broken"

    @staticmethod
    def done(step: int, round: int) -> str:
        """Counts the participants that finished round ``round``'s reduction of ``step``."""
        return f"ok/{step}/{round}"

    @staticmethod
    def outcome(step: int, round: int) -> str:
        """``commit`` or ``redo``, written once (``compare_set``)."""
        return f"o/{step}/{round}"

    @staticmethod
    def wire(step: int | None, round: int = 0) -> str:
        """Prefix of a gloo group's rendezvous (``step`` None: the group made at setup)."""
        return "w/setup/" if step is None else f"w/{step}/{round}/"

    @staticmethod
    def pair(req: int) -> str:
        """Prefix of the rendezvous of the two-rank group catch-up request ``req`` travels on
        (when one end rejoined: the communicator's group does not reach it)."""
        return f"w/c/{req}/"

    # ------------------------------------------------------------ catch-up
    @staticmethod
    def request(req: int) -> str:
        return f"q/{req}"

    @staticmethod
    def claim(req: int) -> str:
        return f"c/{req}"

    @staticmethod
    def response(req: int) -> str:
        return f"r/{req}"

    @staticmethod
    def posted(req: int) -> str:
        return f"k/{req}"

    @staticmethod
    def received(req: int) -> str:
        return f"d/{req}"

    # ------------------------------------------------------------ liveness and the end
    @staticmethod
    def heartbeat(rank: int, incarnation: int = 0) -> str:
        return f"hb/{rank}" if incarnation == 0 else f"hb/{rank}/{incarnation}"

    @staticmethod
    def dead(rank: int, incarnation: int = 0) -> str:
        """Set (to the checker's rank) once ``rank`` (that incarnation of it) is recorded
        dead; a replacement's own key starts unset, so a stale record cannot stop it."""
        return f"dead/{rank}" if incarnation == 0 else f"dead/{rank}/{incarnation}"

    @staticmethod
    def incarnation(rank: int) -> str:
        """Counts the replacements of ``rank`` (``add`` returns a new one's number)."""
        return f"inc/{rank}"

    @staticmethod
    def death(index: int) -> str:
        """The ``index``-th recorded death (``"{rank} {checker}"``)."""
        return f"died/{index}"

    @staticmethod
    def final(rank: int) -> str:
        return f"fin/{rank}"

    @staticmethod
    def bye(rank: int) -> str:
        return f"bye/{rank}"
