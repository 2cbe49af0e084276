"""``auto`` and its memory of earlier jobs (:mod:`commrt.tuning.memory`): a size's learning
started from an earlier job's verdict (:func:`recalled`), and this job's verdicts kept for
later ones (:func:`remember`).

A verdict's kept schedule is timed first, against its time then, and kept if it still
takes that long; else it is tried against the rival that job measured (or the model's
runner-up). ``labels``: every candidate's label at the job's world size, in
:func:`commrt.algorithms.auto.candidates`' order, as the memory's shared row names them.
"""

from __future__ import annotations

import dataclasses

from commrt.algorithms.auto_cost import LearningCost
from commrt.algorithms.auto_learn import WIDE, Tuning

__all__ = ["recalled", "remember"]


def recalled(
    comm, key, choice, labels: tuple[str, ...], cost: LearningCost, recheck_s: float | None
) -> Tuning | None:
    """Learning for ``choice``'s size (``key``: its Auto, world size and bytes) that starts
    from an earlier job's verdict for its size class, None where there is none; paced by
    ``cost``, or by what learning cost that job where it measured it; rechecked after
    ``recheck_s`` of settled calls. Collective on the first ask of
    a communicator (``comm.memory`` reads the file on rank 0 and shares it)."""
    past = comm.memory(labels).recall(choice.nbytes)
    if past is None:
        return None
    # what learning cost for this size then: closer to it than this job's other sizes
    cost = dataclasses.replace(
        cost,
        call_s=cost.call_s if past.learn_call_s is None else past.learn_call_s,
        gather_s=cost.gather_s if past.gather_s is None else past.gather_s,
    )
    rival = past.rival
    if rival is None:  # settled without a trial then: the model's best other one
        rival = next((n for n, _ in choice.candidates if n != past.kept), None)
    model = dict(choice.candidates)
    prices = {**model, past.kept: past.kept_s}
    if rival is not None:
        prices[rival] = past.rival_s or model.get(rival) or WIDE * past.kept_s
    # the model's own choice, which the verdict's `learned` is about
    comm.slots.auto_remembered[key] = choice.label
    # runner_predicted_s None: a rival the baseline's confirmation rules out needs no
    # trial (the last job ran it); a baseline that misses tries it
    return Tuning(
        past.kept,
        past.kept_s,
        rival,
        None,
        (),
        prices,
        recheck_after_s=recheck_s,
        remembered=True,
        cost=cost,
    )


def remember(comm, tuning: Tuning, nbytes: int, labels: tuple[str, ...]) -> None:
    """Keep this size's verdict for later jobs (rank 0 writes)."""
    # a trial block's statistic, as the next job's baseline reads it (Tuning.seen_s)
    kept_s = tuning.trial_s.get(tuning.kept) or tuning.chosen_block_s
    rivals = {k: t for k, t in tuning.trial_s.items() if k != tuning.kept}
    rival = min(rivals, key=rivals.get) if rivals else None
    cost = tuning.cost  # what learning cost here, where this job measured it
    learned = (cost.call_s if cost.calls_s else None, cost.gather_s if cost.gathers_s else None)
    if kept_s:
        comm.memory(labels).keep(nbytes, tuning.kept, kept_s, rival, rivals.get(rival), *learned)
