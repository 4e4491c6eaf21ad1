"""Our RandAugment op table against torchvision's RandAugment (tests/test_data_arrays.py checks the batching)."""

import numpy as np
import pytest
import torch
import torchvision.transforms.v2 as T

from vitlab.data.batch_randaugment import OPS, BatchRandAugment, strength


@pytest.mark.parametrize("magnitude", [0, 3, 9, 10])
def test_op_table_gives_torchvision_randaugment_outputs(magnitude):
    """For a fixed magnitude, the outputs of torchvision's one-op RandAugment over many seeds and ours over
    every (op, sign) are the same set of images: each of our ops (strength range, sign, fill, resampling)
    is something torchvision applies, and torchvision applies nothing else. The image is not square, so the
    horizontal and vertical translations use their own side."""
    H, W = 20, 28
    x = torch.randint(0, 256, (1, 3, H, W), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    ours = BatchRandAugment(num_ops=1, magnitude=magnitude)
    candidates = {}
    for op in OPS:
        for negative in (False, True) if op.signed else (False,):
            candidates[op.name, negative] = ours.apply_one(x, op.name, ours.magnitude_of(op.name, negative, H, W))
    tv = T.RandAugment(num_ops=1, magnitude=magnitude, num_magnitude_bins=11, fill=128)
    seen = set()
    for seed in range(150):  # seeds 0-96 already draw every (op, sign) pair
        torch.manual_seed(seed)
        y = tv(x)
        match = {k for k, c in candidates.items() if torch.equal(y, c)}
        assert match, f"seed {seed}: torchvision made an image none of our ops makes"
        seen |= match
    assert seen == set(candidates), f"never produced by torchvision: {sorted(set(candidates) - seen)}"


def test_op_table_ranges():
    """The paper's ranges at magnitude 10 (and the identity-like end at 0)."""
    by = {op.name: op for op in OPS}
    assert len(OPS) == 14 and len(by) == 14
    assert strength(by["Rotate"], 10) == pytest.approx(30.0) and strength(by["Rotate"], 0) == 0.0
    assert strength(by["ShearX"], 10) == pytest.approx(0.3)
    assert strength(by["TranslateX"], 10, side=331) == pytest.approx(150.0)
    assert strength(by["Brightness"], 10) == pytest.approx(0.9)
    assert [strength(by["Posterize"], m) for m in (0, 10)] == [8.0, 4.0]
    assert [strength(by["Solarize"], m) for m in (0, 10)] == [1.0, 0.0]
    assert {op.name for op in OPS if op.end is None} == {"Identity", "AutoContrast", "Equalize"}
    assert not any(op.signed for op in OPS if op.name in ("Posterize", "Solarize"))
    with pytest.raises(ValueError, match="magnitude"):
        BatchRandAugment(num_ops=2, magnitude=11)


def test_batch_is_reproducible_from_the_draws():
    bra = BatchRandAugment(num_ops=2, magnitude=9)
    x = torch.randint(0, 256, (16, 1, 12, 12), dtype=torch.uint8)
    ops, neg = bra.draw(np.random.default_rng(3), 16)
    assert torch.equal(bra(x, ops, neg), bra(x, ops, neg))
