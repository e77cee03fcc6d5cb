"""Per-group metrics shared by the estimators: one name, one meaning and one unit each.

:data:`METRICS` is the glossary (``docs/metrics.md`` shows the same table; a test checks that they agree).
Every estimator's ``group_metrics_`` is a tidy table (:func:`group_metric_frame`) whose ``metric`` column
holds names from it. Norms are written ‖.‖ (‖.‖_F Frobenius, ‖.‖_1 the sum of absolute entries); X_l is
the rows of group l and X̂_l the method's reconstruction of them.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

#: metric name -> (definition, unit)
METRICS = {
    "relative_error": (
        "‖X_l - X̂_l‖_F / ‖X_l‖_F with the method's reconstruction X̂_l: W_l H (NMF, Fairer-NMF, weighted "
        "L1-NMF, SSNMF whatever its losses), W_l H + 1 v_l^T (Stratified-NMF), A_l V_k^T V_k at rank k "
        "(multigroup SVD, A_l = X_l centred and scaled as fitted); for a group of zeros, ‖X̂_l‖_F",
        "fraction"),
    "objective": (
        "group l's term of the objective the method minimises (its meaning per method: the table below)",
        "the objective's"),
    "relative_loss": (
        "(‖X_l - W_l H‖_F - E_l) / ‖X_l‖_F, E_l the error of a rank-r NMF of group l alone (Fairer-NMF, "
        "Definition 4.1); negative when the fit beats E_l",
        "fraction"),
    "relative_l1_error": (
        "‖X_l - W_l H‖_1 / ‖X_l‖_1 (weighted L1-NMF); for a group of zeros, ‖W_l H‖_1",
        "fraction"),
    "reconstruction_term": (
        "SSNMF's data term R on group l's rows: ‖M_l o (X_l - W_l H)‖_F^2 (R = F) or the I-divergence "
        "D(M_l o X_l ‖ M_l o W_l H) (R = D), M the data mask (all ones by default)",
        "X's units squared (F), X's units (D)"),
    "supervision_term": (
        "SSNMF's label term S on group l's rows, unweighted by lam: ‖L_l o (Y_l - W_l B)‖_F^2 (S = F) or "
        "D(L_l o Y_l ‖ L_l o W_l B) (S = D)",
        "Y's units squared (F), Y's units (D)"),
    "relative_i_divergence": (
        "reconstruction_term / sum(M_l o X_l) for SSNMF's I-divergence models (R = D), the sum over group l's "
        "observed entries (all of X_l without a mask); for a group of zeros, the term itself",
        "fraction"),
    "marginal_loss": (
        "multigroup SVD at rank k: sum_{i<=k} sigma_i^2(A_l) - ‖A_l V_k^T V_k‖_F^2 (Appendix A)",
        "A's units squared"),
    "incremental_loss": (
        "multigroup SVD at rank k: sum_{i<=k} [sigma_1^2(A_l,i) - ‖A_l v_i‖^2], A_l,i deflated by v_1..v_{i-1} "
        "(Section 4)",
        "A's units squared"),
    "reconstruction_loss": (
        "multigroup SVD at rank k: ‖A_l - A_l V_k^T V_k‖_F^2 (Section 8.1)",
        "A's units squared"),
}


def relative_to(values, scales) -> np.ndarray:
    """``values / scales`` group by group (a group's error relative to its data's norm or sum), where a group of
    zeros (scale 0) keeps its value as it is: 0 when it is reconstructed exactly, as after any iteration of the
    multiplicative or HALS updates, never an infinity or 0 / 0."""
    scales = np.asarray(scales, dtype=np.float64)
    return np.asarray(values, dtype=np.float64) / np.where(scales > 0, scales, 1.0)


def relative_error(sq_errors, sq_norms) -> np.ndarray:
    """``relative_error`` from squared errors ‖X_l - X̂_l‖_F^2 and squared norms ‖X_l‖_F^2 (negative squared
    errors, round-off of a difference, count as 0)."""
    return np.sqrt(relative_to(np.maximum(sq_errors, 0.0), sq_norms))


_FLOAT64 = np.dtype(np.float64)


def frobenius_sq_errors(sq_norms, grams, H, HHt=None) -> np.ndarray:
    """‖X_l - W_l H‖_F^2 per group, without reading X, from its statistics ``grams`` = [(W_l^T X_l, W_l^T W_l)]
    and ‖X_l‖_F^2: ‖X_l‖^2 - 2 <W_l^T X_l, H> + <W_l^T W_l, H H^T>, in float64, clipped at 0 against round-off.
    ``HHt``: H H^T when the caller has it."""
    if H.dtype is not _FLOAT64:  # float64 factors as they are (asked every iteration: no call for them, issue 19)
        H = np.asarray(H, dtype=np.float64)
    if HHt is None:
        HHt = H @ H.T
    elif HHt.dtype is not _FLOAT64:
        HHt = np.asarray(HHt, dtype=np.float64)
    # group by group in Python floats: the same float64 operations as on arrays of the groups, without the arrays
    # (small fits compute this every iteration, issue 19); max(nan, 0.0) is nan, as np.maximum's. The inner products
    # are BLAS's ddot on the flattened arrays, as np.vdot's, without its Python-level dispatch.
    HHt, H = HHt.ravel(), H.ravel()
    return np.array([max(float(WtW.ravel().dot(HHt) - 2.0 * WtX.ravel().dot(H)) + float(sq_norm), 0.0)
                     for (WtX, WtW), sq_norm in zip(grams, sq_norms)])


def group_metric_frame(group_names, metrics: dict, ranked: bool = False) -> pd.DataFrame:
    """The tidy table of ``group_metrics_``: columns group, [rank,] metric, value; one row per group (and rank)
    and metric, groups in ``group_names``' order. ``metrics``: name -> values per group, shape (n_groups,), or
    with ``ranked`` (n_groups, n_ranks) for ranks 1..n_ranks."""
    names = list(metrics)
    values = np.stack([np.asarray(metrics[name], dtype=np.float64) for name in names], axis=-1)
    frame = {"group": np.repeat(np.asarray(group_names, dtype=object), values[0].size)}
    if ranked:
        frame["rank"] = np.tile(np.repeat(np.arange(1, values.shape[1] + 1), len(names)), len(group_names))
    frame["metric"] = np.tile(np.asarray(names, dtype=object), values.size // len(names))
    frame["value"] = values.ravel()
    return pd.DataFrame(frame)
