"""Masked (weighted) NMF products and updates on one row block; pure numeric, no Dask.

A block's mask M_b (weights, 0 = missing) comes in one of two sparse forms, whichever stores fewer entries
(``estimators/masks.py`` chooses per block):

    "observed"     P = M_b itself (CSR of the weights): few entries observed
    "complement"   P = C_b, the CSR of 1 - m_ij at the entries whose weight is not 1: few entries masked

Every masked product costs O(stored entries of P x r) on top of the unmasked one (complement) or in place of
it (observed), never a dense product with M_b:

    (M o X) H^T   = P_x H^T                     | X H^T - P_x H^T
    (M o WH) H^T  = P_wh H^T                    | W (H H^T) - P_wh H^T
    W^T (M o X)   = W^T P_x                     | W^T X - W^T P_x
    W^T (M o WH)  = W^T P_wh                    | (W^T W) H - W^T P_wh
    M H^T, W^T M  = P H^T, W^T P                | 1 H^T - P H^T, (W^T 1) 1^T - W^T P

where P_x and P_wh are P's pattern holding p_ij x_ij and p_ij (WH)_ij (for KL, P_q holds p_ij x_ij / (WH)_ij
with WH floored as in the unmasked ratio). Denominators are floored at the dtype's machine epsilon, as in
``kernels/nmf.py``: with an empty complement every expression above is the unmasked one minus exact zeros.

The Frobenius MU step of a dense block in the complement form (what rank selection's folds give) does not form
P_x, P_wh as matrices: :func:`complement_frobenius_step` runs the tiled unmasked kernel with P's entries applied
tile by tile while the tile is in cache (both right-hand columns above, and W H at P's entries, from one sweep of
the tile's entries of P each side of the update); the other forms, losses and solvers use the products above.
"""

from __future__ import annotations

import numba
import numpy as np
import scipy.sparse as sp

from .mask_forms import COMPLEMENT, FORMS, OBSERVED
from .nmf import _dense_frobenius_local, kl_ratio, kl_stats, residual_sq_norm
from .nmf import frobenius_stats as unmasked_stats
from .products import (block_column_sums, block_times_ht, floor_eps, pattern_times_ht, wh_at_nonzeros,
                       wt_times_pattern)



@numba.njit(nogil=True, cache=True)
def _csr_positions_at(indptr, indices, x_indptr, x_indices):
    """Where each stored entry of one CSR pattern is stored in another (sorted column indices), -1 where it is not:
    a binary search per entry within the row."""
    out = np.full(indices.shape[0], -1, dtype=np.int64)
    for i in range(indptr.shape[0] - 1):
        lo, hi = x_indptr[i], x_indptr[i + 1]
        for p in range(indptr[i], indptr[i + 1]):
            j = indices[p]
            a, b = lo, hi
            while a < b:
                mid = (a + b) // 2
                if x_indices[mid] < j:
                    a = mid + 1
                else:
                    b = mid
            if a < hi and x_indices[a] == j:
                out[p] = a
    return out


def _sorted_csr(X) -> sp.csr_matrix:
    X = sp.csr_matrix(X)
    return X if X.has_sorted_indices else X.sorted_indices()


def positions_at(pattern: sp.csr_matrix, X) -> np.ndarray:
    """For each stored entry of ``pattern`` (CSR), its index in the CSR X's ``data`` (-1 where X stores none)."""
    return _csr_positions_at(pattern.indptr, pattern.indices, X.indptr, X.indices)


def values_at(pattern: sp.csr_matrix, X) -> np.ndarray:
    """X's values at the stored entries of ``pattern`` (CSR), in ``pattern.data``'s order (0 where a sparse X
    stores nothing): O(stored entries of the pattern), X never densified."""
    if sp.issparse(X):
        X = _sorted_csr(X)
        if X.nnz == pattern.nnz and np.array_equal(X.indptr, pattern.indptr) and \
                np.array_equal(X.indices, pattern.indices):  # X's own pattern (mask="nonzero")
            return X.data
        where = positions_at(pattern, X)
        return np.where(where >= 0, X.data[np.maximum(where, 0)], np.zeros((), X.dtype)) if X.nnz else \
            np.zeros(pattern.nnz, X.dtype)
    return np.asarray(X)[_pattern_rows(pattern), pattern.indices]


