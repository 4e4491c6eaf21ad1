"""Few-shot linear evaluation on frozen features: the paper's fast probe (Sec. 4.1, "Metrics").

"We solve a regularized least-squares regression problem that maps the (frozen) representation of a
subset of training images to {-1, 1}^K target vectors." As in big_vision's evaluator the features are
standardised with the few-shot set's mean and std, a constant bias column is appended (large, so it is
barely regularised), the ridge problem is solved in closed form, and the predicted class is the argmax.
We solve in whichever of the two equivalent forms has the smaller matrix: (X^T X + l2 I)^-1 X^T Y when
there are more examples than features, X^T (X X^T + l2 I)^-1 Y otherwise.

Accuracy is averaged over several random draws of the shots (one draw per seed), reported with its std.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..models.resnet import ResNetV2
from ..models.vit import VisionTransformer

BIAS_FEATURE = 100.0  # value of the appended constant feature; large, so the bias is almost unregularised
DEFAULT_L2 = 2.0**10  # big_vision's few-shot configs
DEFAULT_SHOTS = (1, 5, 10, 25)  # the paper's shots


FEATURES = ("pre_logits", "probe")


def probe_features(model: VisionTransformer, tokens: torch.Tensor) -> torch.Tensor:
    """DINOv2's linear-probe features (Oquab et al. 2023, Sec. 7: "the class token concatenated with the average
    of the patch tokens") of the final tokens `forward_features` returns: (B, prefix + N, D) -> (B, 2D). Prefix
    tokens other than the class token (distillation, registers) are left out of the mean. A model without a class
    token gives its pooled features (`forward_head(pre_logits=True)`: the mean, or SigLIP's MAP head) instead."""
    if not model.cfg.class_token:
        return model.forward_head(tokens, pre_logits=True)
    return torch.cat([tokens[:, 0], tokens[:, model.num_prefix_tokens :].mean(1)], dim=-1)


@torch.no_grad()
def extract_features(
    model: VisionTransformer | ResNetV2, batches: Iterable, device: torch.device | str | None = None,
    features: str = "pre_logits",
) -> tuple[np.ndarray, np.ndarray]:
    """Frozen features and labels of every batch: "pre_logits" (`forward_head(pre_logits=True)`: a ViT's
    pre-logits, a BiT ResNet's globally pooled features, `ResNetV2.embed_features`) or "probe" (a ViT's
    `probe_features`, DINOv2's linear-probe input).

    Args:
        model: The model (evaluated in eval mode; its mode is restored afterwards).
        batches: Iterable of (images (B, C, H, W), labels (B,)) pairs.
        device: Where to run; defaults to the model's device.
        features: "pre_logits" or "probe".

    Returns:
        (n, F) float32 features and (n,) int64 labels.
    """
    if features not in FEATURES:
        raise ValueError(f"features must be one of {FEATURES}, got {features!r}")
    if features == "probe" and not isinstance(model, VisionTransformer):
        raise ValueError("probe features (class token + mean patch token) need a ViT; use features='pre_logits'")
    device = torch.device(device) if device is not None else next(model.parameters()).device
    was_training = model.training
    model.eval()
    feats, labels = [], []
    try:
        for batch in batches:
            images, y = batch[0], batch[1]
            tokens = model.forward_features(images.to(device))
            if features == "probe":
                assert isinstance(model, VisionTransformer)
                f = probe_features(model, tokens)  # (B, 2D)
            else:
                f = model.forward_head(tokens, pre_logits=True)  # (B, F)
            feats.append(f.float().cpu())
            labels.append(torch.as_tensor(y).long().cpu())
    finally:
        model.train(was_training)
    if not feats:
        raise ValueError("extract_features got no batches")
    return torch.cat(feats).numpy(), torch.cat(labels).numpy()


@dataclass
class RidgeClassifier:
    """A closed-form least-squares classifier onto {-1, 1} one-vs-all targets.

    Attributes:
        weight: (F + 1, K) weights, the last row for the bias feature.
        mean: (F,) feature means of the training set.
        std: (F,) feature stds of the training set (plus 1e-5).
    """

    weight: np.ndarray
    mean: np.ndarray
    std: np.ndarray

    def _design(self, x: np.ndarray) -> np.ndarray:
        x = (np.asarray(x, dtype=np.float64) - self.mean) / self.std
        return np.concatenate([x, np.full((x.shape[0], 1), BIAS_FEATURE)], axis=1)  # (n, F + 1)

    def decision_function(self, x: np.ndarray) -> np.ndarray:
        """(n, F) features -> (n, K) regression outputs."""
        return self._design(x) @ self.weight

    def predict(self, x: np.ndarray) -> np.ndarray:
        """(n, F) features -> (n,) predicted classes."""
        return self.decision_function(x).argmax(axis=1)


def fit_ridge(x: np.ndarray, y: np.ndarray, num_classes: int, l2_reg: float = DEFAULT_L2) -> RidgeClassifier:
    """Fit the regularised least-squares classifier on (n, F) features and (n,) integer labels."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y)
    if x.ndim != 2 or y.shape != (x.shape[0],):
        raise ValueError(f"expected features (n, F) and labels (n,), got {x.shape} and {y.shape}")
    if l2_reg < 0:
        raise ValueError(f"l2_reg must be non-negative, got {l2_reg}")
    if y.size and (y.min() < 0 or y.max() >= num_classes):
        raise ValueError(f"labels must be in [0, {num_classes}), got range [{y.min()}, {y.max()}]")
    mean = x.mean(axis=0)
    std = x.std(axis=0) + 1e-5
    clf = RidgeClassifier(weight=np.empty(0), mean=mean, std=std)
    a = clf._design(x)  # (n, F + 1)
    targets = 2.0 * np.eye(num_classes)[y] - 1.0  # (n, K) in {-1, 1}
    n, f = a.shape
    if n >= f:  # primal: (A^T A + l2 I)^-1 A^T Y, an (F+1) x (F+1) system
        clf.weight = np.linalg.solve(a.T @ a + l2_reg * np.eye(f), a.T @ targets)
    else:  # dual: A^T (A A^T + l2 I)^-1 Y, an n x n system
        clf.weight = a.T @ np.linalg.solve(a @ a.T + l2_reg * np.eye(n), targets)
    return clf


def draw_shots(labels: np.ndarray, shots: int, num_classes: int, rng: np.random.Generator) -> np.ndarray:
    """Indices of `shots` examples per class, drawn without replacement; raises if a class has too few."""
    idx = []
    for c in range(num_classes):
        members = np.flatnonzero(labels == c)
        if members.size < shots:
            raise ValueError(f"class {c} has {members.size} training examples, fewer than {shots} shots")
        idx.append(rng.choice(members, size=shots, replace=False))
    return np.concatenate(idx)


@dataclass
class FewShotResult:
    """Accuracy of one shot count over several draws.

    Attributes:
        shots: Examples per class.
        accuracies: (seeds,) test accuracy of each draw, in [0, 1].
        mean: Mean accuracy.
        std: Standard deviation over the draws (ddof=0).
    """

    shots: int
    accuracies: np.ndarray
    mean: float
    std: float

    def to_dict(self) -> dict:
        return {"shots": self.shots, "mean": self.mean, "std": self.std, "accuracies": self.accuracies.tolist()}


def fewshot_evaluate(
    train_x: np.ndarray,
    train_y: np.ndarray,
    test_x: np.ndarray,
    test_y: np.ndarray,
    shots: Sequence[int] = DEFAULT_SHOTS,
    seeds: int = 5,
    l2_reg: float = DEFAULT_L2,
    num_classes: int | None = None,
) -> list[FewShotResult]:
    """Few-shot accuracy on the test set for each shot count, over `seeds` random draws from the train pool.

    Args:
        train_x, train_y: (n, F) features and (n,) labels to draw the shots from.
        test_x, test_y: (m, F) features and (m,) labels of the evaluation split.
        shots: Examples per class to draw.
        seeds: Number of draws (seed s uses numpy's default_rng(s)).
        l2_reg: Ridge strength.
        num_classes: Classes; inferred from the labels when None.
    """
    train_y = np.asarray(train_y)
    test_y = np.asarray(test_y)
    if seeds < 1:
        raise ValueError(f"seeds must be at least 1, got {seeds}")
    if not shots or any(int(s) < 1 for s in shots):
        raise ValueError(f"shots must be positive integers, got {list(shots)}")
    if train_x.shape[1] != test_x.shape[1]:
        raise ValueError(f"train and test features differ in width: {train_x.shape[1]} vs {test_x.shape[1]}")
    if num_classes is None:
        num_classes = int(max(train_y.max(), test_y.max())) + 1
    results = []
    for k in shots:
        accs = []
        for seed in range(seeds):
            idx = draw_shots(train_y, int(k), num_classes, np.random.default_rng(seed))
            clf = fit_ridge(train_x[idx], train_y[idx], num_classes, l2_reg)
            accs.append(float((clf.predict(test_x) == test_y).mean()))
        a = np.asarray(accs)
        results.append(FewShotResult(shots=int(k), accuracies=a, mean=float(a.mean()), std=float(a.std())))
    return results
