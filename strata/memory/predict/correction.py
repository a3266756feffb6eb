"""A learned correction of the router look-ahead, fitted online by least squares.

The look-ahead applies layer t's router to the hidden state h_s of an earlier layer s, as if the
residual stream had stopped changing. The correction learns how it does change: during decode the
hidden state of layer t arrives a few layers later, and its router logits z_t (what layer t really
routes on) are the target for what was predicted from h_s. Per (source, target) pair:

    z_t ~ base + [base, z_s, onehot_k(z_s), 1] @ W        # [T, E]; base = router_t(norm_t(h_s))

with z_s layer s's own router logits on h_s (the logits it routes on; zeros from the embeddings)
and onehot_k their top-k (the co-occurrence evidence: a linear table from the experts chosen at s
to the logits at t, fitted jointly with the look-ahead's weight). Fitting the full map
h_s -> h_t (D x D) and applying the router after it would give the same logits wherever the map
lies in the routers' row space (least squares commutes with a linear router), so the map is fitted
in that low-rank space of 3E + 1 features instead of D: E^2 rather than D^2 numbers per pair, and
the residual form shrinks towards the plain look-ahead (W = 0) under the ridge penalty, so an
unfitted or starved correction predicts exactly what the look-ahead does. The RMS norm's scale
of the predicted state changes no top-k and is dropped.

W minimises |X W - R|^2 + lam |W|^2 over the last `capacity` pairs (rows X of features, R = z_t -
base), lam = ridge * mean(diag X^T X) so the penalty follows the features' scale. X^T X and X^T R
are kept up to date as pairs enter and leave the ring buffer (recursive least squares over a
window), and W is solved again every `refit_every` pairs. Plain numpy; the maths of the routers
stays in `strata.models.moe.Lookahead`, which feeds logits here and reads corrected logits back.
"""
from __future__ import annotations

import numpy as np

from strata.errors import StrataError

#: Pairs a window holds, pairs between refits, and the ridge weight (relative to the features'
#: mean square). Chosen on the synthetic presets (strata bench predict); see docs/memory.md.
DEFAULT_CAPACITY = 2048
DEFAULT_REFIT_EVERY = 64
DEFAULT_RIDGE = 1.0


class RidgeFit:
    """The ridge least-squares map W [F, E] from features to targets over a window of pairs."""

    def __init__(self, n_features: int, n_targets: int, capacity: int = DEFAULT_CAPACITY,
                 ridge: float = DEFAULT_RIDGE, refit_every: int = DEFAULT_REFIT_EVERY) -> None:
        if n_features < 1 or n_targets < 1 or capacity < 1 or ridge < 0 or refit_every < 1:
            raise StrataError(f"ridge fit: need features, targets, capacity, refit_every >= 1 and ridge >= 0; "
                              f"found {n_features}, {n_targets}, {capacity}, {refit_every}, {ridge}")
        self.capacity, self.ridge, self.refit_every = capacity, float(ridge), refit_every
        self.x = np.zeros((capacity, n_features))  # [N, F] ring buffer of features
        self.y = np.zeros((capacity, n_targets))  # [N, E] and of targets
        self.xtx = np.zeros((n_features, n_features))  # [F, F] over the rows held
        self.xty = np.zeros((n_features, n_targets))  # [F, E]
        self.weight = np.zeros((n_features, n_targets))  # [F, E] the map; 0 until fitted
        self.held = 0  # rows in the buffer
        self._next = 0  # the row the next pair overwrites
        self._since_fit = 0

    @property
    def fitted(self) -> bool:
        return bool(self.weight.any())

    def add(self, x: np.ndarray, y: np.ndarray) -> None:
        """Pairs x [T, F], y [T, E] enter the window (the oldest leave); refit when due."""
        for lo in range(max(0, len(x) - self.capacity), len(x), self.capacity):  # a long prefill: its last rows
            xs, ys = x[lo:lo + self.capacity], y[lo:lo + self.capacity]
            rows = (self._next + np.arange(len(xs))) % self.capacity
            old = rows[rows < self.held]  # rows being overwritten leave the sums
            self.xtx -= self.x[old].T @ self.x[old]
            self.xty -= self.x[old].T @ self.y[old]
            self.x[rows], self.y[rows] = xs, ys
            self.xtx += xs.T @ xs
            self.xty += xs.T @ ys
            self.held = min(self.held + len(xs), self.capacity)
            self._next = int((rows[-1] + 1) % self.capacity)
        self._since_fit += len(x)
        if self._since_fit >= self.refit_every:
            self.fit()

    def fit(self) -> np.ndarray:
        """Solve W from the sums kept (the window's rows); returns W [F, E]."""
        self._since_fit = 0
        if self.held == 0:
            return self.weight
        lam = self.ridge * max(float(np.trace(self.xtx)) / len(self.xtx), 1e-12)
        a = self.xtx + lam * np.eye(len(self.xtx))
        self.weight = np.linalg.solve(a, self.xty) if lam > 0 else np.linalg.lstsq(a, self.xty, rcond=None)[0]
        return self.weight

    def window(self) -> tuple[np.ndarray, np.ndarray]:
        """The rows held (any order): features [n, F], targets [n, E]."""
        return self.x[:self.held], self.y[:self.held]

    def apply(self, x: np.ndarray) -> np.ndarray:
        return x @ self.weight  # [T, E]