def _pattern_rows(P: sp.csr_matrix) -> np.ndarray:
    return np.repeat(np.arange(P.shape[0]), np.diff(P.indptr))


#: the names under which a masked block's local state keeps :func:`block_values` from its first step on, so that later
#: steps do not gather them again (:meth:`BlockTerms.constants`). Valid for the X_b they were gathered from only: X_b
#: never changes within a fit, and a local state never serves another fit's X (checkpoints name their data). They
#: cost nnz(P) values in X's dtype beside P (about two thirds of P's size), written with the local state where it is
#: spilled, and kept per model in a sweep whose models share P.
KEPT_VALUES = ("x_at_P", "zeroed_at_P")


def kept_constants(local: dict) -> dict:
    """The constants a masked block's local state keeps (:meth:`BlockTerms.constants`; None before its first step)
    as :class:`BlockTerms` takes them: ``X_sums`` and ``values`` (ValueError unless as many values as P has
    entries)."""
    x_name, zeroed_name = KEPT_VALUES
    if x_name not in local:
        return {"X_sums": local.get("X_sums"), "values": None}
    stored = local[mask_of(local)[0]].nnz
    if len(local[x_name]) != stored:
        raise ValueError(f"a masked block's kept values ({x_name}) number {len(local[x_name])}, its mask's entries "
                         f"{stored}: the local state is not this block's")
    return {"X_sums": local.get("X_sums"), "values": (local[x_name], local[zeroed_name])}


def block_values(X, form: str, P: sp.csr_matrix) -> tuple[np.ndarray, np.ndarray]:
    """A masked block's constants for :func:`observed_block`: X_b's values x at P's entries, in P.data's order (0 at
    the entries of weight 0), and the positions among P's entries where X_b holds a non-zero of weight 0 (int64;
    none for the observed form, whose X_b is read at P's entries only). A method that keeps them in the block's local
    state after its first step (:data:`KEPT_VALUES`) skips gathering x again on every pass (a tenth of a masked
    step's time, issue 19)."""
    x = values_at(P, X)
    if form == OBSERVED:
        return x, np.zeros(0, np.int64)
    missing = (P.data == 1) & (x != 0)
    zeroed_at = np.flatnonzero(missing)
    if len(zeroed_at):
        x = np.where(missing, np.zeros((), x.dtype), x)
    return x, zeroed_at


def observed_block(X, form: str, P: sp.csr_matrix, values: tuple | None = None):
    """(X_b, x): X_b with 0 at the entries of weight 0 (X_b itself unless it holds a non-zero there: a copy made
    only then, e.g. when one X serves models of different masks), and its values at P's entries. So every product
    of a masked block sees the same X_b whatever X held at its missing entries. ``values``: what
    :func:`block_values` gave for this block (x is then not gathered again; a sparse X_b's zeroed entries are still
    found in its CSR arrays)."""
    x, zeroed_at = block_values(X, form, P) if values is None else values
    if not len(zeroed_at):
        return X, x
    if sp.issparse(X):
        X = _sorted_csr(X).copy()
        where = positions_at(P, X)[zeroed_at]
        if (where < 0).any():  # values kept from another X_b: never zero an entry that is not there
            raise ValueError("a masked block's kept zeroed entries are not stored in its X_b: the values are not this "
                             "block's")
        X.data[where] = 0
        X.eliminate_zeros()
    else:
        X = np.array(X, copy=True)
        if _zero_at_entries(X, P.indptr, P.indices, np.asarray(zeroed_at, np.int64)):
            raise ValueError("a masked block's kept zeroed entries are not among its mask's entries: the values are "
                             "not this block's")
    return X, x


