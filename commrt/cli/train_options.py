"""``commrt train``'s checked options, and the sizes of its data.

Imports no torch: the launcher builds these options to start the ranks, and only the
ranks import torch (each once); its start-up was torch's import twice over.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from commrt.algorithms import Algorithm
from commrt.training.recipe import BatchSizeSchedule

if TYPE_CHECKING:
    from commrt.cli.startup import Startup
    from commrt.cli.train_faults import Stragglers

#: the share of the digits held out for testing
TEST_FRACTION = 0.2
#: digits samples in scikit-learn's copy, and how many of them are training data
DIGITS_SAMPLES = 1797
TRAIN_SAMPLES = DIGITS_SAMPLES - int(DIGITS_SAMPLES * TEST_FRACTION)


@dataclass(frozen=True)
class TrainOptions:
    """``commrt train``'s flags, checked, with the objects they name
    (built by :func:`commrt.cli.train_args.check_train`)."""

    # -- where the ranks run
    backend: str
    timeout: float
    # -- what they train, and how
    algorithm: Algorithm
    epochs: int
    lr: float
    batch_schedule: BatchSizeSchedule
    label_smoothing: float
    #: wire dtype, torch's name for it (``"bfloat16"``; None: the gradients' own)
    comm_dtype: str | None
    bucket_mb: float
    seed: int
    # -- fault and delay injection
    straggler: Stragglers | None = None
    #: (rank, step) at which that rank kills itself (its replacement does not)
    kill: tuple[int, int] | None = None
    #: replacements the launcher may start for workers that died (backup workers, gloo)
    max_restarts: int = 0
    # -- output
    trace: str | None = None
    quiet: bool = False
    #: a peer's failure with its traceback (else one line: train_faults.peer_failed)
    verbose: bool = False
    #: this rank's start-up phases, begun before the flags were checked (None: one begins
    #: at run(), from the launch)
    startup: Startup | None = field(default=None, compare=False)

    def ranks_may_die(self, nproc: int) -> int:
        """How many of ``nproc`` ranks may die while the others carry on: b for backup
        workers, all but one for gossip with a deadline (its survivors never wait on the
        dead), none otherwise."""
        alg = self.algorithm
        if alg.family == "backup":
            return alg.backups
        return nproc - 1 if alg.family == "gossip-deadline" else 0

    @property
    def averages_each_epoch(self) -> bool:
        """Models that drift are averaged exactly at each epoch's end, unless --kill will
        leave a dead rank that such a collective would wait on (gossip with a deadline)."""
        return self.kill is None or self.algorithm.family != "gossip-deadline"
