"""How the curation job's training schedule was chosen: full-batch Adam vs GD vs mini-batches.

Runs in one process, without Beam, on the job's own data (the built-in labelled corpus, the
same 10% of flipped labels) and model (pipelines/curate/model.py), so it takes seconds:

* the cost of summing per-record gradients (what ReduceKernel does) against the gradient of
  a batch's summed loss, per batch of 64;
* the loss and the AUROC of GraNd / EL2N / loss after a number of full-batch steps with Adam
  (the job's default) and with plain gradient descent, and after epochs of mini-batch Adam.

Run it::

    python bench/curate_steps.py
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from beam_jax.text import SentenceEncoder, labelled_corpus  # noqa: E402
from pipelines.curate import model as cm  # noqa: E402
from pipelines.curate import passes, report  # noqa: E402

BUCKET = 256


def load(flip_fraction: float, seed: int):
    classes, rows = labelled_corpus()
    noise = passes.LabelNoise(classes, flip_fraction, seed)
    tokenizer = SentenceEncoder.from_dir().tokenizer()
    encoded = [tokenizer.encode(t) for _, t, _ in rows]
    tokens = np.zeros((len(rows), BUCKET), np.int32)
    lengths = np.zeros(len(rows), np.int32)
    for i, ids in enumerate(encoded):
        tokens[i, : len(ids) - 2] = ids[1:-1]
        lengths[i] = len(ids) - 2
    true, observed = np.array([noise.observe(k, label) for k, _, label in rows]).T
    return classes, tokens, lengths, observed.astype(np.int32), true != observed


def mean_loss(params, tokens, lengths, labels):
    losses = jax.vmap(cm.example_loss, in_axes=(None, 0, 0, 0))(params, tokens, lengths, labels)
    return jnp.mean(losses)


def scores(params, tokens, lengths, labels, batch=256) -> dict[str, np.ndarray]:
    run = jax.jit(cm.score_kernel)
    parts = [
        run(params, {"tokens": tokens[s : s + batch], "label": labels[s : s + batch]},
            {"L": lengths[s : s + batch]})
        for s in range(0, len(labels), batch)
    ]  # fmt: skip
    return {k: np.concatenate([np.asarray(p[k]) for p in parts]) for k in ("grand", "el2n", "loss")}


def best_auroc(params, tokens, lengths, labels, flipped) -> dict[str, float]:
    s = scores(params, tokens, lengths, labels)
    return {k: report.auroc(v, flipped) for k, v in s.items()}


def time_gradient_sums(tokens, lengths, labels, num_classes: int, repeats: int = 10):
    params = cm.init_params(cm.ModelConfig(num_classes=num_classes), 0)
    t, n, y = tokens[:64, :96], lengths[:64].clip(max=96), labels[:64]
    per_record = jax.jit(
        lambda p: jax.tree.map(
            lambda g: g.sum(0),
            jax.vmap(cm.gradient_kernel, in_axes=(None, 0, 0))(
                p, {"tokens": t, "label": y}, {"L": n}
            )["grad"],
        )
    )
    summed = jax.jit(jax.grad(lambda p: jnp.sum(
        jax.vmap(cm.example_loss, in_axes=(None, 0, 0, 0))(p, t, n, y))))  # fmt: skip
    out = {}
    for name, fn in (("sum of per-record gradients", per_record), ("gradient of the sum", summed)):
        jax.block_until_ready(fn(params))
        start = time.perf_counter()
        for _ in range(repeats):
            jax.block_until_ready(fn(params))
        out[name] = (time.perf_counter() - start) / repeats * 1000
    return out


class GradientDescent:
    """Plain gradient descent with ``Adam``'s ``init`` / ``update`` interface."""

    def __init__(self, learning_rate: float):
        self.learning_rate = learning_rate

    def init(self, params):
        return None

    def update(self, grad, state, params):
        return {k: params[k] - self.learning_rate * np.asarray(grad[k]) for k in params}, state


def full_batch(optimizer, params, tokens, lengths, labels, steps):
    grad_fn = jax.jit(jax.grad(mean_loss))
    state = optimizer.init(params)
    for _ in range(steps):
        grad = grad_fn(params, tokens, lengths, labels)
        params, state = optimizer.update({k: np.asarray(v) for k, v in grad.items()}, state, params)
    return params


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flip_fraction", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    classes, tokens, lengths, labels, flipped = load(args.flip_fraction, args.seed)
    config = cm.ModelConfig(num_classes=len(classes))
    print(f"{len(labels)} records, {int(flipped.sum())} flipped, {len(classes)} classes\n")

    times = time_gradient_sums(tokens, lengths, labels, len(classes))
    print("per batch of 64 records (96 tokens), ms:",
          ", ".join(f"{k} {v:.1f}" for k, v in times.items()), "\n")  # fmt: skip

    print(f"{'schedule':<40}{'steps':>6}{'loss':>8}{'GraNd':>8}{'EL2N':>8}{'loss AUROC':>12}")

    final = jax.jit(mean_loss)

    def row(name, steps, params):
        a = best_auroc(params, tokens, lengths, labels, flipped)
        loss = float(final(params, tokens, lengths, labels))
        print(f"{name:<40}{steps:>6}{loss:>8.3f}"
              f"{a['grand']:>8.3f}{a['el2n']:>8.3f}{a['loss']:>12.3f}")  # fmt: skip

    for steps in (5, 10, 14, 20, 30):
        params = cm.init_params(config, args.seed)
        params = full_batch(cm.Adam(0.05), params, tokens, lengths, labels, steps)
        row("full-batch Adam, lr 0.05 (the job)", steps, params)
    for lr in (10.0, 30.0):
        for steps in (14, 100):
            params = cm.init_params(config, args.seed)
            params = full_batch(GradientDescent(lr), params, tokens, lengths, labels, steps)
            row(f"full-batch GD, lr {lr:g}", steps, params)
    rng = np.random.default_rng(args.seed)
    grad_fn = jax.jit(jax.grad(mean_loss))
    for lr in (0.01, 0.05):
        opt = cm.Adam(learning_rate=lr)
        params = cm.init_params(config, args.seed)
        state = opt.init(params)
        steps = 0
        for epoch in range(1, 4):
            order = rng.permutation(len(labels))
            for s in range(0, len(order), 64):
                i = order[s : s + 64]
                grad = grad_fn(params, tokens[i], lengths[i], labels[i])
                grad = {k: np.asarray(v) for k, v in grad.items()}
                params, state = opt.update(grad, state, params)
                steps += 1
            row(f"mini-batch (64) Adam, lr {lr}, epoch {epoch}", steps, params)


if __name__ == "__main__":
    main()