@numba.njit(nogil=True, cache=True)
def _zero_at_entries(X, indptr, indices, entries) -> bool:
    """X[i, j] <- 0 at P's ``entries`` (positions among its stored entries, in P.data's order; P given by ``indptr``
    and ``indices``): each entry's row found by walking P's rows from the last one's (``entries`` ascending, as
    :func:`block_values` makes them: one scan of P's rows, not a binary search an entry; numpy's fancy assignment
    with ``searchsorted`` took 28 of a 250 us masked step on a 600 x 20 block, issue 19), from the first row again
    for an entry before it. Returns True, having written nothing, if an entry is not one of P's, or names a column
    beyond X's."""
    n_entries, n_columns = indptr[-1], X.shape[1]
    for e in entries:
        if e < 0 or e >= n_entries or indices[e] < 0 or indices[e] >= n_columns:
            return True
    row = 0
    for e in entries:
        if e < indptr[row]:
            row = 0
        while indptr[row + 1] <= e:
            row += 1
        X[row, indices[e]] = 0
    return False


def zeroed(X, local):
    """X_b with 0 at its missing entries when ``local`` is a masked block's local state (else X_b)."""
    return observed_block(X, *mask_of(local))[0] if isinstance(local, dict) else X


def mask_of(local: dict) -> tuple[str, sp.csr_matrix]:
    """(form, P) of a masked block's local state."""
    for form in FORMS:
        if form in local:
            return form, local[form]
    raise ValueError(f"a masked block's local state holds none of {FORMS}: {sorted(local)}")


def _sums(X) -> tuple[float, float]:
    """(sum x^2, sum x) of a block, in float64."""
    values = (X.data if sp.issparse(X) else X).reshape(-1)
    return float(np.einsum("i,i->", values, values, dtype=np.float64)), float(values.sum(dtype=np.float64))


class BlockTerms:
    """One masked block at (W_b, H): X_b with its missing entries zeroed and its values x at P's entries
    (:func:`observed_block`), P's weights p (in W's dtype) and W H at P's entries. ``base``: terms of the same
    block at another W, whose X_b, x and block sums are reused. ``X_sums``: (sum x^2, sum x) of the zeroed X_b
    in float64, and ``values``: what :func:`block_values` gives for X_b, when known (a block's constants, kept in
    its local state after its first step: :meth:`constants`, :func:`kept_constants`)."""

    def __init__(self, X, W, H, form: str, P: sp.csr_matrix, base: BlockTerms | None = None, X_sums=None,
                 values=None):
        self.W, self.H, self.form, self.P = W, H, form, P
        if base is not None:
            self.X, x, self._X_sums, self._values = base.X, base.x, base._X_sums, base._values
        else:
            self._values = block_values(X, form, P) if values is None else values
            (self.X, x), self._X_sums = observed_block(X, form, P, self._values), X_sums
        self.x = x.astype(W.dtype, copy=False)
        self.p = P.data.astype(W.dtype, copy=False)
        self.wh = wh_at_nonzeros(P, W, H)

    @property
    def X_sums(self) -> np.ndarray:
        """(sum x^2, sum x) of the zeroed X_b, float64 (computed once: one more read of X_b)."""
        if self._X_sums is None:
            self._X_sums = np.array(_sums(self.X))
        return self._X_sums

    def constants(self) -> dict:
        """What the block's local state keeps from its first step on (X_b never changes within a fit): X_b's values
        at P's entries and where it reads as 0 (:data:`KEPT_VALUES`) and, for the complement form, the zeroed X_b's
        sums (``X_sums``)."""
        kept = dict(zip(KEPT_VALUES, self._values))
        if self.form == COMPLEMENT:
            kept["X_sums"] = self.X_sums
        return kept

    @property
    def observed(self) -> bool:
        return self.form == OBSERVED

    def times_ht(self, values) -> np.ndarray:
        """Z H^T for Z with P's pattern holding p * ``values`` (values at P's entries, in P.data's order)."""
        return pattern_times_ht(self.P, self.p * values, self.H)

    def wt_times(self, values) -> np.ndarray:
        """W^T Z for Z with P's pattern holding p * ``values``."""
        return wt_times_pattern(self.W, self.P, self.p * values)

    def ratio(self) -> np.ndarray:
        """x / max(wh, eps) at P's entries (times p: P_q, the masked part of the KL ratio)."""
        return self.x / np.maximum(self.wh, floor_eps(self.W.dtype))

    def sq_residual(self) -> float:
        """sum over P of p (x - wh)^2, in float64."""
        d = self.x.astype(np.float64) - self.wh.astype(np.float64)
        return float(np.dot(self.p.astype(np.float64), d * d))

    def weighted_xlogx(self) -> np.float64:
        """sum over P's entries with x > 0 of p x log(x / wh), in float64 (wh floored)."""
        pos = self.x > 0
        x, wh = self.x[pos], np.maximum(self.wh[pos], floor_eps(self.W.dtype))
        return np.float64(np.dot((self.p[pos] * x).astype(np.float64), np.log(x / wh).astype(np.float64)))

    def observed_sums(self) -> tuple[float, float]:
        """(sum m x^2, sum m x) over the block, in float64: over P for the observed form, the block's sums less
        P's for the complement form."""
        p, x = self.p.astype(np.float64), self.x.astype(np.float64)
        on_p = float(np.dot(p, x * x)), float(np.dot(p, x))
        if self.observed:
            return on_p
        block = self.X_sums
        return float(block[0]) - on_p[0], float(block[1]) - on_p[1]


