"""What a curation run found: AUROC and precision of each score, the summary, the plot.

Pure numpy and scipy (matplotlib only for the plot, imported on the driver when plotting).

Example:
    >>> auroc(np.array([0.1, 0.4, 0.35, 0.8]), np.array([False, False, True, True]))
    0.75
    >>> precision_at(np.array([0.1, 0.4, 0.35, 0.8]), np.array([False, False, True, True]), 0.5)
    0.5
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np
import scipy.stats

from beam_jax.jobs import counted, open_atomically

SCORES = ("grand", "el2n", "loss")
TOP_FRACTION = 0.1  # precision is reported for the top 10% of records by score


@dataclasses.dataclass(frozen=True)
class PassStats:
    """One full-batch pass: mean loss and accuracy at the parameters it started from, records
    summed, records dead-lettered, batch shapes compiled, and wall seconds."""

    loss: float
    accuracy: float
    count: int
    dead_letters: int
    compiles: int
    seconds: float


@dataclasses.dataclass(frozen=True)
class CurateSummary:
    """What a finished run did and found (``summary.json``, docs/curate.md); ``auroc`` and
    ``precision_at_top`` are empty when nothing (or everything) was flipped."""

    rows: int
    records: int
    dead_letters_by_stage: dict[str, int]
    classes: tuple[str, ...]
    flipped: int
    boundaries: tuple[int, ...]
    passes: tuple[PassStats, ...]
    final_loss: float
    auroc: dict[str, float]
    precision_at_top: dict[str, float]
    seconds: dict[str, float]

    @property
    def dead_letters(self) -> int:
        return sum(self.dead_letters_by_stage.values())

    @property
    def losses(self) -> list[float]:
        """The mean loss before each pass, then at the scored parameters."""
        return [p.loss for p in self.passes] + [self.final_loss]

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "losses": self.losses}

    @classmethod
    def from_json(cls, record: Mapping) -> CurateSummary:
        """The summary :meth:`to_json` gave (``summary.json``)."""
        values = {f.name: record[f.name] for f in dataclasses.fields(cls)}
        passes = tuple(PassStats(**p) for p in values.pop("passes"))
        tuples = {n: tuple(values.pop(n)) for n in ("classes", "boundaries")}
        return cls(**values, **tuples, passes=passes)

    def __str__(self) -> str:
        found = ", ".join(
            f"{s} AUROC {self.auroc[s]:.3f} / P@10% {self.precision_at_top[s]:.2f}"
            for s in SCORES
            if s in self.auroc
        )
        return (
            f"curate: {counted(self.rows, 'row')} -> {counted(self.records, 'record')} "
            f"({self.flipped} flipped), {counted(self.dead_letters, 'dead letter')}; "
            f"{counted(len(self.passes), 'full-batch pass')}, loss "
            f"{self.passes[0].loss:.3f} -> {self.final_loss:.3f}; {found or 'no flips to find'}"
            f"; {self.seconds['total']:.1f} s wall"
        )


def auroc(scores: np.ndarray, positives: np.ndarray) -> float:
    """The probability that a random positive scores above a random negative (ties count
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
    ranks = scipy.stats.rankdata(scores)  # ties share the mean of their ranks
    return float((ranks[positives].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def precision_at(scores: np.ndarray, positives: np.ndarray, fraction: float) -> float:
    """The share of positives among the ``ceil(fraction * n)`` highest scores."""
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be within (0, 1], got {fraction}.")
    positives = np.asarray(positives, bool)
    k = max(1, math.ceil(fraction * len(positives)))
    top = np.argsort(-np.asarray(scores, np.float64), kind="stable")[:k]
    return float(positives[top].mean())


def found(scores: Mapping[str, np.ndarray], flipped: np.ndarray) -> tuple[dict, dict]:
    """``(auroc, precision at the top 10%)`` of each score; empty without a flip to find."""
    if not flipped.any() or flipped.all():
        return {}, {}
    aurocs = {s: auroc(scores[s], flipped) for s in SCORES}
    precision = {s: precision_at(scores[s], flipped, TOP_FRACTION) for s in SCORES}
    return {**aurocs, "random": 0.5}, {**precision, "random": float(flipped.mean())}


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
    """Write a PNG to ``path`` (any Beam file system): the loss per pass, and each score's
    distribution, clean vs flipped."""
    from matplotlib.figure import Figure  # no pyplot: no backend chosen for the process

    flipped = np.asarray(flipped, bool)
    fig = Figure(figsize=(4.2 * (1 + len(scores)), 3.6))
    axes = fig.subplots(1, 1 + len(scores))
    ax = axes[0]
    ax.plot(range(len(losses)), losses, marker="o", markersize=3)
    ax.set(xlabel="full-batch pass", ylabel="mean cross-entropy", title="training loss")
    ax.grid(alpha=0.3)
    for ax, (name, values) in zip(axes[1:], scores.items(), strict=True):
        values = np.asarray(values, np.float64)
        bins = np.linspace(values.min(), values.max(), 41)
        for group, label in ((~flipped, "clean"), (flipped, "flipped")):
            if group.any():
                ax.hist(values[group], bins=bins, density=True, alpha=0.6, label=label)
        if flipped.any() and (~flipped).any():
            name = f"{name} (AUROC {auroc(values, flipped):.3f})"
        ax.set(title=name, xlabel="score", ylabel="density")
        ax.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    with open_atomically(path) as png:
        fig.savefig(png, format="png", dpi=110)
