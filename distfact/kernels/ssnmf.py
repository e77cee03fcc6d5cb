"""Semi-supervised NMF on one row block (Haddock et al., 2020); pure numeric, no Dask.

distfact's orientation, rows are samples: X_b (m_b x n) ~ W_b H, Y_b (m_b x k) ~ W_b B, with W_b >= 0
(m_b x r, local; the paper's S^T), H >= 0 (r x n, global; the paper's A^T), B >= 0 (r x k, global;
the paper's B^T). Weights: M_b (m_b x n, the paper's data mask W^T; an :class:`Observed` (the CSR matrix of its
observed weights), a :class:`Complement`, or None for all ones, which is never built) and L_b (m_b x k, the
paper's label mask; dense, or None for all ones).

Each loss term, reconstruction R(X, W H; M) or supervision S(Y, W B; L), is Frobenius ("F",
||M o (X - W H)||_F^2) or I-divergence ("D", D(M o X || M o W H)). For the multiplicative update of W
every term gives a numerator and a denominator (m_b x r):

    F:  num = (M o X) H^T                         den = (M o W H) H^T
    D:  num = [(M o X) / (eps + M o W H) o M] H^T  den = M H^T

and for the update of its global factor (H or B) the statistics W^T (M o X) and W^T (M o W H) (F), or
W^T [(M o X) / (eps + M o W H) o M] and W^T M (D), summed over blocks. ``eps`` sits where the
reference implementation (PyPI ``ssnmf`` 1.0.3) puts it: in every denominator, and inside the
I-divergence's log as log((x + eps) / (wh + eps)). A sparse X, or a sparse mask, is only touched at
its non-zeros (the zeros of X enter the I-divergence through sum(W H) = (1^T W)(H 1)).

A data mask comes in either sparse form of ``kernels/masked.py`` (``block_mask`` reads it from a block's local
state): "observed", P = M itself (few entries observed: the terms are evaluated on M's entries, as above), given
to the kernels as an :class:`Observed`, or
"complement", P holding p = 1 - m at the entries whose weight m is not 1 (few entries masked: X's NaN entries, a
store's "complement" blocks), given to the kernels as a :class:`Complement`. With M = 1 - P every masked product
is then the unmasked one less P's entries, O(entries of P x r) on top of the unmasked term, never a product with
M's m_b x n entries:

    F:  (M o X) H^T = X H^T - (P o X) H^T          (M o W H) H^T = W (H H^T) - (P o W H) H^T
        W^T (M o X) = W^T X - W^T (P o X)          W^T (M o W H) = (W^T W) H - W^T (P o W H)
    D:  Q = x / (eps + wh) on X's support, m x / (eps + m wh) m at P's entries
        M H^T = 1 (H 1)^T - P H^T                  W^T M = (W^T 1) 1^T - W^T P

and the losses and observed sums are the unmasked ones less P's entries' contributions, plus theirs with weight m
(the differences that are non-negative in exact arithmetic are clipped at 0: a row or column of weight 0 leaves
round-off of either sign). ``observed_sums`` gives the sums over M's entries that the metrics are relative to.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from .masked import COMPLEMENT, KEPT_VALUES, OBSERVED, block_values, kept_constants, observed_block, positions_at
from .products import block_times_ht, pattern_times_ht, wh_at_nonzeros, wt_times_block, wt_times_pattern

LOSSES = ("F", "D")


def _dense_path(X, mask) -> bool:
    """A dense X with no mask or a dense one (a label mask); an :class:`Observed` data mask is evaluated on its
    entries."""
    return not sp.issparse(X) and not isinstance(mask, Observed)


def _on_support(S: sp.csr_matrix, values) -> sp.csr_matrix:
    """A CSR matrix with S's sparsity pattern and the given values."""
    out = S.copy()
    out.data = np.asarray(values, dtype=np.float64)
    return out


def _mask_values(mask: "Observed", W, H):
    """On an observed-form mask's stored entries, in its data order: M's CSR, its values m, x there, and W H there."""
    return (mask.M, *mask.values(W, H))


def _mask_terms(mask: "Observed", W, H):
    """As :func:`_mask_values`, with m * (W H) in place of W H."""
    mask, m, x, wh = _mask_values(mask, W, H)
    return mask, m, x, m * wh


