"""``distfact.select_rank``: the rank chosen by masked cross-validation (issue 20).

Each fold holds out a random set of X's observed entries (a mask with 0 there), every (rank, fold) model is fitted
on the rest, all in one :func:`~distfact.estimators.sweep.fit_many` sweep (one read of X per iteration for the
whole sweep; once per fit for a store held in memory), and the held-out entries are scored per group.

Which entries are held out does not depend on how X is cut into blocks nor where blocks run: entry (i, j) of X
(i its row as X was given, j its column) draws u(i, j) in [0, 1) from a counter-based hash (splitmix64) of the
root seed, i and j, and fold f holds it out when ``f * holdout <= u(i, j) < (f + 1) * holdout``. So the folds
hold out disjoint sets of about ``holdout`` of the observed entries each, and any process can regenerate a block's
held-out entries from its rows' indices alone.
"""

from __future__ import annotations

import inspect
import numbers
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import scipy.sparse as sp

from ..kernels.products import weighted_sq_error_at
from ..metrics import relative_to
from ..store.masks import ComplementMask
from ..store.subset import GroupRows
from .masks import stored_mask_conflict, stored_weights
from .sweep import can_sweep, fit_many

RULES = ("min", "one_se", "worst_group")
#: what each (rank, fold) is fitted on: "joint", one model of all the rows; "per_group", one model per group
FITS = ("joint", "per_group")


