"""How well the curation scores find the flipped labels: AUROC, precision at the top, a plot.

Pure numpy (and matplotlib for the plot, imported only when plotting, on the driver).

Example:
    >>> auroc(np.array([0.1, 0.4, 0.35, 0.8]), np.array([False, False, True, True]))
    0.75
    >>> precision_at(np.array([0.1, 0.4, 0.35, 0.8]), np.array([False, False, True, True]), 0.5)
    0.5
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

__all__ = ["auroc", "plot", "precision_at", "require_matplotlib"]


def _average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks, ties sharing the mean of their ranks (as Mann-Whitney's U needs)."""
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values), np.float64)
    ranks[order] = np.arange(1, len(values) + 1)
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=ranks)
    return (sums / counts)[inverse]


def auroc(scores: np.ndarray, positives: np.ndarray) -> float:
    """The area under the ROC curve of ``scores`` for telling ``positives`` from the rest.

    The probability that a random positive scores above a random negative (ties count
    half): 1.0 ranks every positive first, 0.5 is chance.

    Raises:
        ValueError: If the lengths differ, or there is no positive or no negative.
    """
    scores = np.asarray(scores, np.float64)
    positives = np.asarray(positives, bool)
    if scores.shape != positives.shape or scores.ndim != 1:
        raise ValueError(
            f"scores and positives must be 1-D of one length, got {scores.shape} and "
            f"{positives.shape}."
        )
    n_pos = int(positives.sum())
    n_neg = len(positives) - n_pos
    if not n_pos or not n_neg:
        raise ValueError(
            f"AUROC needs positives and negatives, got {n_pos} and {n_neg}; flip some labels "
            "(--flip_fraction > 0) to measure it."
        )
    ranks = _average_ranks(scores)
    return float((ranks[positives].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def precision_at(scores: np.ndarray, positives: np.ndarray, fraction: float) -> float:
    """The share of positives among the ``ceil(fraction * n)`` highest scores."""
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be within (0, 1], got {fraction}.")
    positives = np.asarray(positives, bool)
    k = max(1, math.ceil(fraction * len(positives)))
    top = np.argsort(-np.asarray(scores, np.float64), kind="stable")[:k]
    return float(positives[top].mean())


def require_matplotlib() -> None:
    """Fail early, with the fix, when matplotlib (needed for the plot) is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        raise ImportError(
            "the curation job draws its plot with matplotlib, which is not installed; run "
            "`pip install 'beam_jax[curate]'` (or `pip install matplotlib`)."
        ) from e


def plot(
    path: str,
    losses: Sequence[float],
    scores: Mapping[str, np.ndarray],
    flipped: np.ndarray,
    *,
    title: str = "",
) -> None:
    """Write a PNG: the loss per pass, and each score's distribution, clean vs flipped.

    Args:
        path: Where to write the PNG (a local path).
        losses: The mean training loss before each pass's update, in order.
        scores: Score name to one score per record.
        flipped: Which records had their label flipped.
        title: A line above the panels.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    flipped = np.asarray(flipped, bool)
    fig, axes = plt.subplots(1, 1 + len(scores), figsize=(4.2 * (1 + len(scores)), 3.6))
    ax = axes[0]
    ax.plot(range(len(losses)), losses, marker="o", markersize=3)
    ax.set_xlabel("full-batch pass")
    ax.set_ylabel("mean cross-entropy")
    ax.set_title("training loss")
    ax.grid(alpha=0.3)
    for ax, (name, values) in zip(axes[1:], scores.items(), strict=True):
        values = np.asarray(values, np.float64)
        bins = np.linspace(values.min(), values.max(), 41)
        for group, label in ((~flipped, "clean"), (flipped, "flipped")):
            if group.any():
                ax.hist(values[group], bins=bins, density=True, alpha=0.6, label=label)
        if flipped.any() and (~flipped).any():
            name = f"{name} (AUROC {auroc(values, flipped):.3f})"
        ax.set_title(name)
        ax.set_xlabel("score")
        ax.set_ylabel("density")
        ax.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
