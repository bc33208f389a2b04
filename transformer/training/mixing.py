"""The training stream of several corpora (``data.corpora``, ``runtime/corpora.py``): how many pairs of each
an epoch holds, and which.

**An epoch** holds ``count_i = round(p_i × Σ_j w_j n_j)`` pairs of corpus i, with n_i its kept training pairs,
w_i its weight and p_i ∝ (w_i n_i)^(1/T), T = ``data.sampling_temperature``: at T = 1, simply round(w_i n_i)
(weight 2: every pair twice; weight 0.5: a fresh random half each epoch); a higher T moves the shares towards
equal ones (multilingual balancing). Each corpus gives ``count_i // n_i`` whole copies of itself and a random
``count_i % n_i`` of its pairs, drawn again every epoch from ``train.seed`` and the epoch.
"""

import numpy as np


def epoch_counts(sizes: list[int], weights: list[float], temperature: float) -> list[int]:
    """Pairs of each corpus in one epoch: round(p_i × Σ w_j n_j), p_i ∝ (w_i n_i)^(1/T) (module docstring)."""
    weighted = np.asarray(weights, dtype=np.float64) * np.asarray(sizes, dtype=np.float64)
    if not weighted.sum() > 0:
        return [0] * len(sizes)
    with np.errstate(divide="ignore"):  # a corpus with no pair left: log 0 = -inf, share 0
        logs = np.log(weighted) / temperature  # in logs: no overflow for a small temperature
    shares = np.exp(logs - logs.max())
    return [int(round(share * weighted.sum())) for share in shares / shares.sum()]


def epoch_indices(kept: list[np.ndarray], counts: list[int], seed: int, epoch: int) -> np.ndarray:
    """The training pairs of one epoch (with repeats): of each corpus (``kept``: its pairs' indices),
    ``count // n`` whole copies and a random ``count % n`` of them, drawn from (seed, epoch, corpus)."""
    chosen = []
    for i, (indices, count) in enumerate(zip(kept, counts)):
        copies, rest = divmod(count, len(indices)) if len(indices) else (0, 0)
        chosen += [indices] * copies
        if rest:
            generator = np.random.default_rng([seed % 2**32, epoch, i])  # any train.seed, negative too
            chosen.append(np.sort(generator.choice(indices, size=rest, replace=False)))
    return np.concatenate(chosen) if chosen else np.zeros(0, dtype=np.int64)
