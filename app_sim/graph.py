"""The simulated follower graph: heavy-tailed, like real social networks.

Each user gets a popularity weight from a power law (Zipf over a random ranking of users), and
follows ``out_degree`` distinct others chosen with probability proportional to popularity, so a
few celebrities hold a large share of all follows (cumulative advantage, as in preferential
attachment). Out-degrees are log-normal around the configured mean (~75 as Twitter in 2012,
capped at ``users - 1``). A share of follows is reciprocated (friends follow back; celebrities
rarely do), which is where most direct messages go. Pure numpy, deterministic from the rng.
"""

from __future__ import annotations

import numpy as np


def popularity(n_users: int, rng: np.random.Generator, exponent: float = 1.0) -> np.ndarray:
    """Probability of being followed for each user (index = user_id - 1); sums to 1."""
    ranks = rng.permutation(n_users) + 1
    w = ranks.astype(np.float64) ** -exponent
    return w / w.sum()


def follower_graph(
    n_users: int,
    mean_followers: float,
    rng: np.random.Generator,
    *,
    popularity_p: np.ndarray | None = None,
    reciprocity: float = 0.25,
) -> np.ndarray:
    """Distinct follow edges as an ``(E, 2)`` int64 array of ``[follower_id, followee_id]`` (1-based).

    ``E`` is about ``n_users * min(mean_followers, n_users - 1)``; no self-follows, no repeats.
    """
    if n_users < 2 or mean_followers <= 0:
        return np.empty((0, 2), dtype=np.int64)
    mean = min(float(mean_followers), n_users - 1.0)
    p = popularity(n_users, rng) if popularity_p is None else popularity_p
    target_edges = int(round(mean * n_users))
    # Part of the edges come from follow-backs, so draw the primary edges a bit short of the mean.
    primary_mean = mean / (1.0 + reciprocity * 0.5)
    sigma = 1.0
    out_deg = rng.lognormal(np.log(primary_mean) - sigma**2 / 2, sigma, n_users)
    out_deg = np.clip(np.rint(out_deg), 0, n_users - 1).astype(np.int64)

    n = np.int64(n_users)
    keys = np.empty(0, dtype=np.int64)  # follower * n + followee, 0-based
    deficit = out_deg
    for attempt in range(6):
        followers = np.repeat(np.arange(n_users, dtype=np.int64), deficit)
        if followers.size == 0:
            break
        if attempt < 4:
            followees = rng.choice(n_users, size=followers.size, p=p)
        else:  # celebrities saturate (at most n-1 followers each): top up uniformly
            followees = rng.integers(0, n_users, size=followers.size)
        new = followers * n + followees
        new = new[followers != followees]
        keys = np.unique(np.concatenate([keys, new]))
        got = np.bincount(keys // n, minlength=n_users)
        deficit = np.maximum(out_deg - got, 0)

    # Follow-backs: the followee of a random share of edges follows back, unless a celebrity.
    celebrity = p >= np.quantile(p, 0.99)
    fwd = keys[rng.random(keys.size) < reciprocity]
    a, b = fwd // n, fwd % n
    back = (b * n + a)[~celebrity[b]]
    keys = np.unique(np.concatenate([keys, back]))
    if keys.size > target_edges * 1.02:  # trim back to the configured mean, at random
        keys = np.sort(rng.choice(keys, size=target_edges, replace=False))
    edges = np.stack([keys // n + 1, keys % n + 1], axis=1)
    return edges


def followers_per_user(edges: np.ndarray, n_users: int) -> np.ndarray:
    """Follower count of each user (index = user_id - 1)."""
    return np.bincount(edges[:, 1] - 1, minlength=n_users)


def mutual_pairs(edges: np.ndarray, n_users: int) -> np.ndarray:
    """``(M, 2)`` pairs ``[a, b]`` with a < b that follow each other."""
    n = np.int64(n_users + 1)
    keys = edges[:, 0] * n + edges[:, 1]
    rev = edges[:, 1] * n + edges[:, 0]
    both = np.isin(keys, rev) & (edges[:, 0] < edges[:, 1])
    return edges[both]