def mix64(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 values (wrapping arithmetic): a bijection whose outputs look uniform."""
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def entry_draws(seed: int, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """u(i, j) in [0, 1) for the entries (rows[k], cols[k]) (rows: X's row numbers as X was given): the same
    numbers wherever and in whichever block they are drawn."""
    root = mix64(np.asarray([seed], dtype=np.uint64))
    with np.errstate(over="ignore"):
        per_row = mix64(root ^ (np.asarray(rows, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)))
        z = mix64(per_row ^ (np.asarray(cols, dtype=np.uint64) * np.uint64(0xD1B54A32D192ED03)))
    return (z >> np.uint64(11)).astype(np.float64) * 2.0 ** -53


@dataclass
class HeldOut:
    """A block's held-out entries: local rows ``i``, columns ``j``, their fold, X's values and the observed
    weights there."""

    i: np.ndarray
    j: np.ndarray
    fold: np.ndarray
    x: np.ndarray
    weight: np.ndarray


def held_out(X_b, rows: np.ndarray, base_b, seed: int, holdout: float, n_splits: int) -> HeldOut:
    """The held-out entries of one block (``rows``: its rows' numbers as X was given). Candidates: every entry
    of a dense X, the stored entries of a sparse X, in either case only where the observed weight (``base_b``,
    None: all 1) is positive."""
    if sp.issparse(X_b):
        X_b = sp.csr_matrix(X_b)
        i = np.repeat(np.arange(X_b.shape[0]), np.diff(X_b.indptr))
        j, x = X_b.indices, X_b.data
    elif sp.issparse(base_b):
        i, j = base_b.nonzero()
        x = X_b[i, j]
    else:
        i, j = np.divmod(np.arange(X_b.size), X_b.shape[1])
        x = X_b.ravel()
    weight = np.ones(len(i)) if base_b is None else np.asarray(base_b[i, j], dtype=np.float64).ravel()
    fold = np.floor(entry_draws(seed, rows[i], j) / holdout).astype(np.int64)
    keep = (fold < n_splits) & (weight > 0)
    return HeldOut(i[keep], j[keep], fold[keep], np.asarray(x[keep], dtype=np.float64), weight[keep])


def _values_at(X_b, i, j) -> np.ndarray:
    return np.asarray(X_b[i, j], dtype=np.float64).ravel()


class ObservedBlock:
    """A block's observed entries (weights ``base_b``; None: every entry, 1), with what does not depend on the
    model computed once for all the models scored on it: ``sq_norm`` = sum o x^2, and for a sparse ``base_b``
    its entries, weights and X's values there."""

    def __init__(self, X_b, base_b):
        if base_b is None and X_b.dtype != np.float64:  # the Gram form cancels: its terms in float64
            X_b = X_b.astype(np.float64)
        self.X_b, self.base_b = X_b, base_b
        if sp.issparse(base_b):
            self.i, self.j = base_b.nonzero()
            self.o = np.asarray(base_b[self.i, self.j], dtype=np.float64).ravel()
            self.x = _values_at(X_b, self.i, self.j)
            self.sq_norm = float(np.sum(self.o * self.x * self.x))
        elif sp.issparse(X_b):
            self.X_b = sp.csr_matrix(X_b)
            self.sq_norm = float(np.sum(self.X_b.data.astype(np.float64) ** 2)) if base_b is None else \
                float((self.X_b.multiply(self.X_b)).multiply(base_b).sum())
        else:
            self.sq_norm = float(np.sum((X_b * X_b) if base_b is None else base_b * X_b * X_b))

    def sq_errors(self, W_bs: list, Hs: list) -> list[float]:
        """sum o (x - wh)^2 over the block's observed entries for each model (its W_b, H; float64): at the
        stored weights of a sparse ``base_b`` (:func:`weighted_sq_error_at`); without weights by the Gram form
        ||X_b||^2 - 2 <X_b H^T, W_b> + <W_b H H^T, W_b>, X_b H^T of every model from one product with their H
        stacked (X_b read once for all of them, a sparse X never densified); else on the dense block (squared
        and weighted in place: the same values as ``o * residual ** 2``)."""
        if sp.issparse(self.base_b):
            return [weighted_sq_error_at(W_b, H, self.i, self.j, self.x, self.o) for W_b, H in zip(W_bs, Hs)]
        if self.base_b is None:
            W_bs, Hs = [W_b.astype(np.float64, copy=False) for W_b in W_bs], [H.astype(np.float64, copy=False) for H in Hs]
            XHt = np.asarray(self.X_b @ np.vstack(Hs).T)
            starts = np.cumsum([0] + [H.shape[0] for H in Hs])
            return [self.sq_norm - 2.0 * float(np.sum(XHt[:, start:start + H.shape[0]] * W_b))
                    + float(np.sum((W_b @ (H @ H.T)) * W_b)) for W_b, H, start in zip(W_bs, Hs, starts)]
        return [self._weighted_residual(W_b, H) for W_b, H in zip(W_bs, Hs)]

    def _weighted_residual(self, W_b, H) -> float:
        X_b = self.X_b
        residual = -(W_b @ H)
        if sp.issparse(X_b):  # canonical CSR: no duplicate entries, so the fancy += adds each value once
            residual[np.repeat(np.arange(X_b.shape[0]), np.diff(X_b.indptr)), X_b.indices] += X_b.data
        else:
            residual += X_b
        residual *= residual
        residual *= self.base_b
        return float(np.sum(residual))


@dataclass
class RankSelection:
    """What :func:`select_rank` found.

    Attributes
    ----------
    table : pandas.DataFrame
        One row per (rank, fold, group): ``train_error`` and ``heldout_error``, each
        sum o (x - xhat)^2 / sum o x^2 over the group's observed entries not held out, resp. held out in the
        fold (o: the observed weight, 1 without a mask; xhat: the model's reconstruction, W H, or
        W(i) H + 1 v(i)^T for Stratified-NMF: :func:`reconstruction`).
    summary : pandas.DataFrame
        Per rank: ``mean_heldout`` (the mean over folds of the mean over groups, every group weighing the same
        whatever its size), ``se_heldout`` (its standard error over folds), ``worst_group_heldout`` (the largest
        over groups of the group's mean over folds) and ``worst_group``.
    rank_ : int
        The rank chosen by ``rule``.
    rule : str
    fit : str
        "joint" or "per_group": what each (rank, fold) was fitted on (see :func:`select_rank`).
    choices : dict
        The rank each rule chooses.
    random_state_ : int
        The root seed of the held-out entries.
    """

    table: pd.DataFrame
    rule: str
    random_state_: int
    fit: str = "joint"
    summary: pd.DataFrame = field(init=False)
    choices: dict = field(init=False)
    rank_: int = field(init=False)

    def __post_init__(self):
        self.summary = rank_summary(self.table)
        self.choices = {rule: choose_rank(self.summary, rule) for rule in RULES}
        self.rank_ = self.choices[self.rule]


def rank_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per rank, the figures the rules compare (see :class:`RankSelection`)."""
    per_fold = table.groupby(["rank", "fold"])["heldout_error"].mean().unstack("fold")
    per_group = table.groupby(["rank", "group"], sort=False)["heldout_error"].mean().unstack("group")
    n_folds = per_fold.shape[1]
    return pd.DataFrame({"mean_heldout": per_fold.mean(axis=1),
                         "se_heldout": per_fold.std(axis=1, ddof=1) / np.sqrt(n_folds),
                         "worst_group_heldout": per_group.max(axis=1),
                         "worst_group": per_group.idxmax(axis=1)}).rename_axis("rank").reset_index()


def choose_rank(summary: pd.DataFrame, rule: str) -> int:
    """The rank ``rule`` chooses (ties: the smallest rank): "min", the lowest ``mean_heldout``; "one_se", the
    smallest rank whose ``mean_heldout`` is within one standard error (``se_heldout``, over folds) of the
    lowest; "worst_group", the lowest ``worst_group_heldout``."""
    by_rank = summary.sort_values("rank")
    ranks = by_rank["rank"].to_numpy()
    if rule == "worst_group":
        return int(ranks[np.argmin(by_rank["worst_group_heldout"].to_numpy())])
    means = by_rank["mean_heldout"].to_numpy()
    best = int(np.argmin(means))
    if rule == "min":
        return int(ranks[best])
    if rule == "one_se":
        return int(ranks[np.flatnonzero(means <= means[best] + by_rank["se_heldout"].to_numpy()[best])[0]])
    raise ValueError(f"rule must be one of {RULES}, got {rule!r}")


class SettingError(ValueError):
    """A setting of :func:`select_rank` it cannot take; ``key`` names it (a spec's error names its key)."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


def refusal(kind: type) -> str | None:
    """Why ``select_rank`` cannot select the rank of estimator class ``kind`` (None: it can): its ``fit`` must
    take a mask (the held-out entries) and its models must fit in shared passes (``fit_many``)."""
    reason = getattr(kind, "_select_rank_refusal", None)  # an estimator that says why it cannot be scored here
    if reason is not None:
        return f"select_rank cannot use {kind.__name__}: {reason}"
    if "mask" not in inspect.signature(kind.fit).parameters:
        return (f"{kind.__name__} takes no mask (its fit has no mask argument); select_rank holds entries out with "
                "a mask, so it needs an estimator whose fit takes one")
    if not can_sweep(kind):
        return f"{kind.__name__} cannot fit several models in shared passes (fit_many), which select_rank runs"
    return None


def check_settings(n_splits, holdout, rule, fit) -> None:
    """The settings that do not depend on the data; a :class:`SettingError` naming the one refused."""
    if rule not in RULES:
        raise SettingError("rule", f"rule must be one of {RULES}, got {rule!r}")
    if fit not in FITS:
        raise SettingError("fit", f"fit must be one of {FITS}, got {fit!r}")
    if not isinstance(n_splits, numbers.Integral) or isinstance(n_splits, bool) or n_splits < 2:
        raise SettingError("n_splits", "n_splits must be an integer >= 2 (the standard error is over folds), got "
                                       f"{n_splits!r}")
    if not isinstance(holdout, numbers.Real) or not 0 < holdout < 1:
        raise SettingError("holdout", f"holdout must be a fraction in (0, 1), got {holdout!r}")
    if n_splits * holdout > 1:
        raise SettingError("holdout", f"the folds hold out disjoint entries: n_splits * holdout must be <= 1, got "
                                      f"{n_splits} * {holdout}")


def rank_range(text: str) -> range:
    """``"FIRST:LAST"`` (inclusive, 1 <= FIRST <= LAST) as a range; ValueError saying what is expected."""
    try:
        first, last = (int(v) for v in text.split(":"))
    except ValueError:
        raise ValueError(f"must be FIRST:LAST, got {text!r}") from None
    if not 1 <= first <= last:
        raise ValueError(f"must satisfy 1 <= FIRST <= LAST, got {text!r}")
    return range(first, last + 1)


def _check(estimator, data, ranks, n_splits, holdout, rule, fit, fit_inputs) -> list[int]:
    reason = refusal(type(estimator))
    if reason is not None:
        raise ValueError(reason)
    check_settings(n_splits, holdout, rule, fit)
    if fit == "per_group" and any(value is not None for value in fit_inputs.values()):
        raise ValueError(f"fit='per_group' takes no other fit arguments (got {sorted(fit_inputs)}): they are given "
                         "for all of X's rows and the group's models see only theirs")
    ranks = list(ranks)
    largest, bound = (min(data.shape), "min(n_samples, n_features)") if fit == "joint" else \
        (min(int(data.group_sizes.min()), data.shape[1]), "min(smallest group's rows, n_features)")
    bad = [r for r in ranks if not isinstance(r, numbers.Integral) or isinstance(r, bool) or not 1 <= r <= largest]
    if not ranks or bad:
        raise ValueError(f"ranks must be integers in [1, {bound}] = [1, {largest}], got "
                         f"{bad[0] if bad else 'none'!r}")
    return sorted({int(r) for r in ranks})


def _without_nan(X):
    """mask="nan": X with its NaN entries as 0, and the observed weights (0 at the NaN entries)."""
    if not isinstance(X, np.ndarray):
        raise ValueError("mask='nan' in select_rank needs X as a numpy array")
    missing = np.isnan(X)
    return np.where(missing, 0.0, X), (~missing).astype(np.float64)


def _base_mask(mask, data):
    """The observed weights in X's row order: None (all observed), a dense array, or CSR ("nonzero": the
    stored entries of a sparse X, read block by block)."""
    if isinstance(mask, str):
        if mask != "nonzero":
            raise ValueError(f"mask must be an array, a sparse matrix, 'nonzero' or 'nan', got {mask!r}")
        if not data.is_sparse:
            raise ValueError("mask='nonzero' needs a sparse X (its stored entries are the observed ones)")
        order = np.argsort(data.row_index())
        pattern = sp.vstack([sp.csr_matrix(data.load_block(b.index)) for b in data.blocks], format="csr")[order]
        pattern.data = np.ones_like(pattern.data, dtype=np.float64)
        return pattern
    if mask is None:
        return None
    if sp.issparse(mask):
        mask = sp.csr_matrix(mask, dtype=np.float64)
        mask.eliminate_zeros()
    else:
        mask = np.asarray(mask, dtype=np.float64)
    if mask.shape != data.shape:
        raise ValueError(f"mask has shape {mask.shape}, expected X's {data.shape}")
    return mask


def _rows_of(base, rows):
    if isinstance(base, ComplementMask):
        return ComplementMask(base.matrix[rows])
    return None if base is None else base[rows]


def fold_masks(data, base, seed: int, holdout: float, n_splits: int) -> list:
    """Each fold's mask, in X's row order: the observed weights (``base``) with 0 at the fold's held-out
    entries. CSR when ``base`` is; without ``base`` (every entry observed), the :class:`ComplementMask` of the
    held-out entries (O(held-out entries), not an array of X's shape: X may be a store larger than memory); else
    dense (a copy of ``base``)."""
    row_index = data.row_index()
    found = [[] for _ in range(n_splits)]
    for block in data.blocks:
        rows = row_index[block.row_start:block.row_stop]
        held = held_out(data.load_block(block.index), rows, _rows_of(base, rows), seed, holdout, n_splits)
        for f in range(n_splits):
            chosen = held.fold == f
            found[f].append((rows[held.i[chosen]], held.j[chosen]))
    masks = []
    for f in range(n_splits):
        i, j = (np.concatenate(parts) for parts in zip(*found[f]))
        if sp.issparse(base):
            held = sp.csr_matrix((np.ones(len(i)), (i, j)), shape=data.shape)
            mask = (base - base.multiply(held)).tocsr()
            mask.eliminate_zeros()
        elif base is None:
            mask = ComplementMask(sp.csr_matrix((np.ones(len(i)), (i, j)), shape=data.shape))
        else:
            mask = base.copy()
            mask[i, j] = 0.0
        masks.append(mask)
    return masks


def score(data, Ws: list, Hs: list, base, seed: int, holdout: float, n_splits: int, folds: list[int]):
    """Per model and group: (held-out squared error, held-out squared norm, observed squared error, observed
    squared norm), from each model's W (X's row order) and its H for each group (``Hs[k][l]``: model k's H on
    group l's rows, W Hs[k][l] its reconstruction there: :func:`reconstruction`), reading X block by block."""
    sums = np.zeros((len(Ws), data.n_groups, 4))
    row_index = data.row_index()
    for block in data.blocks:
        rows = row_index[block.row_start:block.row_stop]
        X_b, base_b = data.load_block(block.index), _rows_of(base, rows)
        held = held_out(X_b, rows, base_b, seed, holdout, n_splits)
        observed = ObservedBlock(X_b, base_b)
        by_fold = {}  # the fold's held-out entries, shared by its models
        for f in set(folds):
            chosen = held.fold == f
            by_fold[f] = (held.i[chosen], held.j[chosen], held.x[chosen], held.weight[chosen])
        held_norms = {f: np.sum(o * x * x) for f, (_, _, x, o) in by_fold.items()}
        W_bs = [np.asarray(W[rows], dtype=np.float64) for W in Ws]
        H_bs = [np.asarray(H[block.group], dtype=np.float64) for H in Hs]
        for k, (W_b, H, f, observed_sq) in enumerate(zip(W_bs, H_bs, folds, observed.sq_errors(W_bs, H_bs))):
            sums[k, block.group] += (weighted_sq_error_at(W_b, H, *by_fold[f]), held_norms[f], observed_sq,
                                     observed.sq_norm)
    return sums


def reconstruction(model, W, group_names: list) -> tuple[np.ndarray, list]:
    """A fitted model's reconstruction of its rows (W: X's row order; ``group_names``: the groups it fitted) as
    (W', [H'_l per group]) with W' H'_l the reconstruction of group l's rows: (W, H) for a model that
    reconstructs W H; ([W 1], [H; o_l]) for one whose reconstruction adds a row o_l per group (the estimator's
    ``_reconstruction_offsets``: Stratified-NMF's W(i) H + 1 v(i)^T), so that one product scores both."""
    offsets = model._reconstruction_offsets(group_names)
    H = np.asarray(model.components_, dtype=np.float64)
    if offsets is None:
        return W, [H] * len(group_names)
    return np.column_stack([W, np.ones(W.shape[0])]), [np.vstack([H, offset]) for offset in offsets]


def per_group_fits(estimator, data, ranks: list[int], masks: list, client) -> tuple[list, list]:
    """Every (fold, rank) model of every group fitted on that group's rows alone (:class:`GroupRows`), one
    :func:`fit_many` sweep per group (each reading only its group's blocks). Returns per model (folds
    outermost, as ``fit_many`` orders them) its W in X's row order, each group's rows from that group's model,
    and its H per group (as :func:`reconstruction` gives them)."""
    Ws, Hs = [None] * (len(masks) * len(ranks)), [[None] * data.n_groups for _ in range(len(masks) * len(ranks))]
    for group in range(data.n_groups):
        rows = GroupRows(data, group)
        models, group_Ws = fit_many(estimator, rows, ranks=ranks, masks=[_rows_of(mask, rows.source_rows)
                                                                          for mask in masks],
                                    client=client, return_W=True)
        for k, (model, W) in enumerate(zip(models, group_Ws)):
            W, (Hs[k][group],) = reconstruction(model, W, rows.group_names)
            if Ws[k] is None:
                Ws[k] = np.zeros((data.shape[0], W.shape[1]))
            Ws[k][rows.source_rows] = W
    return Ws, Hs


def select_rank(estimator, X, *, groups=None, ranks, n_splits=5, holdout=0.1, random_state=None, rule="min",
                fit="joint", client=None, mask=None, **fit_inputs) -> RankSelection:
    """Choose the rank by masked cross-validation: hold out random observed entries, fit every rank on the rest,
    score the held-out entries per group.

    ``fit="joint"`` (the default) fits one model of all the rows per (rank, fold), the model the estimator fits
    on X: the rank chosen is the rank of that model, and group l's curve is how well that joint model, at each
    rank, predicts group l's held-out entries. ``fit="per_group"`` fits one model per (group, rank, fold) on
    that group's rows alone (as Fairer-NMF's E_l runs fit each group alone), and scores each group's held-out
    entries by its own group's model: group l's curve then bottoms near group l's own rank, and "worst_group"
    chooses the rank that the groups' separate factorisations need (on the Fairer-NMF paper's Table 1 data,
    groups of ranks 3, 3 and 6: their curves bottom at 3, 3 and 6 and "worst_group" chooses 6; the joint curves
    keep falling to about rank 8-12, as the groups' column spaces differ). The same entries are held out in
    both modes.

    Fold f holds out about ``holdout`` of X's observed entries (disjoint from the other folds' entries; see the
    module docstring for how they are drawn, independently of X's blocks): any entry of a dense X, only the
    stored entries of a sparse X (its zeros are never held out, so the held-out error of a sparse X measures
    its non-zero entries). Fold f's mask is the observed weights (``mask``, or all ones) with 0 at its held-out
    entries; every (rank, fold) is fitted in one :func:`~distfact.fit_many` sweep (X read at most once per
    iteration for all of them), each model exactly its estimator's ``fit`` with that mask. The errors are then computed
    from each model's reconstruction (W H, or the one its estimator declares: W(i) H + 1 v(i)^T for
    Stratified-NMF, :func:`reconstruction`), reading X block by block.

    Parameters
    ----------
    estimator : FactorEstimator
        The template (its ``n_components`` is ignored); its ``fit`` must take ``mask``.
    X, groups, client
        As the estimator's ``fit`` takes them.
    ranks : iterable of int
        The ranks compared, each in [1, min(n_samples, n_features)].
    n_splits : int >= 2
        The folds.
    holdout : float in (0, 1)
        The share of the observed entries each fold holds out (``n_splits * holdout <= 1``).
    random_state : int or None
        The root seed of the held-out entries (None: a fresh one, in ``random_state_``). The models' own seed is
        the estimator's ``random_state``.
    rule : {"min", "one_se", "worst_group"}
        How the rank is chosen (:func:`choose_rank`): "min", the lowest mean held-out error (the mean over folds
        of the mean over groups: every group weighs the same); "one_se", the smallest rank within one standard
        error (over folds) of that minimum; "worst_group", the lowest mean-over-folds held-out error of the worst
        group (the fairness-aware choice). Every rule's choice is in ``choices``.
    fit : {"joint", "per_group"}
        One model of all the rows per (rank, fold), or one per (group, rank, fold) on that group's rows alone
        (one :func:`~distfact.fit_many` sweep per group, each reading only its group's blocks: every block of X
        is still read at most once per iteration, in one pass per group; ranks then go up to the smallest group's rows).
    mask : array, sparse matrix, "nonzero" or "nan", optional
        X's observed entries and their weights (0: missing), as the estimator's ``fit`` takes them; held-out
        entries are drawn among those of positive weight, and errors are weighted by them.
    **fit_inputs
        Other arguments of the estimator's ``fit``, the same for every model (joint fits only).

    Returns
    -------
    RankSelection
        ``table`` (rank, fold, group, train_error, heldout_error), ``summary``, ``rank_``, ``rule``,
        ``choices``, ``random_state_``, ``fit``.
    """
    if isinstance(mask, str) and mask == "nan":
        X, mask = _without_nan(X)
    data = estimator._grouped(X, groups)
    if data.mask_kind is not None:  # a store's own mask: the observed weights, which each fold's mask starts from
        if mask is not None:
            raise ValueError(stored_mask_conflict(data))
        data, mask = data.without_mask(), stored_weights(data)
    ranks = _check(estimator, data, ranks, n_splits, holdout, rule, fit, fit_inputs)
    if random_state is None:
        random_state = int(np.random.SeedSequence().entropy % 2 ** 63)
    base = _base_mask(mask, data)
    masks = fold_masks(data, base, random_state, holdout, n_splits)
    if fit == "joint":
        models, Ws = fit_many(estimator, data, ranks=ranks, masks=masks, client=client, return_W=True,
                              **fit_inputs)
        Ws, Hs = zip(*(reconstruction(model, W, data.group_names) for model, W in zip(models, Ws)))
    else:
        Ws, Hs = per_group_fits(estimator, data, ranks, masks, client)
    folds = [f for f in range(n_splits) for _ in ranks]
    sums = score(data, Ws, Hs, base, random_state, holdout, n_splits, folds)
    held_sq, held_norm, all_sq, all_norm = np.moveaxis(sums, -1, 0)
    table = pd.DataFrame({
        "rank": np.repeat(ranks * n_splits, data.n_groups),
        "fold": np.repeat(folds, data.n_groups),
        "group": np.tile(np.asarray(data.group_names, dtype=object), len(Ws)),
        "train_error": relative_to(np.maximum(all_sq - held_sq, 0.0), all_norm - held_norm).ravel(),
        "heldout_error": relative_to(held_sq, held_norm).ravel()})
    return RankSelection(table, rule, random_state, fit)


#: select_rank's defaults of the settings the surfaces offer (``distfact select-rank``'s options, a spec's
#: [select] keys): read from its signature, the one place they are set
DEFAULTS = {name: inspect.signature(select_rank).parameters[name].default
            for name in ("n_splits", "holdout", "rule", "fit", "random_state")}