def features(base: np.ndarray, own: np.ndarray | None, top_k: int) -> np.ndarray:
    """[base, own, onehot_k(own), 1] for T tokens: base, own [T, E] logits (own None: zeros)."""
    T, E = base.shape
    x = np.zeros((T, 3 * E + 1))  # [T, F]
    x[:, :E] = base
    if own is not None:
        x[:, E:2 * E] = own
        top = np.argpartition(-own, top_k - 1, axis=-1)[:, :top_k]  # [T, K]
        np.put_along_axis(x[:, 2 * E:3 * E], top, 1.0, axis=-1)
    x[:, -1] = 1.0
    return x


class LookaheadCorrection:
    """The corrections of one model's look-ahead, one `RidgeFit` per (source, target) layer pair,
    fed in decoding order. Layers are model layer numbers (-1: the embeddings).

    Within a step, call `step(source, own, base)` at every look-ahead source in order: `own` the
    logits source's own router makes ([T, E], None where it has none), `base` {target: the
    target's router on the source's hidden state, [T, E]}. It pairs `own` with what earlier sources
    of the step predicted for this layer (the targets their fits learn), and returns
    {target: corrected logits [T, E]}. A source at or before the previous one starts a new step."""

    def __init__(self, n_experts: int, top_k: int, capacity: int = DEFAULT_CAPACITY,
                 ridge: float = DEFAULT_RIDGE, refit_every: int = DEFAULT_REFIT_EVERY) -> None:
        self.n_experts, self.top_k = n_experts, top_k
        self.capacity, self.ridge, self.refit_every = capacity, ridge, refit_every
        self.fits: dict[tuple[int, int], RidgeFit] = {}
        self._pending: dict[int, list[tuple[int, np.ndarray, np.ndarray]]] = {}  # target -> (source, x, base)
        self._last_source: int | None = None

    def step(self, source: int, own: np.ndarray | None, base: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
        if self._last_source is not None and source <= self._last_source:
            self._pending.clear()  # a new step: what the last one left unpaired is stale
        self._last_source = source
        if own is not None:
            self._learn(source, np.asarray(own, dtype=np.float64))
        out = {}
        for target, b in base.items():
            b = np.asarray(b, dtype=np.float64)
            if b.shape[-1] != self.n_experts:
                raise StrataError(f"look-ahead correction: logits of layer {target} have {b.shape[-1]} "
                                  f"experts, expected {self.n_experts}")
            x = features(b, own, self.top_k)
            fit = self.fits.get((source, target))
            out[target] = b + fit.apply(x) if fit is not None and fit.fitted else b
            self._pending.setdefault(target, []).append((source, x, b))
        return out

    def _learn(self, layer: int, own: np.ndarray) -> None:
        for source, x, b in self._pending.pop(layer, []):
            if len(x) != len(own):
                continue  # not the same tokens (cannot happen within a step; kept safe)
            fit = self.fits.get((source, layer))
            if fit is None:
                fit = self.fits[(source, layer)] = RidgeFit(x.shape[1], self.n_experts, self.capacity, self.ridge,
                                                           self.refit_every)
            fit.add(x, own - b)


__all__ = ["DEFAULT_CAPACITY", "DEFAULT_REFIT_EVERY", "DEFAULT_RIDGE", "LookaheadCorrection", "RidgeFit", "features"]