# --------------------------------------------------------------------- Frobenius
def frobenius_numerator(terms: BlockTerms):
    """(M o X) H^T, fixed while H is."""
    masked = terms.times_ht(terms.x)
    return masked if terms.observed else block_times_ht(terms.X, terms.H) - masked


def frobenius_w_update(HHt, num, terms: BlockTerms):
    """Weighted MU: W <- W * ((M o X) H^T) / ((M o W H) H^T), ``terms`` at the current W."""
    W = terms.W
    masked = terms.times_ht(terms.wh)
    den = masked if terms.observed else W @ HHt - masked
    return W * num / np.maximum(den, floor_eps(W.dtype))


def frobenius_local(terms: BlockTerms, HHt) -> BlockTerms:
    """Masked local step for sum m (x - wh)^2 from the block's terms at W_b: W_b by weighted MU; returns the
    block's terms at the new W_b."""
    W_new = frobenius_w_update(HHt, frobenius_numerator(terms), terms)
    return BlockTerms(terms.X, W_new, terms.H, terms.form, terms.P, terms)


def frobenius_stats(terms: BlockTerms, residual: bool) -> dict:
    """The block's statistics at (W_b, H) for the H update and the errors over observed entries:
    ``WtX`` = W^T (M o X), ``WtW`` (W^T W for the complement form, zeros for the observed one) and ``WtMWH_adj``
    such that W^T (M o W H) = WtW H + WtMWH_adj, and ``Mxx`` = sum m x^2. With ``residual``: ``sq_err`` =
    sum m (x - wh)^2 accumulated in float64 (float32 data)."""
    W, X = terms.W, terms.X
    WtPx, WtPwh = terms.wt_times(terms.x), terms.wt_times(terms.wh)
    Mxx = np.float64(terms.observed_sums()[0])
    if terms.observed:
        r = W.shape[1]
        stats = {"WtX": WtPx, "WtW": np.zeros((r, r), W.dtype), "WtMWH_adj": WtPwh, "Mxx": Mxx}
    else:
        WtX, WtW = unmasked_stats(X, W)  # the unmasked pass's own products (tiled for a large dense block)
        stats = {"WtX": WtX - WtPx, "WtW": WtW, "WtMWH_adj": -WtPwh, "Mxx": Mxx}
    if residual:
        masked = terms.sq_residual()
        stats["sq_err"] = np.float64(masked if terms.observed else residual_sq_norm(X, W, terms.H) - masked)
    return stats


def fused(X, W, H, form: str) -> bool:
    """Whether a block's Frobenius MU step goes through :func:`complement_frobenius_step`: the complement form of
    a dense, C-contiguous X_b of the factors' dtype."""
    return (form == COMPLEMENT and isinstance(X, np.ndarray) and X.flags.c_contiguous
            and X.dtype == W.dtype == H.dtype)