@dataclass(frozen=True, eq=False)
class _MaskEntries:
    """What either sparse form of a block's data mask gives the term kernels at its stored entries (``pattern``, CSR):
    the weights m there, X_b's values ``x`` there and W H there, and the constants the block's local state keeps."""

    _last: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def values(self, W, H):
        """At the pattern's entries, in its data order: the weights m, x and W H. Asked again for the same W and H
        objects (a step's statistics, loss and observed sums at the new W_b; the kernels never change W or H in
        place), the arrays of the first call: W H there is formed once."""
        last = self._last.get("values")
        if last is not None and last[0] is W and last[1] is H:
            return last[2]
        values = self.weights(), self.x, wh_at_nonzeros(self.pattern, W, H)
        self._last["values"] = (W, H, values)
        return values

    def constants(self) -> dict:
        """What the block's local state keeps from its first step on (``masked.py: KEPT_VALUES``): x and
        ``zeroed_at``."""
        return dict(zip(KEPT_VALUES, (self.x, self.zeroed_at)))


@dataclass(frozen=True, eq=False)
class Complement(_MaskEntries):
    """A block's data mask in ``kernels/masked.py``'s complement form, as the term kernels take it: ``P`` (CSR)
    holds p = 1 - m at the entries whose weight m is not 1 (every other entry has weight 1), ``x`` X_b's values
    there, X_b read as 0 at the entries of weight 0 (:func:`block_mask`), and ``zeroed_at`` where among P's entries
    X_b held a non-zero that reads as 0."""

    P: sp.csr_matrix
    x: np.ndarray
    zeroed_at: np.ndarray

    @property
    def pattern(self) -> sp.csr_matrix:
        return self.P

    def weights(self) -> np.ndarray:
        return 1.0 - self.P.data

    def times_ht(self, values, H) -> np.ndarray:
        """(P o Z) H^T for Z's ``values`` at P's entries."""
        return pattern_times_ht(self.P, self.P.data * values, H)

    def wt_times(self, W, values) -> np.ndarray:
        """W^T (P o Z) for Z's ``values`` at P's entries."""
        return wt_times_pattern(W, self.P, self.P.data * values)


@dataclass(frozen=True, eq=False)
class Observed(_MaskEntries):
    """A block's data mask in ``kernels/masked.py``'s observed form, as the term kernels take it: ``M`` (CSR) holds
    the weights m at the observed entries (every other entry has weight 0), ``x`` X_b's values there (gathered in
    the block's first step and kept in its local state: :meth:`constants`; it zeroes no entry of X_b). What every
    term of a step reads at M's entries is formed once: W H there per (W, H) (:meth:`values`), M o X_b and m at its
    stored entries (:meth:`masked_x`)."""

    M: sp.csr_matrix
    x: np.ndarray
    zeroed_at = np.zeros(0, np.int64)

    @property
    def pattern(self) -> sp.csr_matrix:
        return self.M

    def weights(self) -> np.ndarray:
        return self.M.data

    def masked_x(self) -> tuple[sp.csr_matrix, np.ndarray]:
        """(M o X_b as a CSR matrix without explicit zeros, m at its stored entries), formed once."""
        if "masked_x" not in self._last:
            MX = sp.csr_matrix((self.M.data * self.x, self.M.indices.copy(), self.M.indptr.copy()), shape=self.M.shape)
            kept = MX.data != 0
            MX.eliminate_zeros()
            self._last["masked_x"] = MX, self.M.data[kept]
        return self._last["masked_x"]


def _weights(mask):
    """A data mask's weights as a matrix (M's CSR for an :class:`Observed`)."""
    return mask.M if isinstance(mask, Observed) else mask


def block_mask(X, local: dict):
    """(X_b, data mask) for the term kernels from a block's local state (or inputs), which holds the block's mask
    in the form of ``kernels/masked.py`` ({form: P}) or none: (X_b, None) without a mask; (X_b, P) for the
    observed form (P is M's CSR); for the complement form, X_b with 0 at its entries of weight 0 (a copy only
    when it holds a non-zero there) and with sorted indices when sparse, and the :class:`Complement` of P (its x
    and zeroed entries those the local state keeps, :meth:`Complement.constants`, when it does)."""
    if OBSERVED in local:
        M = local[OBSERVED]
        return X, Observed(M, (kept_constants(local)["values"] or block_values(X, OBSERVED, M))[0])
    if COMPLEMENT not in local:
        return X, None
    P = local[COMPLEMENT]
    values = kept_constants(local)["values"] or block_values(X, COMPLEMENT, P)
    X, x = observed_block(X, COMPLEMENT, P, values)
    if sp.issparse(X) and not X.has_sorted_indices:
        X = X.sorted_indices()
    return X, Complement(P, np.asarray(x, dtype=np.float64), values[1])


