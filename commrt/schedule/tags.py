"""Message tags: every user of the transport takes its tags from one registry.

MPI and gloo match a receive to a send by (peer, tag) and keep FIFO order
per tag, so two kinds of traffic between the same pair of ranks must never
share a tag. Each kind owns a range here, and a test checks that the
ranges stay apart (they used to stay apart only because comments said so).

====================  ==========================================
executor              schedule step × 1024 + piece, below 2**28
gossip shuffle        2**28 + epoch mod 2**20
torch p2p             2**29 + the user's tag mod 2**24
torch collectives     one tag, after torch p2p's (gather, scatter, alltoall)
gossip with deadline  2**29 + 2**25 + (step mod 2**18) × 1024 + bucket
backup catch-up       one tag, above both
call check            one tag, after catch-up's
farewell              one tag, after the call check's
====================  ==========================================
"""

from __future__ import annotations

#: tags per schedule step: step * PIECE_TAGS + piece
PIECE_TAGS = 1024
#: the executor's tags stay below this
EXECUTOR_END = 1 << 28
#: first tag of the gossip shuffle's swaps
SHUFFLE_BASE = EXECUTOR_END
#: the shuffle cycles through this many epochs' tags
SHUFFLE_EPOCHS = 1 << 20
#: first tag of torch.distributed send/recv on commrt's process group (commrt.distributed)
TORCH_P2P_BASE = 1 << 29
#: the user's tags are taken modulo this
TORCH_P2P_TAGS = 1 << 24
#: the process group's gather, scatter and all-to-all
TORCH_COLLECTIVE = TORCH_P2P_BASE + TORCH_P2P_TAGS
#: first tag of gossip's messages with a deadline (commrt.sync.gossip.deadline)
GOSSIP_BASE = TORCH_P2P_BASE + (1 << 25)
#: buckets per gossip step (a GradientSync with more is refused a deadline)
GOSSIP_BUCKETS = 1024
#: gossip steps before the tags repeat (a message later than this would be mismatched)
GOSSIP_STEPS = 1 << 18
#: the backup workers' catch-up snapshots
CATCHUP = 0x3FFFFF00
#: the collectives' cross-rank check of a call signature (commrt.collectives.core)
CALL_CHECK = CATCHUP + 1
#: a closing rank's farewell to its peers (commrt.diagnosis.departures), where no store carries it
FAREWELL = CALL_CHECK + 1

#: every range, [start, stop), by owner
RANGES = {
    "executor": (0, EXECUTOR_END),
    "shuffle": (SHUFFLE_BASE, SHUFFLE_BASE + SHUFFLE_EPOCHS),
    "torch p2p": (TORCH_P2P_BASE, TORCH_P2P_BASE + TORCH_P2P_TAGS),
    "torch collectives": (TORCH_COLLECTIVE, TORCH_COLLECTIVE + 1),
    "gossip deadline": (GOSSIP_BASE, GOSSIP_BASE + GOSSIP_STEPS * GOSSIP_BUCKETS),
    "catch-up": (CATCHUP, CATCHUP + 1),
    "call check": (CALL_CHECK, CALL_CHECK + 1),
    "farewell": (FAREWELL, FAREWELL + 1),
}


def executor(step: int, piece: int = 0) -> int:
    """The tag of ``piece`` in schedule step ``step``."""
    return step * PIECE_TAGS + piece


def shuffle(epoch: int) -> int:
    """The tag of the gossip shuffle's swap in ``epoch``."""
    return SHUFFLE_BASE + epoch % SHUFFLE_EPOCHS


def torch_p2p(tag: int) -> int:
    """The tag of a torch.distributed send/recv with the user's ``tag``."""
    return TORCH_P2P_BASE + int(tag) % TORCH_P2P_TAGS


def gossip(step: int, bucket: int) -> int:
    """The tag of bucket ``bucket``'s message in gossip step ``step`` (with a deadline)."""
    return GOSSIP_BASE + (step % GOSSIP_STEPS) * GOSSIP_BUCKETS + bucket