def complement_frobenius_step(X, W, H, HHt, P: sp.csr_matrix, X_sums, update: bool, residual: bool):
    """A dense block's masked Frobenius MU step in the complement form, fused into the tiled unmasked kernel
    (``kernels/nmf.py: _dense_frobenius_rows``): W_b's update (with ``update``; else W_b as it is, pass 0) and
    the statistics of :func:`frobenius_stats` at the new W_b, in one sweep of X_b's tiles and of P's entries per
    tile. X_b is read as 0 at its entries of weight 0 (each tile copied, so X there never matters), as
    :func:`observed_block` would zero it. ``X_sums``: the zeroed block's (sum x^2, sum x) when known, else summed
    from the same tiles. Returns (W_new, statistics, X_sums)."""
    W_new, WtX, WtW, sq_err, WtPx, WtPwh, Pxx, P_sq_err, tile_sums = _dense_frobenius_local(
        X, W, H, HHt, "mu" if update else None, None, residual,
        mask=(P.indptr, P.indices, P.data.astype(W.dtype, copy=False)), block_sums=X_sums is None)
    X_sums = tile_sums if X_sums is None else X_sums
    stats = {"WtX": WtX - WtPx, "WtW": WtW, "WtMWH_adj": -WtPwh, "Mxx": np.float64(float(X_sums[0]) - Pxx)}
    if residual:
        stats["sq_err"] = np.float64(sq_err - P_sq_err)
    return (W_new if update else W), stats, X_sums


def mu_h_update(H, WtX, WtW, WtMWH_adj):
    """Weighted MU for H: H <- H * (W^T (M o X)) / (W^T (M o W H)), from the statistics summed over blocks."""
    return H * WtX / np.maximum(WtW @ H + WtMWH_adj, floor_eps(H.dtype))


def sq_errors(G, stats) -> np.ndarray:
    """sum over group l's observed entries of m (x - wh)^2, from its statistics (float64, clipped at 0):
    sum m x^2 - 2 <W^T (M o X), H> + <W^T W, H H^T> + <WtMWH_adj, H>."""
    H = np.asarray(G["H"], dtype=np.float64)
    HHt = np.asarray(G["HHt"], dtype=np.float64)
    return np.array([max(float(s["Mxx"]) - 2.0 * np.vdot(s["WtX"], H) + np.vdot(s["WtW"], HHt)
                         + np.vdot(s["WtMWH_adj"], H), 0.0) for s in stats])


# --------------------------------------------------------- a shifted reconstruction (Stratified-NMF)
def weights_times(terms: BlockTerms) -> np.ndarray:
    """W^T M (r x n): W^T P for the observed form, (W^T 1) 1^T - W^T P for the complement form."""
    WtP = terms.wt_times(1.0)
    return WtP if terms.observed else terms.W.sum(axis=0)[:, None] - WtP


def column_sums(terms: BlockTerms) -> tuple[np.ndarray, np.ndarray]:
    """((M o X)^T 1, M^T 1), float64 n-vectors: the block's weighted column sums of X and its weights' column
    sums (over P for the observed form; the block's less P's for the complement form)."""
    n = terms.P.shape[1]
    p = terms.p.astype(np.float64)
    on_p_x = np.bincount(terms.P.indices, weights=p * terms.x.astype(np.float64), minlength=n)
    on_p = np.bincount(terms.P.indices, weights=p, minlength=n)
    if terms.observed:
        return on_p_x, on_p
    return block_column_sums(terms.X) - on_p_x, terms.P.shape[0] - on_p


def shifted_w_update(terms: BlockTerms, HHt, v, Hv, eps: float):
    """Weighted MU for W with a shift v (Stratified-NMF's line 7 over the observed entries):
    W <- W * ((M o X) H^T) / ((M o (W H + 1 v^T)) H^T + eps), the denominator floored at the dtype's machine
    epsilon as the unmasked kernel's is; (M o (WH + 1 v^T)) H^T is P_rec H^T (P's pattern holding
    p ((WH)_ij + v_j)), or W (H H^T) + 1 (H v)^T - P_rec H^T for the complement form (``Hv`` = H v)."""
    W = terms.W
    masked = terms.times_ht(terms.wh + v[terms.P.indices])
    den = masked if terms.observed else W @ HHt + Hv[None, :] - masked
    return W * frobenius_numerator(terms) / np.maximum(den + eps, floor_eps(W.dtype))