def block_sums(X) -> np.ndarray:
    """(||X_b||^2, sum X_b) in float64: what a complement-form mask's losses and sums are relative to."""
    return np.array([sq_norm(X), float(X.sum(dtype=np.float64))])


def observed_sums(X, W, H, mask, X_sums=None, F_loss: float | None = None) -> dict:
    """Over M's entries (the observed ones; ``mask`` the observed form's CSR or a :class:`Complement`) at (W, H):
    sum m (x - wh)^2 and sum m x^2 (the metric ``relative_error`` over the observed entries, weighted as
    docs/metrics.md defines it), and ||M o X||_F^2 and sum(M o X) (what a group's data term is relative to:
    ``group_errors_``). For a complement: the block's sums less P's entries' (``X_sums``: :func:`block_sums`,
    when the caller has them), and sum m (x - wh)^2 from the Frobenius data term's ``F_loss`` = sum m^2 (x - wh)^2
    when there is one (the two differ at P's entries only), else from W^T X and W^T W."""
    if isinstance(mask, Complement):
        m, x, wh = mask.values(W, H)
        p, d2 = mask.P.data, (x - wh) ** 2
        X_sq, X_total = block_sums(X) if X_sums is None else X_sums
        if F_loss is None:
            sq_error = X_sq - 2.0 * np.vdot(wt_times_block(W, X), H) + np.vdot(W.T @ W, H @ H.T) - np.sum(p * d2)
        else:
            sq_error = F_loss + np.sum((m - m * m) * d2)
        return {"M_sq_error": np.float64(max(sq_error, 0.0)), "M_sq_norm": np.float64(X_sq - np.sum(p * x * x)),
                "MX_sq_norm": np.float64(X_sq - np.sum((1.0 - m * m) * x * x)),
                "MX_total": np.float64(X_total - np.sum(p * x))}
    _, m, x, wh = _mask_values(mask, W, H)
    mx = m * x
    return {"M_sq_error": np.float64(np.sum(m * (x - wh) ** 2)),
            "M_sq_norm": np.float64(np.sum(mx * x)), "MX_sq_norm": np.float64(np.sum(mx * mx)),
            "MX_total": np.float64(np.sum(mx))}


def _masked_x(X, mask):
    """M o X as a CSR matrix with explicit zeros removed (X itself when M is all ones)."""
    return X if mask is None else mask.masked_x()[0]


def ratio(X, W, H, mask, eps: float):
    """Q = (M o X) / (eps + M o W H) o M: dense on the dense path (and for a dense X with a complement), else on
    the support of M o X (of X, for a complement: x / (eps + wh) there, m x / (eps + m wh) m at P's entries)."""
    if isinstance(mask, Complement):
        Q = ratio(X, W, H, None, eps)
        m, x, wh = mask.values(W, H)
        values = m * x / (eps + m * wh) * m
        if sp.issparse(Q):  # P's entries outside X's support hold x = 0, so Q = 0 there too
            where = positions_at(mask.P, Q)
            stored = where >= 0
            Q.data[where[stored]] = values[stored]
        else:
            Q[np.repeat(np.arange(Q.shape[0]), np.diff(mask.P.indptr)), mask.P.indices] = values
        return Q
    if _dense_path(X, mask):
        if mask is None:
            return X / (eps + W @ H)
        return mask * X / (eps + mask * (W @ H)) * mask
    if mask is None:
        return _on_support(X, X.data / (eps + wh_at_nonzeros(X, W, H)))
    MX, m = mask.masked_x()
    return _on_support(MX, MX.data / (eps + m * wh_at_nonzeros(MX, W, H)) * m)


def term_update_parts(X, W, H, mask, loss: str, eps: float, HHt=None):
    """``(num, den)`` of one loss term for the W update (m_b x r), at the current W and H. ``HHt``: H H^T, when
    the caller has it (an unmasked Frobenius term)."""
    if isinstance(mask, Complement):
        return _complement_update_parts(X, W, H, mask, loss, eps, HHt)
    if loss == "D":
        Q = ratio(X, W, H, mask, eps)
        den = np.broadcast_to(H.sum(axis=1), W.shape) if mask is None else np.asarray(_weights(mask) @ H.T)
        return np.asarray(Q @ H.T), den
    if mask is None:
        return block_times_ht(X, H), W @ (H @ H.T if HHt is None else HHt)
    if _dense_path(X, mask):
        return (mask * X) @ H.T, (mask * (W @ H)) @ H.T
    M, _, _, mwh = _mask_terms(mask, W, H)
    return np.asarray(_masked_x(X, mask) @ H.T), np.asarray(_on_support(M, mwh) @ H.T)


