"""Batch-size control (commrt.training.recipe.BatchSizeSchedule) and the label-smoothing pointer."""

import doctest

import pytest
import torch

import commrt.training.recipe
from commrt.training.recipe import BatchSizeSchedule


def test_batch_grows_at_milestones():
    bs = BatchSizeSchedule(base=256, milestones={30: 2, 60: 4})
    assert bs.milestones == ((30, 2), (60, 4))
    assert [bs.batch_size(e) for e in (0, 29, 29.99, 30, 59, 60, 1000)] == [
        256,
        256,
        256,
        512,
        512,
        1024,
        1024,
    ]
    assert bs.batches == ((0, 256), (30, 512), (60, 1024))
    assert str(bs) == "0:256,30:512,60:1024"
    assert (
        bs.describe()
        == "global batch 256, 512 from epoch 30, 1024 from epoch 60; lr scales with the batch"
    )
    # pairs in any order, and a dict, give the same (hashable, frozen) schedule
    assert BatchSizeSchedule(256, [(60, 4), (30, 2)]) == bs and hash(
        BatchSizeSchedule(256, {30: 2, 60: 4})
    )
    assert BatchSizeSchedule(256).batch_size(10) == 256 and str(BatchSizeSchedule(256)) == "0:256"


def test_parse_and_round_trip():
    bs = BatchSizeSchedule.parse("0:32,5:64,10:128")
    assert bs == BatchSizeSchedule(32, {5: 2, 10: 4})
    assert [bs.batch_size(e) for e in range(12)] == [32] * 5 + [64] * 5 + [128] * 2
    assert BatchSizeSchedule.parse(str(bs)) == bs
    assert BatchSizeSchedule.parse(" 10:128 , 0:32 ,5:64 ") == bs  # order and spaces don't matter
    assert BatchSizeSchedule.parse("256") == BatchSizeSchedule(256)
    odd = BatchSizeSchedule.parse("0:32,3:48,7:100")  # non-integer multipliers
    assert odd.batches == ((0, 32), (3, 48), (7, 100)) and str(odd) == "0:32,3:48,7:100"
    assert BatchSizeSchedule.parse("0:64,8:128", lr_scaling="constant").lr_scaling == "constant"


@pytest.mark.parametrize(
    "text,match",
    [
        ("", "empty"),
        ("abc", "expected a batch size"),
        ("0:32,5", r"cannot read '5'"),
        ("0:32,5:6x4", r"cannot read '5:6x4'"),
        ("0:32,5:64:1", r"cannot read"),
        ("5:64,10:128", r"must start at epoch 0.*'0:64,5:64,10:128'"),
        ("0:32,5:64,5:128", "given twice"),
        ("0:0", "must be positive"),
        ("0:64,5:32", "would shrink from 64 to 32"),
        ("0:64,-1:128", "must start at epoch 0"),
    ],
)
def test_parse_errors_say_why(text, match):
    with pytest.raises(ValueError, match=match):
        BatchSizeSchedule.parse(text)


def test_constructor_validation():
    bad = [
        (dict(base=0), "positive integer"),
        (dict(base=25.0), "positive integer"),
        (dict(base=True), "positive integer"),
        (dict(base=32, lr_scaling="sqrt"), "lr_scaling must be one of linear, constant"),
        (dict(base=32, milestones={-1: 2}), "non-negative integer"),
        (dict(base=32, milestones={1.5: 2}), "non-negative integer"),
        (dict(base=32, milestones={5: 0}), "positive number"),
        (dict(base=32, milestones={5: "2"}), "positive number"),
        (dict(base=32, milestones={5: float("inf")}), "positive number"),
        (dict(base=30, milestones={5: 1.25}), r"30 × 1.25 = 37.5 is not a whole number"),
        (dict(base=32, milestones={0: 2}), "set base=64"),
        (dict(base=32, milestones={5: 4, 9: 2}), "would shrink from 128 to 64"),
        (dict(base=32, milestones=[(5, 2), (5, 4)]), "epoch 5 is given twice"),
        (dict(base=32, milestones=[5, 6]), "must map epochs to multipliers"),
    ]
    for kw, match in bad:
        with pytest.raises(ValueError, match=match):
            BatchSizeSchedule(**kw)
    assert BatchSizeSchedule(32, {0: 1, 4: 1.5}).batches == ((0, 32), (4, 48))
    with pytest.raises(ValueError, match="epoch must be a non-negative number"):
        BatchSizeSchedule(32).batch_size(-1)


def test_lr_rules():
    lin = BatchSizeSchedule(256, {30: 2, 60: 4})
    assert [lin.lr(e, 0.1) for e in (0, 30, 60)] == pytest.approx([0.1, 0.2, 0.4])  # Goyal et al.
    const = BatchSizeSchedule(256, {30: 2, 60: 4}, lr_scaling="constant")
    assert [const.lr(e, 0.1) for e in (0, 30, 60)] == [0.1, 0.1, 0.1]  # Smith et al.
    frac = BatchSizeSchedule.parse("0:32,3:48")
    assert frac.lr(3, 1.0) == pytest.approx(1.5)


def test_apply_lr_scales_each_group_from_its_initial_lr():
    w, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([{"params": [w], "lr": 0.1}, {"params": [b], "lr": 0.01}], momentum=0.9)
    bs = BatchSizeSchedule(64, {2: 2, 4: 8})
    lrs = []
    for epoch in range(6):
        bs.apply_lr(opt, epoch)
        lrs += [g["lr"] for g in opt.param_groups]
    assert lrs == pytest.approx([0.1, 0.01] * 2 + [0.2, 0.02] * 2 + [0.8, 0.08] * 2)


def test_per_rank_split():
    bs = BatchSizeSchedule.parse("0:96,10:192,20:384")
    assert [bs.per_rank_batch(e, 4) for e in (0, 10, 20)] == [24, 48, 96]
    assert bs.per_rank_batch(0, 1) == 96
    bs.validate(6)
    with pytest.raises(
        ValueError,
        match=r"global batch 96 \(epoch 0\) does not split evenly over 5 ranks; "
        r"use a multiple of 5, e.g. 95 or 100",
    ):
        bs.validate(5)
    with pytest.raises(ValueError, match="e.g. 128"):
        BatchSizeSchedule(100).per_rank_batch(0, 128)
    with pytest.raises(ValueError, match="world_size must be a positive integer"):
        bs.per_rank_batch(0, 0)
    # a later milestone that does not split is caught up front by validate()
    late = BatchSizeSchedule.parse("0:64,5:96")
    assert late.per_rank_batch(0, 64) == 1
    with pytest.raises(ValueError, match="global batch 96 \\(epoch 5\\)"):
        late.validate(64)


def test_label_smoothing_is_torchs_own_loss():
    # commrt does not implement label smoothing: the recipe points at torch's loss
    assert "CrossEntropyLoss(label_smoothing=" in commrt.training.recipe.__doc__
    loss = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
    logits, target = torch.zeros(2, 4), torch.tensor([0, 3])
    assert loss(logits, target).item() == pytest.approx(torch.log(torch.tensor(4.0)).item())


def test_doc_examples():
    assert doctest.testmod(commrt.training.recipe).failed == 0