# --------------------------------------------------------------------- weighted HALS
@numba.njit(nogil=True, cache=True)
def _add_outer(G, c, v):
    """G += c v v^T."""
    for a in range(v.shape[0]):
        for b in range(v.shape[0]):
            G[a, b] += c * v[a] * v[b]


@numba.njit(nogil=True, cache=True)
def _sweep(f, b, G, floor):
    """One HALS sweep, in place, over the r entries of a row f of W (or a column of H) with its own Gram G and
    right-hand side b: ``f_k <- max(0, f_k + (b_k - f G[:, k]) / G[k, k])``, skipped where G[k, k] <= floor[k]."""
    for k in range(f.shape[0]):
        gkk = G[k, k]
        if gkk <= floor[k]:
            continue
        acc = b[k]
        for q in range(f.shape[0]):
            acc -= f[q] * G[q, k]
        value = f[k] + acc / gkk
        f[k] = value if value > 0.0 else 0.0


@numba.njit(nogil=True, cache=True)
def _hals_rows(indptr, indices, p, Ht, HHt, complement, B, W, eps):
    """Weighted HALS over W's rows, in place: row i's Gram G_i = H diag(m_i) H^T, formed from P's row i (HHt less
    the complement's terms, or the observed terms alone), then one sweep (B = (M o X) H^T), skipped where
    G_i[k, k] is 0: for the complement form, at most the round-off of its difference, (n + entries) eps HHt[k, k]."""
    m, r = W.shape
    G = np.empty((r, r), dtype=W.dtype)
    floor = np.zeros(r, dtype=W.dtype)
    sign = -1.0 if complement else 1.0
    for i in range(m):
        if complement:
            G[:] = HHt
            for k in range(r):
                floor[k] = (Ht.shape[0] + indptr[i + 1] - indptr[i]) * eps * HHt[k, k]
        else:
            G[:] = 0.0
        for q in range(indptr[i], indptr[i + 1]):
            _add_outer(G, sign * p[q], Ht[indices[q]])
        _sweep(W[i], B[i], G, floor)


@numba.njit(nogil=True, cache=True)
def _column_grams(indptr, indices, p, W, sign, n_cols):
    """sign * sum_i p_ij w_i w_i^T for every column j, over P's entries: (n_cols, r, r)."""
    out = np.zeros((n_cols, W.shape[1], W.shape[1]), dtype=W.dtype)
    for i in range(indptr.shape[0] - 1):
        for q in range(indptr[i], indptr[i + 1]):
            _add_outer(out[indices[q]], sign * p[q], W[i])
    return out


@numba.njit(nogil=True, cache=True)
def _hals_columns(Ht, WtXt, WtW, column_grams, noise):
    """Weighted HALS over H's columns, in place on H^T: column j's Gram G_j = W^T diag(m_j) W = WtW +
    column_grams[j], then one sweep (b_j = (W^T (M o X))[:, j], row j of ``WtXt``), skipped where G_j[k, k] is at
    most the round-off of the difference, ``noise`` WtW[k, k]."""
    floor = noise * np.diag(WtW).copy()
    for j in range(Ht.shape[0]):
        _sweep(Ht[j], WtXt[j], WtW + column_grams[j], floor)


def hals_local(terms: BlockTerms, HHt) -> BlockTerms:
    """Masked local step by weighted HALS (one sweep per row of W_b) from the block's terms at W_b; returns the
    block's terms at the new W_b."""
    W_new, P, H = np.array(terms.W, copy=True), terms.P, terms.H
    _hals_rows(P.indptr, P.indices, terms.p, np.ascontiguousarray(H.T), np.ascontiguousarray(HHt),
               not terms.observed, np.ascontiguousarray(frobenius_numerator(terms)), W_new, floor_eps(W_new.dtype))
    return BlockTerms(terms.X, W_new, H, terms.form, P, terms)