def _complement_update_parts(X, W, H, mask: Complement, loss: str, eps: float, HHt):
    """:func:`term_update_parts` for a complement-form mask: the unmasked products less P's entries'."""
    if loss == "D":
        num = np.asarray(ratio(X, W, H, mask, eps) @ H.T)
        return num, np.maximum(H.sum(axis=1)[None, :] - mask.times_ht(1.0, H), 0.0)
    _, x, wh = mask.values(W, H)
    num = block_times_ht(X, H) - mask.times_ht(x, H)
    return num, np.maximum(W @ (H @ H.T if HHt is None else HHt) - mask.times_ht(wh, H), 0.0)


def term_stats(X, W, H, mask, loss: str, eps: float, prefix: str) -> dict:
    """Statistics of one loss term for the update of its global factor, at (W, H). A Frobenius term with a data
    mask gives W^T (M o W H) as ``WtW`` F + ``den_adj`` (the global update forms it): for a complement
    ``WtW`` = W^T W and ``den_adj`` = -W^T (P o W H); for the observed form ``WtW`` = 0 and ``den_adj`` =
    W^T (M o W H) (so that blocks of either form add up)."""
    if isinstance(mask, Complement):
        if loss == "D":
            den = W.sum(axis=0)[:, None] - mask.wt_times(W, 1.0)
            return {f"{prefix}_num": wt_times_block(W, ratio(X, W, H, mask, eps)),
                    f"{prefix}_den": np.maximum(den, 0.0)}
        _, x, wh = mask.values(W, H)
        return {f"{prefix}_num": wt_times_block(W, X) - mask.wt_times(W, x), f"{prefix}_WtW": W.T @ W,
                f"{prefix}_den_adj": -mask.wt_times(W, wh)}
    if loss == "D":
        den = W.sum(axis=0) if mask is None else wt_times_block(W, _weights(mask))  # W^T 1 broadcasts over columns
        return {f"{prefix}_num": wt_times_block(W, ratio(X, W, H, mask, eps)), f"{prefix}_den": den}
    if mask is None:  # W^T (W H) = (W^T W) H, formed on the driver
        return {f"{prefix}_num": wt_times_block(W, X), f"{prefix}_WtW": W.T @ W}
    if _dense_path(X, mask):
        return {f"{prefix}_num": W.T @ (mask * X), f"{prefix}_den": W.T @ (mask * (W @ H))}
    M, _, _, mwh = _mask_terms(mask, W, H)
    r = W.shape[1]
    return {f"{prefix}_num": wt_times_block(W, _masked_x(X, mask)), f"{prefix}_WtW": np.zeros((r, r)),
            f"{prefix}_den_adj": wt_times_block(W, _on_support(M, mwh))}


def global_update(F, stats: dict, loss: str, eps: float, prefix: str):
    """The multiplicative update of a global factor (H for the data, B for the labels), from the
    statistics summed over blocks: F: F / (eps + W^T (M o W F)) o W^T (M o Z); D: F / (eps + W^T M) o W^T Q."""
    num = stats[f"{prefix}_num"]
    if f"{prefix}_WtW" in stats:
        den = stats[f"{prefix}_WtW"] @ F
        if f"{prefix}_den_adj" in stats:  # a data mask (term_stats); 0 + den_adj is den_adj for the observed form
            den = np.maximum(den + stats[f"{prefix}_den_adj"], 0.0)
    else:
        den = stats[f"{prefix}_den"]
        den = den[:, None] if den.ndim == 1 else den
    return F / (eps + den) * num


def sq_norm(X) -> float:
    """||X||_F^2 of a dense or CSR block; a float32 block's accumulated in float64 (BLAS's float32 dot of a
    2,000 x 3,000 block was 2.5e-5 off, relative)."""
    if X.dtype != np.float64:
        values = X.data if sp.issparse(X) else X.reshape(-1)
        return float(np.einsum("i,i->", values, values, dtype=np.float64))
    return float(X.multiply(X).sum()) if sp.issparse(X) else float(np.vdot(X, X))


