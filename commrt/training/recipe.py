"""The training recipe of Mikami et al. (ImageNet/ResNet-50 in 122 s): batch-size control.

The paper keeps very large mini-batch training stable with two techniques:

* **Batch-size control**: start with a smaller global batch and grow it at
  chosen epochs. :class:`BatchSizeSchedule` says, per epoch, the global
  batch, each rank's share of it, and the learning rate that goes with it.
* **Label smoothing**: nothing to implement. Use torch's own loss,
  ``torch.nn.CrossEntropyLoss(label_smoothing=0.1)``; ``commrt train
  --label-smoothing 0.1`` passes the value straight into it.

**The learning-rate rule** (``lr_scaling``) decides what growing the batch
means for the optimizer:

* ``"linear"`` (default): lr = base_lr × batch(epoch) / batch(0), the
  linear scaling rule of Goyal et al. ("Accurate, Large Minibatch SGD",
  2017). The step per sample stays the same, so a larger batch only buys
  throughput and training follows the small-batch curve; combine it with
  your usual lr decay.
* ``"constant"``: lr = base_lr whatever the batch. Growing the batch k-fold
  at a fixed lr lowers the gradient noise like dividing the lr by k does,
  so the growth *replaces* the lr decay (Smith et al., "Don't Decay the
  Learning Rate, Increase the Batch Size", 2018): later epochs take fewer,
  larger, better-parallelised steps. This is the spirit of the paper's
  batch-size control; choose it when the milestones are where you would
  otherwise decay the lr.

Warm-up is not part of this class; chain a torch scheduler such as
``torch.optim.lr_scheduler.LinearLR`` for it if you need one.

Example (a custom loop)::

    >>> from commrt.training.recipe import BatchSizeSchedule
    >>> bs = BatchSizeSchedule(base=256, milestones={30: 2, 60: 4})
    >>> bs.batch_size(0), bs.batch_size(30), bs.batch_size(75), bs.per_rank_batch(60, world_size=8)
    (256, 512, 1024, 128)
    >>> bs.lr(45, base_lr=0.1)
    0.2
    >>> str(bs) == str(BatchSizeSchedule.parse("0:256,30:512,60:1024"))
    True

    for epoch in range(epochs):                                   # doctest: +SKIP
        loader = DataLoader(data, batch_size=bs.per_rank_batch(epoch, comm.world_size),
                            sampler=DistributedSampler(data, comm.world_size, comm.rank))
        bs.apply_lr(optimizer, epoch)       # scales each group's initial lr
        for x, y in loader: ...
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Mapping

__all__ = ["BatchSizeSchedule", "LR_SCALINGS"]

#: accepted values of ``BatchSizeSchedule.lr_scaling``
LR_SCALINGS = ("linear", "constant")


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


@dataclass(frozen=True)
class BatchSizeSchedule:
    """Global batch ``base`` from epoch 0, multiplied by ``milestones[e]`` from epoch ``e`` on.

    ``milestones`` maps epochs to multipliers of ``base`` (a dict or (epoch,
    multiplier) pairs; stored as a sorted tuple of pairs). Multipliers may
    be fractional as long as ``base × multiplier`` is a whole number; the
    batch never shrinks. Epochs count from 0; a float epoch (``epoch +
    step / steps_per_epoch``) works too. Invalid input raises ValueError in
    the constructor, saying why.
    """

    base: int
    milestones: tuple[tuple[int, float], ...] | Mapping[int, float] = ()
    lr_scaling: str = "linear"

    def __post_init__(self):
        if not _is_int(self.base) or self.base < 1:
            raise ValueError(
                f"BatchSizeSchedule base (the global batch at epoch 0) must be a positive "
                f"integer, got {self.base!r}"
            )
        if self.lr_scaling not in LR_SCALINGS:
            raise ValueError(
                f"lr_scaling must be one of {', '.join(LR_SCALINGS)}, got {self.lr_scaling!r}"
            )
        items = self.milestones.items() if isinstance(self.milestones, Mapping) else self.milestones
        try:
            pairs = [(e, m) for e, m in items]
        except (TypeError, ValueError):
            raise ValueError(
                f"milestones must map epochs to multipliers, e.g. {{30: 2, 60: 4}}, "
                f"got {self.milestones!r}"
            ) from None
        pairs.sort(key=lambda em: em[0] if _is_int(em[0]) else -1)
        seen, prev = set(), 1
        for e, m in pairs:
            if not _is_int(e) or e < 0:
                raise ValueError(f"milestone epoch must be a non-negative integer, got {e!r}")
            if e in seen:
                raise ValueError(f"milestone epoch {e} is given twice")
            seen.add(e)
            if (
                isinstance(m, bool)
                or not isinstance(m, numbers.Real)
                or not m > 0
                or not math.isfinite(m)
            ):
                raise ValueError(
                    f"milestone multiplier at epoch {e} must be a positive number, got {m!r}"
                )
            b = self.base * m
            if abs(b - round(b)) > 1e-9:
                raise ValueError(
                    f"milestone at epoch {e}: batch {self.base} × {m} = {b:g} is not a whole number"
                )
            if e == 0 and m != 1:
                raise ValueError(
                    f"epoch 0 runs the base batch {self.base}; set base={round(b)} instead of "
                    f"a multiplier {m} at epoch 0"
                )
            if m < prev:
                raise ValueError(
                    f"batch-size control grows the batch, but at epoch {e} it would shrink from "
                    f"{round(self.base * prev)} to {round(b)}"
                )
            prev = m
        object.__setattr__(
            self,
            "milestones",
            tuple(
                (int(e), int(m) if float(m).is_integer() else float(m)) for e, m in pairs if e != 0
            ),
        )

    # ---------------------------------------------------------------- parsing
    @classmethod
    def parse(cls, text: str, lr_scaling: str = "linear") -> "BatchSizeSchedule":
        """From ``"EPOCH:BATCH,..."`` (global batches), e.g. ``"0:32,5:64,10:128"``.

        The first entry must be epoch 0. A bare number (``"256"``) is a
        constant batch. ``str()`` of a schedule parses back to it.
        """
        if not isinstance(text, str) or not text.strip():
            raise ValueError(
                "batch schedule is empty; write EPOCH:BATCH pairs such as '0:32,5:64,10:128'"
            )
        text = text.strip()
        if ":" not in text:
            try:
                return cls(int(text), (), lr_scaling)
            except ValueError:
                raise ValueError(
                    f"batch schedule {text!r}: expected a batch size or EPOCH:BATCH pairs "
                    f"such as '0:32,5:64,10:128'"
                ) from None
        entries = []
        for part in text.split(","):
            fields = part.strip().split(":")
            try:
                if len(fields) != 2:
                    raise ValueError
                entries.append((int(fields[0]), int(fields[1])))
            except ValueError:
                raise ValueError(
                    f"batch schedule {text!r}: cannot read {part.strip()!r}; expected "
                    f"EPOCH:BATCH with whole numbers, e.g. '0:32,5:64,10:128'"
                ) from None
        epochs = [e for e, _ in entries]
        if len(set(epochs)) != len(epochs):
            raise ValueError(f"batch schedule {text!r}: an epoch is given twice")
        entries.sort()
        if entries[0][0] != 0:
            raise ValueError(
                f"batch schedule {text!r} must start at epoch 0 (the batch to begin with), "
                f"e.g. '0:{entries[0][1]},{text}'"
            )
        base = entries[0][1]
        if base < 1:
            raise ValueError(
                f"batch schedule {text!r}: the batch at epoch 0 must be positive, got {base}"
            )
        return cls(
            base,
            tuple((e, b // base if b % base == 0 else b / base) for e, b in entries[1:]),
            lr_scaling,
        )

    # ---------------------------------------------------------------- queries
    def _multiplier(self, epoch: float) -> float:
        if isinstance(epoch, bool) or not isinstance(epoch, numbers.Real) or epoch < 0:
            raise ValueError(f"epoch must be a non-negative number, got {epoch!r}")
        m = 1
        for e, k in self.milestones:
            if epoch >= e:
                m = k
            else:
                break
        return m

    def batch_size(self, epoch: float) -> int:
        """The global batch (all ranks together) in ``epoch``."""
        return round(self.base * self._multiplier(epoch))

    def lr_factor(self, epoch: float) -> float:
        """lr(epoch) / base_lr under the ``lr_scaling`` rule (see the module doc)."""
        return self.batch_size(epoch) / self.base if self.lr_scaling == "linear" else 1.0

    def lr(self, epoch: float, base_lr: float) -> float:
        """The learning rate for ``epoch``, given ``base_lr`` tuned for the batch of epoch 0."""
        return base_lr * self.lr_factor(epoch)

    def apply_lr(self, optimizer, epoch: float) -> None:
        """Set every param group's lr for ``epoch``.

        The first call records each group's current lr as its
        ``initial_lr`` (the key torch's schedulers use) and scales from that.
        """
        f = self.lr_factor(epoch)
        for group in optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])
            group["lr"] = group["initial_lr"] * f

    def per_rank_batch(self, epoch: float, world_size: int) -> int:
        """Each rank's share of the global batch; it must divide evenly (ValueError says what would)."""
        if not _is_int(world_size) or world_size < 1:
            raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
        b = self.batch_size(epoch)
        if b % world_size:
            lo = b // world_size * world_size
            hint = f"{lo} or {lo + world_size}" if lo else f"{world_size}"
            raise ValueError(
                f"global batch {b} (epoch {epoch}) does not split evenly over {world_size} ranks; "
                f"use a multiple of {world_size}, e.g. {hint}"
            )
        return b // world_size

    def validate(self, world_size: int) -> None:
        """Check that every batch of the schedule splits over ``world_size`` ranks (call before training)."""
        for e, _ in ((0, 1),) + self.milestones:
            self.per_rank_batch(e, world_size)

    @property
    def batches(self) -> tuple[tuple[int, int], ...]:
        """``(epoch, global batch)`` from epoch 0 on, one pair per change."""
        return ((0, self.base),) + tuple((e, round(self.base * m)) for e, m in self.milestones)

    def describe(self) -> str:
        """One readable line, e.g. ``global batch 256, 512 from epoch 30; lr scales with the batch``."""
        steps = ", ".join(f"{b} from epoch {e}" for e, b in self.batches[1:])
        rule = "lr scales with the batch" if self.lr_scaling == "linear" else "lr stays constant"
        return f"global batch {self.base}{', ' + steps if steps else ''}; {rule}"

    def __str__(self) -> str:
        return ",".join(f"{e}:{b}" for e, b in self.batches)