def column_grams(terms: BlockTerms) -> np.ndarray:
    """``WtMW_cols`` (n, r, r): W^T diag(m_j) W = WtW + WtMW_cols[j] for each column j (``frobenius_stats``'s WtW)."""
    W = np.ascontiguousarray(terms.W)
    return _column_grams(terms.P.indptr, terms.P.indices, terms.p, W, 1.0 if terms.observed else -1.0,
                         terms.P.shape[1])


def hals_h_update(H, WtX, WtW, WtMW_cols, n_rows: int):
    """Weighted HALS for H, one sweep per column, from the statistics summed over blocks (``n_rows``: X's, which
    bounds the round-off of WtW + WtMW_cols[j])."""
    Ht = np.array(H.T, order="C")
    _hals_columns(Ht, np.ascontiguousarray(WtX.T), np.ascontiguousarray(WtW), np.ascontiguousarray(WtMW_cols),
                  n_rows * floor_eps(H.dtype))
    return np.ascontiguousarray(Ht.T)


# --------------------------------------------------------- Kullback-Leibler
def kl_w_update(terms: BlockTerms):
    """Weighted KL MU: W <- W * ((M o X / WH) H^T) / (M H^T), ``terms`` at the current W."""
    W, H = terms.W, terms.H
    masked_num, masked_den = terms.times_ht(terms.ratio()), terms.times_ht(1.0)
    if terms.observed:
        num, den = masked_num, masked_den
    else:
        num = block_times_ht(kl_ratio(terms.X, W, H)[0], H) - masked_num
        den = H.sum(axis=1)[None, :] - masked_den
    return W * num / np.maximum(den, floor_eps(W.dtype))


def kl_local(terms: BlockTerms) -> BlockTerms:
    """Masked local step for the KL divergence over observed entries from the block's terms at W_b; returns the
    block's terms at the new W_b."""
    return BlockTerms(terms.X, kl_w_update(terms), terms.H, terms.form, terms.P, terms)


def kl_block_stats(terms: BlockTerms) -> dict:
    """The KL statistics at (W_b, H) over observed entries: ``WtR`` = W^T (M o X / WH), ``WtM`` = W^T M (r x n),
    ``xlogx`` = sum m x log(x / wh) over observed x > 0 and ``Mx`` = sum m x."""
    W = terms.W
    WtQ, WtP = terms.wt_times(terms.ratio()), terms.wt_times(1.0)
    xlogx, Mx = terms.weighted_xlogx(), np.float64(terms.observed_sums()[1])
    if terms.observed:
        return {"WtR": WtQ, "WtM": WtP, "xlogx": xlogx, "Mx": Mx}
    WtR, Wsum, full_xlogx = kl_stats(terms.X, W, terms.H)
    return {"WtR": WtR - WtQ, "WtM": Wsum[:, None] - WtP, "xlogx": np.float64(full_xlogx - xlogx), "Mx": Mx}


def kl_h_update(H, WtR, WtM):
    """Weighted KL MU for H: H <- H * (W^T (M o X / WH)) / (W^T M)."""
    return H * WtR / np.maximum(WtM, floor_eps(H.dtype))


def kl_objectives(G, stats) -> np.ndarray:
    """Generalised KL over each group's observed entries: sum m x log(x / wh) - sum m x + <W^T M, H>."""
    H = np.asarray(G["H"], dtype=np.float64)
    return np.array([float(s["xlogx"]) - float(s["Mx"]) + np.vdot(np.asarray(s["WtM"], dtype=np.float64), H)
                     for s in stats])


# --------------------------------------------------------------------- transform
def solve_w(X, W, H, form: str, P, kl: bool, n_iter: int, tol: float):
    """W_b for fixed H over the observed entries (masked transform), by weighted MU from W: X_b's values at
    P's entries are gathered once (and (M o X) H^T formed once for the Frobenius loss)."""
    HHt = H @ H.T
    terms = BlockTerms(X, W, H, form, P)
    num = None if kl else frobenius_numerator(terms)
    for _ in range(n_iter):
        previous = W
        W = kl_w_update(terms) if kl else frobenius_w_update(HHt, num, terms)
        if np.linalg.norm(W - previous) <= tol * max(np.linalg.norm(W), floor_eps(W.dtype)):
            break
        terms = BlockTerms(X, W, H, form, P, terms)
    return W