def term_loss(X, W, H, mask, loss: str, eps: float, stats: dict | None = None, prefix: str = "",
              HHt=None, X_sq_norm: float | None = None) -> float:
    """The term's value at (W, H): ||M o (X - W H)||_F^2 or D(M o X || M o W H), with the package's
    x log((x + eps) / (wh + eps)); a sparse X is only read at its non-zeros. Without a mask, a Frobenius
    term comes from the term's statistics at (W, H) (``term_stats``), never forming W H:
    ||X - W H||^2 = ||X||^2 - 2 <W^T X, H> + <W^T W, H H^T>, with ``HHt`` (H H^T) and ``X_sq_norm``
    (||X||^2, :func:`sq_norm`) when the caller has them. With a complement-form mask: the unmasked value less P's
    entries' terms plus theirs with weight m; a Frobenius term then takes the term's statistics (``stats``)
    and ``X_sq_norm`` is the zeroed X_b's."""
    if isinstance(mask, Complement):
        return _complement_loss(X, W, H, mask, loss, eps, stats, prefix, HHt, X_sq_norm)
    if loss == "F" and mask is None and stats is not None:
        X_sq_norm = sq_norm(X) if X_sq_norm is None else X_sq_norm
        HHt = H @ H.T if HHt is None else HHt
        value = X_sq_norm - 2.0 * np.vdot(stats[f"{prefix}_num"], H) + np.vdot(stats[f"{prefix}_WtW"], HHt)
        return max(float(value), 0.0)
    if _dense_path(X, mask):
        MX = X if mask is None else mask * X
        MWH = W @ H if mask is None else mask * (W @ H)
    elif mask is None:  # sparse X, every entry observed: the zeros only add through sums of W H
        x, wh = X.data, wh_at_nonzeros(X, W, H)
        if loss == "F":
            return float(np.sum((x - wh) ** 2) - np.sum(wh ** 2) + np.vdot(W.T @ W, H @ H.T))
        return float(np.sum(x * np.log((x + eps) / (wh + eps)) - x) + W.sum(axis=0) @ H.sum(axis=1))
    else:
        _, m, x, MWH = _mask_terms(mask, W, H)
        MX = m * x
    if loss == "F":
        return float(np.sum((MX - MWH) ** 2))
    return float(np.sum(_divergence(MX, MWH, eps)))


def _divergence(x, wh, eps: float):
    """The I-divergence's entries x log((x + eps) / (wh + eps)) - x + wh."""
    return x * np.log((x + eps) / (wh + eps)) - x + wh


def _complement_loss(X, W, H, mask: Complement, loss: str, eps: float, stats, prefix: str, HHt, X_sq_norm):
    """:func:`term_loss` for a complement-form mask. F: ||X - W H||^2 from the statistics (W^T X = ``num`` +
    W^T (P o X), and <W^T (P o X), H> = sum_P p x wh) less sum_P (1 - m^2) (x - wh)^2; D: the unmasked divergence
    less P's entries' plus theirs at (m x, m wh)."""
    m, x, wh = mask.values(W, H)
    if loss == "D":
        value = term_loss(X, W, H, None, "D", eps) - np.sum(_divergence(x, wh, eps)) + \
            np.sum(_divergence(m * x, m * wh, eps))
        return max(float(value), 0.0)
    X_sq_norm = sq_norm(X) if X_sq_norm is None else X_sq_norm
    HHt = H @ H.T if HHt is None else HHt
    WtX_H = np.vdot(stats[f"{prefix}_num"], H) + np.dot(mask.P.data * x, wh)
    value = X_sq_norm - 2.0 * WtX_H + np.vdot(stats[f"{prefix}_WtW"], HHt) - np.sum((1.0 - m * m) * (x - wh) ** 2)
    return max(float(value), 0.0)


def w_update(W, parts: list, eps: float):
    """W <- W / (eps + sum_t c_t den_t) o sum_t c_t num_t over the loss terms ``parts`` = [(c_t, (num_t, den_t))]."""
    # a weight of 1 is not multiplied by: 1.0 * x is x, bitwise (FF and DD with lam = 1, every iteration)
    num = sum(n if c == 1.0 else c * n for c, (n, _) in parts)
    den = sum(d if c == 1.0 else c * d for c, (_, d) in parts)
    return W / (eps + den) * num
