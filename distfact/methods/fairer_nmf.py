"""Fairer-NMF: L. Kassab, E. George, D. Needell, H. Geng, N. Jafar Nia and A. Li, "Towards a Fairer Non-negative
Matrix Factorization", 2024 (arXiv:2411.09847).

Objective (eq. 5 / 7): minimise over W >= 0, H >= 0 the worst group's relative reconstruction loss

    max_l  (||X_l - W_l H||_F - E_l) / ||X_l||_F          (Definition 4.1)

where E_l is the error a rank-r NMF of group l alone attains (Remark 4.2).

E_l (Algorithm 1), :class:`GroupErrorEstimate`: T independent rank-r MU NMFs of every group, all L x T
factorisations advanced in the same passes over X (a block of group l carries the T local factors
of its rows); E_l = mean_t ||X_l - W_l^(t) H_l^(t)||_F. Each run stops on its own, as each call of the
reference code's NMF does: once its error e changes by less than ``tol`` relative to max(e, 0.01 ||X_l||)
it is frozen (neither its H nor its W moves again) while the others go on.

MU scheme (Algorithm 3), :class:`FairerMU`, from per-group statistics W_l^T X_l, W_l^T W_l:
    line 7   l* = argmax_l (||X_l - W_l H|| - E_l) / ||X_l||   (errors from the statistics)
    line 8   c <- c + e_l*   ('decaying'; 'largest': c <- e_l*; 'fixed': c <- (1 - a) c + a e_l*)
    line 9   X~, W~ scale group l by c_l / ||X_l||, so that
    line 10  H <- H * (sum_l w_l W_l^T X_l) / (sum_l w_l W_l^T W_l H),   w_l = (c_l / ||X_l||)^2
    line 11  W_l <- W_l * (X_l H^T) / (W_l H H^T)                        (local, per block)
AM scheme (Algorithm 2), :class:`FairerAM`:
    line 6   H = argmin_{H >= 0} max_l (||X_l - W_l H|| - E_l) / ||X_l||, the SOCP
                 min t  s.t.  ||X_l - W_l H||_F <= t ||X_l|| + E_l  for every l,
             written on statistics only (DESIGN §2): with W_l^T W_l = V diag(lam) V^T,
                 ||X_l - W_l H||^2 = ||A_l H - B_l||^2 + d_l^2,  A_l = diag(lam)^(1/2) V^T,
                 B_l = diag(lam)^(-1/2) V^T W_l^T X_l,  d_l^2 = ||X_l||^2 - ||B_l||^2 >= 0
             (eigenvalues 0 dropped), so it has r*n + 1 variables whatever the number of rows.
    line 7   W_l = argmin_{W >= 0} ||X_l - W H||: exact NNLS per row, local (``kernels/nnls.py``).
Stopping rule (eq. 10): max_l | e_l^(k) - e_l^(k-1) | / e_l^(k) < tol, e_l = ||X_l - W_l H||_F, with e_l^(k)
in the denominator floored at 1% of ||X_l|| (:func:`relative_change_below`).

With a mask (weights M >= 0 of X's shape, 0 = missing; ``fit(X, groups, mask=...)``), every error, norm and
update is over the observed entries: for a 0/1 mask e_l = ||M_l o (X_l - W_l H)||_F and ||X_l|| becomes
||M_l o X_l||_F (for weights, e_l^2 = sum m (x - wh)^2 and ||X_l||^2 = sum m x^2, as masked NMF's loss), so

    Definition 4.1   (||M_l o (X_l - W_l H)||_F - E_l) / ||M_l o X_l||_F,  relative errors e_l / ||M_l o X_l||
    Algorithm 1      E_l = mean_t ||M_l o (X_l - W_l^(t) H_l^(t))||_F, each run weighted MU (masked NMF's updates):
                     H <- H * (W^T (M o X)) / (W^T (M o W H)),  W <- W * ((M o X) H^T) / ((M o W H) H^T)
    Algorithm 3
      line 7   l* = argmax_l (||M_l o (X_l - W_l H)|| - E_l) / ||M_l o X_l||
      line 10  H <- H * (sum_l w_l W_l^T (M_l o X_l)) / (sum_l w_l W_l^T (M_l o W_l H)),  w_l = (c_l / ||M_l o X_l||)^2
      line 11  W_l <- W_l * ((M_l o X_l) H^T) / ((M_l o W_l H) H^T)                           (local, per block)

with W^T (M o W H) = (W^T W) H + WtMWH_adj and e_l^2 = sum m x^2 - 2 <W^T (M o X), H> + <W^T W, H H^T> +
<WtMWH_adj, H> from the pass's statistics (``kernels/masked.py``; denominators floored at machine epsilon as
unmasked). The constants sum m x^2 and sum of X over the observed entries (for the random starts' scales) come
from one read of X before the fit (``estimators/masks.py: observed_group_sums``). The AM scheme takes no mask: its
H step's SOCP is written on W_l^T W_l, and with a mask every column of H has its own Gram W_l^T diag(m_j) W_l
(n cones per group) and every row of W its own H diag(m_i) H^T.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass

import numpy as np

from ..kernels import masked as km
from ..kernels import nmf as k
from ..kernels.nnls import nnls_gram
from ..kernels.products import block_times_ht

C_UPDATES = ("decaying", "fixed", "largest")


def group_errors(sq_norms, WtX, WtW, H, HHt, WtMWH_adj=None) -> np.ndarray:
    """||X_l - W_l H||_F from statistics (clipped at 0 against round-off); with ``WtMWH_adj`` (a masked fit's),
    sqrt(sum m (x - wh)^2) over the observed entries."""
    # in Python floats: the same float64 operations as on numpy's scalars, with less dispatch (issue 19)
    sq = float(sq_norms) - 2.0 * float(np.vdot(WtX, H)) + float(np.vdot(WtW, HHt))
    if WtMWH_adj is not None:
        sq += float(np.vdot(WtMWH_adj, H))
    return math.sqrt(max(sq, 0.0))


def masked_mu_step(X_b, W, H, HHt, local: dict, update: bool, base=None):
    """The :class:`~distfact.kernels.masked.BlockTerms` of a masked block at W_b after one weighted MU step
    (``update``; else at W_b as it is), whose statistics ``masked_stats`` gives. ``local``: the block's local state
    (its mask, and the constants it keeps: ``kernels/masked.py: kept_constants``); ``base``: terms of the same
    block, whose X_b, values and sums are reused."""
    terms = km.BlockTerms(X_b, W, H, *km.mask_of(local), base=base, **km.kept_constants(local))
    return km.frobenius_local(terms, HHt) if update else terms


def masked_stats(terms) -> dict:
    """W^T (M o X), W^T W and WtMWH_adj of a masked block (``kernels/masked.py: frobenius_stats``; the groups'
    sum m x^2 are the fit's constants)."""
    stats = km.frobenius_stats(terms, False)
    del stats["Mxx"]
    return stats


class ObservedConstants:
    """What both of Fairer-NMF's phases take from X over its observed entries: ``group_totals`` (sum of X per
    group, for the random starts' scales) and ``group_sq_norms`` (||X_l||^2, sum m x^2 for a masked fit); None:
    the data's own (no mask). Fields of the methods, left out of their checkpoint configuration (the data
    fingerprint and the mask's digest identify them)."""

    #: the parts of a masked block's local state that are its inputs (its mask, X_b's sums and values at the mask's
    #: entries): the scheme's start keeps them from Algorithm 1's local state (``engine.driver.initialise_keeping``)
    inputs_kept = (*km.FORMS, "X_sums", *km.KEPT_VALUES)

    def totals(self, data) -> np.ndarray:
        return data.group_totals if self.group_totals is None else np.asarray(self.group_totals)

    def sq_norms(self, data) -> np.ndarray:
        return data.group_sq_norms if self.group_sq_norms is None else np.asarray(self.group_sq_norms)

    @staticmethod
    def local_state(W, inputs):
        """W, or with ``inputs`` (a masked fit: the block's mask) the local state {**inputs, "W": W}."""
        return W if inputs is None else {**inputs, "W": W}

    @staticmethod
    def kept(local: dict, W, terms) -> dict:
        """A masked block's new local state: W, and X_b's constants (its values at the mask's entries; its sums for
        the complement form), once computed (``BlockTerms.constants``)."""
        return {**local, "W": W, **terms.constants()}


class LastErrors:
    """The errors of the last (global state, statistics) pair a method computed them for: the driver asks the
    objective for them and then the next global step, from the same two objects, so that they are computed
    once per iteration (issue 19). Kept beside the methods, by method object (found by its ``id``, a weak reference
    saying it is the same object: hashing a frozen dataclass hashes its fields on every call), not in them: a
    method's ``__dict__`` is its parameters (a checkpoint's configuration, a saved model). An entry is only ever
    used for the very same objects; one tuple, replaced whole, so concurrent fits cannot mix their entries, and
    dropped with its method."""

    def __init__(self):
        self._entries: dict[int, tuple] = {}

    def get(self, method, G, stats, compute):
        """``compute()``, or what it gave last time for ``method`` and these very objects ``G`` and ``stats``."""
        key = id(method)
        entry = self._entries.get(key)
        if entry is not None and entry[0]() is method:
            if entry[1] is G and entry[2] is stats:
                return entry[3]
            ref = entry[0]
        else:
            ref = weakref.ref(method, self._dropper(key))
        errors = compute()
        self._entries[key] = (ref, G, stats, errors)
        return errors

    def _dropper(self, key: int):
        """What removes the entry of the method at ``key`` once it is gone (and not a later method's, made at the same
        address)."""
        def drop(ref):
            entry = self._entries.get(key)
            if entry is not None and entry[0] is ref:
                del self._entries[key]
        return drop


LAST_ERRORS = LastErrors()


# Errors below this share of ||X_l|| are measured against it by the stopping rules (``relative_change_below``).
ERROR_FLOOR = 0.01


def weighted_sum(weights, stats: list[dict], name: str):
    """``sum(w * s[name] for w, s in zip(weights, stats))``: the same operations (0 + the first group's term, then
    each next group's, in order), without a generator (issue 19)."""
    total = 0
    for w, s in zip(weights, stats):
        total = total + w * s[name]
    return total


def all_changes_below(previous, current, tol: float, floor: float = ERROR_FLOOR) -> bool:
    """``relative_change_below(previous, current, tol, floor).all()`` for vectors, entry by entry in Python floats:
    the same float64 operations (|c - p| < tol * max(c, floor), a NaN comparing False either way), without numpy's
    dispatch on arrays of a few entries (the schemes ask it every iteration, issue 19)."""
    previous, current = np.asarray(previous).tolist(), np.asarray(current).tolist()
    if tol <= 0:
        return not current  # no entry changed by less than tol: all of none
    for p, c in zip(previous, current):
        if not abs(c - p) < tol * (c if c > floor or c != c else floor):
            return False
    return True


def relative_change_below(previous, current, tol: float, floor: float = ERROR_FLOOR) -> np.ndarray:
    """Elementwise: the relative error e / ||X_l|| went from ``previous`` to ``current`` by less than
    ``tol`` * max(``current``, ``floor``); all False if ``tol <= 0`` (run to the iteration cap).

    Without the floor this is the relative change of eq. (10). The floor stops a run whose error tends to 0
    (a group that a rank-r NMF reconstructs exactly): MU gets there at a sublinear rate, so a relative
    change stays above 1e-4 for tens of thousands of iterations while the error, already under 1% of
    ||X_l||, moves by less than 1e-6 of ||X_l|| per iteration. Errors above the floor stop as eq. (10) says.
    """
    current = np.asarray(current)
    if tol <= 0:
        return np.zeros(current.shape, dtype=bool)
    return np.abs(current - np.asarray(previous)) < tol * np.maximum(current, floor)


@dataclass(frozen=True)
class GroupErrorEstimate(ObservedConstants):
    """Algorithm 1 for every group at once: local factor of a block = its T rows-by-r W's.

    Stopping, per run: the reference code's NMF stops a run when its error e changes in an iteration by less
    than ``tol`` relative to e, and so does each run here, with e floored at ``floor`` ||X_l||
    (:func:`relative_change_below`). On the paper's Table 1 data the groups of rank 3 have an exact rank-r
    NMF for r >= 3: their runs' errors tend to 0, and at ranks 4 and 6 to 10 some of the 15 runs still change
    by more than 1e-4 relative after 25,000 MU iterations (the reference code stops them at its cap of 10,000,
    unconverged); with the floor every run stops within about 3,200. Runs whose error stays above
    ``floor`` ||X_l|| (every run on Heart Disease) stop exactly as in the reference code.

    The global state carries, per (group, run), the relative error after the previous iteration (``r``) and
    whether the run has stopped (``done``); the per-group objective vector is the runs' relative errors
    e / ||X_l||, flattened group by group.
    """

    n_components: int
    n_estimates: int
    tol: float  # the estimator's estimate_tol: its default lives there only
    dtype: str = "float64"
    floor: float = ERROR_FLOOR
    group_totals: tuple | None = None
    group_sq_norms: tuple | None = None

    def initial_global(self, data, rng):
        L, T, r, n = data.n_groups, self.n_estimates, self.n_components, data.shape[1]
        scales = self.group_scales(data)
        H = np.abs(rng.standard_normal((L, T, r, n))) * scales[:, None, None, None]
        H = H.astype(self.dtype)
        # r = 0 before the first iteration: a run then stops only if its start is already within
        # tol * floor of X_l, which no further iteration could improve by more than that
        return {"H": H, "HHt": H @ np.swapaxes(H, -1, -2), "scale": scales, "r": np.zeros((L, T)),
                "done": np.zeros((L, T), dtype=bool)}

    def group_scales(self, data) -> np.ndarray:
        """sqrt(mean(X_l) / r) per group: scikit-learn's random-init scale, group by group."""
        return np.sqrt(self.totals(data) / (data.group_sizes * data.shape[1]) / self.n_components)

    def initial_local(self, block, G, rows, inputs=None):
        W = np.stack([np.abs(rows.standard_normal(self.n_components, stream=t)) for t in range(self.n_estimates)])
        return self.local_state((W * G["scale"][block.group]).astype(self.dtype), inputs)

    def block_stats(self, X_b, W_b, block, G):
        if isinstance(W_b, dict):
            return self._masked_runs(X_b, W_b, block, G, update=False)[1]
        pairs = [k.frobenius_stats(X_b, W) for W in W_b]
        return {"WtX": np.stack([p[0] for p in pairs]), "WtW": np.stack([p[1] for p in pairs])}

    def _masked_runs(self, X_b, local, block, G, update: bool):
        """Every run's weighted MU step over the block's observed entries (``update``; a stopped run, or pass 0,
        keeps its W) and the runs' statistics, stacked: (local state, statistics)."""
        g, base, steps = block.group, None, []
        for t in range(self.n_estimates):
            terms = masked_mu_step(X_b, local["W"][t], G["H"][g, t], G["HHt"][g, t], local,
                                   update and not G["done"][g, t], base)
            base = terms
            steps.append((terms.W, masked_stats(terms)))
        W_new = np.stack([W for W, _ in steps])
        return self.kept(local, W_new, base), {name: np.stack([s[name] for _, s in steps]) for name in steps[0][1]}

    def local_step(self, X_b, W_b, block, G):
        """One MU step of every run of the block's group that has not stopped; a stopped run keeps its W
        (its statistics are recomputed from it)."""
        if isinstance(W_b, dict):
            return self._masked_runs(X_b, W_b, block, G, update=True)
        g = block.group
        steps = [(W_b[t], *k.frobenius_stats(X_b, W_b[t])) if G["done"][g, t] else
                 k.frobenius_local(X_b, W_b[t], G["H"][g, t], G["HHt"][g, t], "mu") for t in range(self.n_estimates)]
        W_new, WtX, WtW = (np.stack(part) for part in zip(*steps))
        return W_new, {"WtX": WtX, "WtW": WtW}

    def global_step(self, G, stats, data):
        relative = self.relative_errors(G, stats, data)
        done = G["done"] | relative_change_below(G["r"], relative, self.tol, self.floor)
        H = np.stack([np.stack([G["H"][g, t] if done[g, t] else self._h_update(G["H"][g, t], s, t)
                                for t in range(self.n_estimates)]) for g, s in enumerate(stats)])
        return {"H": H, "HHt": H @ np.swapaxes(H, -1, -2), "scale": G["scale"], "r": relative, "done": done}

    @staticmethod
    def _h_update(H, s, t):
        """Run t's H step (weighted MU with a masked fit's statistics)."""
        if "WtMWH_adj" in s:
            return km.mu_h_update(H, s["WtX"][t], s["WtW"][t], s["WtMWH_adj"][t])
        return k.mu_h_update(H, s["WtX"][t], s["WtW"][t])

    def _measured(self, G, stats, data) -> tuple[np.ndarray, np.ndarray]:
        """(||X_l - W_l^(t) H_l^(t)||_F of shape (L, T), ||X_l|| of shape (L, 1)), computed once for the same ``G``
        and ``stats``; masked: over the observed entries."""
        def measure():
            sq_norms = self.sq_norms(data)
            errors = np.array([
                [group_errors(sq, s["WtX"][t], s["WtW"][t], G["H"][g, t], G["HHt"][g, t],
                              s["WtMWH_adj"][t] if "WtMWH_adj" in s else None) for t in range(self.n_estimates)]
                for g, (s, sq) in enumerate(zip(stats, sq_norms))])
            return errors, np.sqrt(sq_norms)[:, None]
        return LAST_ERRORS.get(self, G, stats, measure)

    def errors(self, G, stats, data) -> np.ndarray:
        """||X_l - W_l^(t) H_l^(t)||_F, shape (L, T) (the same array for the same ``G`` and ``stats``); masked:
        over the observed entries."""
        return self._measured(G, stats, data)[0]

    def relative_errors(self, G, stats, data) -> np.ndarray:
        errors, norms = self._measured(G, stats, data)
        return errors / norms

    def objective(self, G, stats, data):
        """Total: half the squared errors of every (group, run); per group: the runs' relative errors."""
        errors, norms = self._measured(G, stats, data)
        return float((0.5 * errors ** 2).sum()), (errors / norms).ravel()

    def runs_stopped(self, G, stats, data) -> np.ndarray:
        """Per (group, run), shape (L, T): whether the run has met its rule by the iteration of ``stats``."""
        return G["done"] | relative_change_below(G["r"], self.relative_errors(G, stats, data), self.tol, self.floor)

    def attained(self, G, stats, data) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Algorithm 1's result at the iteration of ``stats``: every run's error ||X_l - W_l^(t) H_l^(t)||_F
        (L, T), E_l = their mean over the runs (L,), and whether every run of group l met its rule (L,)."""
        runs = self.errors(G, stats, data)
        return runs, runs.mean(axis=1), self.runs_stopped(G, stats, data).all(axis=1)

    def converged(self, objectives, group_objectives):
        """Every run has stopped: a stopped run's error no longer moves, so it meets the rule at every
        later iteration, and the rule on the last two iterations says it for all runs."""
        return len(group_objectives) >= 2 and all_changes_below(group_objectives[-2], group_objectives[-1], self.tol,
                                                                self.floor)


@dataclass(frozen=True)
class _FairerScheme(ObservedConstants):
    """What both schemes share: statistics, errors, losses (Def. 4.1), objective (eq. 7), eq. (10)."""

    n_components: int
    E: tuple
    tol: float  # the estimator's: its default lives there only
    dtype: str = "float64"
    floor: float = ERROR_FLOOR
    group_totals: tuple | None = None
    group_sq_norms: tuple | None = None

    def initial_global(self, data, rng):
        scale = float(np.sqrt(self.totals(data).sum() / np.prod(data.shape) / self.n_components))
        H = (scale * np.abs(rng.standard_normal((self.n_components, data.shape[1])))).astype(self.dtype)
        return {"H": H, "HHt": H @ H.T, "scale": scale, "c": np.zeros(data.n_groups)}

    def initial_local(self, block, G, rows, inputs=None):
        return self.local_state((G["scale"] * np.abs(rows.standard_normal(self.n_components))).astype(self.dtype),
                                inputs)

    def block_stats(self, X_b, W_b, block, G):
        if isinstance(W_b, dict):
            return masked_stats(masked_mu_step(X_b, W_b["W"], G["H"], G["HHt"], W_b, False))
        WtX, WtW = k.frobenius_stats(X_b, W_b)
        return {"WtX": WtX, "WtW": WtW}

    def _measured(self, G, stats, data) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(||X_l - W_l H||_F, ||X_l||^2, ||X_l||, E_l, the relative losses (Definition 4.1)), per group, computed
        once for the same ``G`` and ``stats`` (the objective's, then the next global step's: small fits take them
        every iteration, issue 19); masked: over the observed entries."""
        def measure():
            sq_norms = self.sq_norms(data)
            errors = np.array([group_errors(sq, s["WtX"], s["WtW"], G["H"], G["HHt"], s.get("WtMWH_adj"))
                               for s, sq in zip(stats, sq_norms)])
            norms, E = np.sqrt(sq_norms), np.asarray(self.E)
            return errors, sq_norms, norms, E, (errors - E) / norms
        return LAST_ERRORS.get(self, G, stats, measure)

    def errors(self, G, stats, data) -> np.ndarray:
        """||X_l - W_l H||_F per group (the same array for the same ``G`` and ``stats``); masked: over the observed
        entries."""
        return self._measured(G, stats, data)[0]

    def losses(self, G, stats, data) -> np.ndarray:
        """Relative reconstruction loss per group (Definition 4.1; the same array for the same ``G`` and ``stats``)."""
        return self._measured(G, stats, data)[4]

    def relative_losses(self, relative_errors, data) -> np.ndarray:
        """Definition 4.1 from the relative errors e_l / ||X_l|| (the per-group objective vectors, groups on the
        last axis): (e_l - E_l) / ||X_l||."""
        return relative_errors - np.asarray(self.E) / np.sqrt(self.sq_norms(data))

    def objective(self, G, stats, data):
        """f = max_l relative loss (eq. 7); the per-group vector is the relative errors e_l / ||X_l|| (for eq. 10)."""
        errors, _, norms, _, losses = self._measured(G, stats, data)
        return float(losses.max()), errors / norms

    def converged(self, objectives, group_objectives):
        """Eq. (10): relative change of every group's error below tol (errors floored at ``floor`` ||X_l||)."""
        return len(group_objectives) >= 2 and all_changes_below(group_objectives[-2], group_objectives[-1], self.tol,
                                                                self.floor)


@dataclass(frozen=True)
class FairerMU(_FairerScheme):
    """Algorithm 3. Global state: H, H H^T, c; E_l and ||X_l|| are constants of the fit."""

    c_update: str = "decaying"
    c_step: float = 0.5

    def __post_init__(self):
        if self.c_update not in C_UPDATES:
            raise ValueError(f"c_update must be one of {C_UPDATES}, got {self.c_update!r}")
        if not 0 < self.c_step <= 1:
            raise ValueError(f"c_step must be in (0, 1], got {self.c_step!r}")

    def local_step(self, X_b, W_b, block, G):
        """Line 11: plain MU for W_l given H^(k) (masked: weighted MU over the block's observed entries);
        statistics of the new W_l."""
        if isinstance(W_b, dict):
            terms = masked_mu_step(X_b, W_b["W"], G["H"], G["HHt"], W_b, True)
            return self.kept(W_b, terms.W, terms), masked_stats(terms)
        W_new, WtX, WtW = k.frobenius_local(X_b, W_b, G["H"], G["HHt"], "mu")
        return W_new, {"WtX": WtX, "WtW": WtW}

    def next_c(self, c, worst: int) -> np.ndarray:
        """Line 8 and its variants."""
        if self.c_update == "decaying":  # c + e_l*: c's other entries plus 0, themselves (c >= 0, never -0.0)
            c = c.copy()
            c[worst] += 1.0
            return c
        e = np.zeros_like(c)
        e[worst] = 1.0
        if self.c_update == "largest":
            return e
        return (1.0 - self.c_step) * c + self.c_step * e

    def global_step(self, G, stats, data):
        """Lines 7-10 from the statistics of W^(k-1), H^(k-1)."""
        _, sq_norms, _, _, losses = self._measured(G, stats, data)
        c = self.next_c(G["c"], int(losses.argmax()))
        weights = (c ** 2 / sq_norms).astype(self.dtype, copy=False)
        WtX, WtW = weighted_sum(weights, stats, "WtX"), weighted_sum(weights, stats, "WtW")
        if "WtMWH_adj" in stats[0]:
            H = km.mu_h_update(G["H"], WtX, WtW, weighted_sum(weights, stats, "WtMWH_adj"))
        else:
            H = k.mu_h_update(G["H"], WtX, WtW)
        return {"H": H, "HHt": H @ H.T, "scale": G["scale"], "c": c}


CONIC_SOLVERS = ("CLARABEL", "ECOS", "SCS")


def socp_terms(WtX, WtW, sq_norm):
    """(A_l, B_l, d_l) with ||X_l - W_l H||_F^2 = ||A_l H - B_l||_F^2 + d_l^2, from statistics only."""
    WtX, WtW = np.asarray(WtX, dtype=np.float64), np.asarray(WtW, dtype=np.float64)
    lam, V = np.linalg.eigh(WtW)
    keep = lam > max(float(lam.max()), 0.0) * 1e-12
    root = np.sqrt(lam[keep])
    A = root[:, None] * V[:, keep].T
    B = (V[:, keep].T @ WtX) / root[:, None]
    return A, B, float(np.sqrt(max(sq_norm - float(np.vdot(B, B)), 0.0)))


def available_conic_solvers(preferred=CONIC_SOLVERS) -> list[str]:
    import cvxpy as cp

    installed = set(cp.installed_solvers())
    return [name for name in preferred if name in installed]


def fair_h_socp(stats, E, sq_norms, shape, solvers):
    """Line 6 of Algorithm 2 on statistics. Returns (H, t, name of the solver that solved it)."""
    import cvxpy as cp

    H = cp.Variable(shape, nonneg=True)
    t = cp.Variable()
    constraints = []
    for s, e, sq in zip(stats, E, sq_norms):
        A, B, d = socp_terms(s["WtX"], s["WtW"], sq)
        residual = cp.hstack([cp.vec(A @ H - B, order="F"), cp.Constant(np.array([d]))])
        constraints.append(cp.SOC(t * float(np.sqrt(sq)) + float(e), residual))
    problem = cp.Problem(cp.Minimize(t), constraints)
    failures = []
    for name in solvers:
        try:
            problem.solve(solver=name)
        except cp.error.SolverError as exc:
            failures.append(f"{name}: {exc}")
            continue
        if problem.status in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE) and H.value is not None:
            return np.maximum(H.value, 0.0), float(t.value), name
        failures.append(f"{name}: status {problem.status}")
    raise RuntimeError(f"the Fairer-NMF H problem (SOCP) was not solved: {'; '.join(failures)}")


@dataclass(frozen=True)
class FairerAM(_FairerScheme):
    """Algorithm 2: exact H step (SOCP on statistics, on the driver), exact W step (NNLS per row, local)."""

    solvers: tuple = CONIC_SOLVERS

    def global_step(self, G, stats, data):
        H, t, name = fair_h_socp(stats, self.E, data.group_sq_norms, G["H"].shape, self.solvers)
        H = H.astype(self.dtype)
        return {"H": H, "HHt": H @ H.T, "scale": G["scale"], "c": G["c"], "t": t, "solver": name}

    def local_step(self, X_b, W_b, block, G):
        """Line 7: W_b = argmin_{W >= 0} ||X_b - W H|| row by row, then its statistics."""
        W_new = nnls_gram(G["HHt"], block_times_ht(X_b, G["H"]))
        WtX, WtW = k.frobenius_stats(X_b, W_new)
        return W_new, {"WtX": WtX, "WtW": WtW}
