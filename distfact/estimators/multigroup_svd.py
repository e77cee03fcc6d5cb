"""``distfact.MultigroupSVD``: consistent multigroup low-rank approximation (multigroup singular vectors).

Paper: A. Matakos, M. Ciaperoni and H. Mannila, "Consistent Multigroup Low-Rank Approximation", 2025 (arXiv:2503.21563).
"""

from __future__ import annotations

import functools
import numbers

import numpy as np
import pandas as pd
import threadpoolctl
from sklearn.utils._param_validation import StrOptions
from sklearn.utils.validation import check_array

from ..methods.multigroup_svd import passes, solvers
from ..metrics import group_metric_frame, relative_error
from ..store.coerce import as_grouped
from ..store.grouped import GroupedMatrix
from .base import FactorEstimator, check_iteration_params, survives_worker_loss
from .contract import COUNT, POSITIVE_INT, SURFACE_CONSTRAINTS, MethodDeclaration, PaperReport
from .tables import FittedTable


#: why the multigroup SVD takes no mask (fit's, select_rank's)
MASK_REFUSAL = ("the multigroup SVD takes no mask: it is computed from each group's Gram matrix X_l^T X_l (one "
                "pass, then eigenproblems), and an SVD with missing entries has no such closed form (it becomes an "
                "iterative weighted low-rank problem); fit NMF, FairerNMF or StratifiedNMF with mask=..., or fill "
                "the missing entries first (NMF(...).fit(X, mask=...).impute(X))")


def loss_frame(group_names, losses: dict) -> pd.DataFrame:
    """``group_losses_``: per group and rank, the marginal, incremental and reconstruction losses of ``losses``
    (``solvers.group_losses``)."""
    d = losses["marginal"].shape[1]
    return pd.DataFrame({"group": np.repeat(group_names, d), "rank": np.tile(np.arange(1, d + 1), len(group_names)),
                         **{kind: losses[kind].ravel() for kind in ("marginal", "incremental", "reconstruction")}})


class MultigroupSVD(FactorEstimator):
    """Multigroup singular vectors (Matakos, Ciaperoni and Mannila, 2025): an orthonormal sequence v_1..v_d
    where v_r minimises the worst group's rank-1 loss max_l sigma_1^2(A^l) - ||A^l v v^T||_F^2 on the data
    deflated by v_1..v_{r-1} (Algorithm 1). Any prefix v_1..v_r is the answer for rank r (consistency);
    with one group it is the SVD's right singular vectors. Unlike the NMF methods, X may be signed.

    One pass over X accumulates every group's Gram matrix A_l^T A_l (n x n; dense or sparse X, about the
    column means from the store's metadata when ``center``); everything else runs on those matrices in
    this process. For wide data (n > ``max_gram_features``) a randomized sketch replaces them: see
    ``max_gram_features``. See ``distfact.methods.multigroup_svd`` for the steps and equation numbers.

    Parameters
    ----------
    n_components : int
        d, at most n_features.
    solver : {'auto', 'fw', 'brent', 'sdp'}
        The rank-1 solver. 'brent': two groups only, exact (Section 7, Lemma E.1: the root of
        q(mu) = h_1(v(mu)) - h_2(v(mu)) over [0, 1], by Halley's method on q's exact derivatives kept
        inside Brent's bracket; the duality gap is zero). 'fw': Frank-Wolfe on the dual (Algorithm 2), any
        number of groups, with Algorithm 3 on growing subspaces of the top eigenvectors of A(mu) to close
        the gap. 'sdp': the SDP relaxation (Algorithm 3) on the full problem, by Clarabel; an n x n
        semidefinite variable, so for n up to a few hundred. 'auto': 'brent' for two groups, 'fw' otherwise.
    tol : float
        'fw': stop when ||mu^(t+1) - mu^(t)|| < tol (Algorithm 2, line 11) or the duality gap is below
        tol * max_l sigma_1^2(A^l); 'sdp': the solver's gap and feasibility tolerances. 'brent' does not
        use it: it is exact to rounding.
    max_iter : int
        Frank-Wolfe iterations (or root-finding iterations) per component. Frank-Wolfe converges slowly where
        lambda_max(A(mu)) is repeated (g is not smooth there); the subspace refinement (see
        ``distfact.methods.multigroup_svd``) closes the gap where the relaxation is tight, and any
        remaining gap is reported in ``duality_gap_``. For a certificate, 'sdp'.
    center : bool, default True
        Subtract the column means (over all rows) first. The default, with ``scale``, is the paper's
        standardisation (Section 8.1); ``center=False, scale=False`` factorises X as given.
    scale : bool, default True
        Divide every column by its standard deviation over all rows (after centring if ``center``);
        Section 8.1 standardises (``center=True, scale=True``). Constant columns are refused.
    fw_step : {'line-search', '2/(t+2)'}
        Frank-Wolfe's step: the exact line search (default), or the paper's gamma_t = 2 / (t + 2),
        which needs about 3 / tol iterations to meet the stopping rule.
    max_gram_features : int
        Above this many features the n x n Gram matrices (8 n^2 bytes per group) are not formed.
        Instead a randomized range finder (Halko, Martinsson and Tropp, 2011) computes, per group, an
        orthonormal basis of A_l^T A_l Omega (``sketch_size`` columns, ``power_iterations`` subspace
        iterations, one pass over X each), the union Q of the groups' bases (n x k*sketch_size) is formed
        on this process, and the Grams restricted to it, Q^T A_l^T A_l Q, come from one more pass; the
        method then runs on those. Cost: 3 + ``power_iterations`` passes over X and O(n k sketch_size)
        memory here. Exact when each group's data lie in a subspace of dimension <= ``sketch_size``;
        otherwise sigma_1^2 and the vectors are those of the top singular subspaces captured (the
        reconstruction loss uses the exact ||A_l||_F^2).
    sketch_size : int or None
        Columns of the range finder per group (default: n_components + 20).
    power_iterations : int
    random_state : int or None
        The sketch's random matrix.
    block_rows, n_threads :
        As in :class:`distfact.NMF`.

    Attributes
    ----------
    components_ : ndarray (d, n_features)
        v_1..v_d, orthonormal rows.
    mu_ : ndarray (d, n_groups)
        The dual weights of each component's rank-1 problem.
    duality_gap_ : ndarray (d,)
        Empirical duality gap f - g of each component (Section 8.3); f is ``primal_objective_``
        (max_l h_l(v_r)) and g is ``dual_objective_`` (g(mu_r)).
    objective_history_ : ndarray (d,)
        Not a history over iterations (the fit is one pass, then a rank-1 problem per component): the
        min-max objective of each component's problem, f_r = max_l h_l(v_r), h_l(v_r) = sigma_1^2(A^l_r) -
        ||A^l_r v_r||^2 on the data deflated by v_1..v_{r-1} (eq. 1), r = 1..d; the same values as
        ``primal_objective_``.
    group_metrics_ : pandas.DataFrame
        Columns group, rank, metric, value, one row per group, rank r = 1..d and metric
        (``distfact.metrics.METRICS``, docs/metrics.md), all of the centred/scaled data A_l:
        ``relative_error`` ||A_l - A_l V_r^T V_r||_F / ||A_l||_F (V_r: the first r rows of ``components_``),
        ``objective`` h_l(v_r) (the group's term of rank r's min-max problem, whose maximum over groups is
        ``objective_history_[r - 1]``), ``marginal_loss``, ``incremental_loss`` and ``reconstruction_loss``
        (the columns of ``group_losses_``).
    group_losses_ : pandas.DataFrame
        One row per group and rank r = 1..d: the marginal loss (Appendix A), the incremental loss
        (Section 4) and the reconstruction loss ||A_l - A_l V_r^T V_r||_F^2, of the centred/scaled data (the
        ``marginal_loss``, ``incremental_loss`` and ``reconstruction_loss`` metrics, squared, not relative).
    explained_variance_ : ndarray (n_groups, d)
        ||A_l v_r||^2 / n_l: the mean square of group l's projections on v_r.
    singular_values_ : ndarray (n_groups, d)
        ||A_l v_r||; with one group, the singular values.
    mean_, scale_ : ndarray (n_features,)
        What ``transform`` subtracts and divides by (zeros and ones when not asked for).
    group_names_, group_sizes_
    solver_ : str
        The solver used ('auto' resolved).
    n_iter_ : ndarray (d,)
        Solver iterations per component.
    converged_ : bool
        Every component's duality gap f - g is at most ``tol`` * max_l sigma_1^2(A^l_r): each rank-1 problem
        is solved to within ``tol`` (relative), as certified by its dual. False says that some component's
        optimality is not certified (see ``duality_gap_``), not that the components are wrong.
    n_passes_ : int
        Passes over X: 1 on the Gram path.
    sketched_ : bool
        Whether the wide-data sketch was used.
    scheduler_ : dict
    """

    _fitted_private = ("_grams", "_basis", "_traces")  # what losses_of and svd_components use
    group_losses_ = FittedTable()
    _signed_input = True

    _parameter_constraints: dict = {**SURFACE_CONSTRAINTS, "solver": [StrOptions({"auto", "fw", "brent", "sdp"})],
                                    "center": ["boolean"], "scale": ["boolean"],
                                    "fw_step": [StrOptions(set(solvers.FW_STEPS))], "max_gram_features": [POSITIVE_INT],
                                    "sketch_size": [POSITIVE_INT, None], "power_iterations": [COUNT]}

    def __init__(self, n_components, *, solver="auto", tol=1e-6, max_iter=100, center=True, scale=True,
                 fw_step="line-search", max_gram_features=4096, sketch_size=None, power_iterations=2,
                 random_state=None, block_rows=None, n_threads=None):
        self.n_components = n_components
        self.solver = solver
        self.tol = tol
        self.max_iter = max_iter
        self.center = center
        self.scale = scale
        self.fw_step = fw_step
        self.max_gram_features = max_gram_features
        self.sketch_size = sketch_size
        self.power_iterations = power_iterations
        self.random_state = random_state
        self.block_rows = block_rows
        self.n_threads = n_threads

    # -- fitting ---------------------------------------------------------------------------------------
    #: why ``distfact.select_rank`` refuses this estimator
    _select_rank_refusal = MASK_REFUSAL
    _stored_mask_refusal = MASK_REFUSAL  # fit and transform refuse a store holding a mask

    def fit(self, X, y=None, *, groups=None, mask=None, client=None):
        """Fit on X (array, sparse matrix, DataFrame, GroupedMatrix or store path) with row ``groups``
        (None for a GroupedMatrix or store; for an array, None means a single group: the SVD). ``y`` is
        ignored (scikit-learn's place for targets). ``mask`` must be None: a ValueError says why
        (:data:`MASK_REFUSAL`), rather than a mask being dropped."""
        if mask is not None:
            raise ValueError(MASK_REFUSAL)
        self._ignore_y(y, groups)
        check_iteration_params(self.max_iter, self.tol, self.random_state)
        if self.max_iter < 1 or self.tol <= 0:
            raise ValueError(f"max_iter must be at least 1 and tol positive, got max_iter={self.max_iter!r}, "
                             f"tol={self.tol!r}")
        if self.fw_step not in solvers.FW_STEPS:
            raise ValueError(f"fw_step must be one of {solvers.FW_STEPS}, got {self.fw_step!r}")
        data = as_grouped(X, groups, block_rows=self.block_rows, n_threads=self.n_threads, signed=True)
        self._refuse_stored_mask(data)
        m, n = data.shape
        d = self._check_n_components(n)
        sizes = data.group_sizes
        if (sizes < 2).any():
            name = data.group_names[int(np.flatnonzero(sizes < 2)[0])]
            raise ValueError(f"group {name!r} has {int(sizes.min())} row; the multigroup SVD needs at least 2 rows "
                             "per group (merge or drop it)")
        solver = self._resolved_solver(data.n_groups)
        mean = data.column_sums / m
        centre = mean if self.center else np.zeros(n)
        grams, col_scale, basis, traces, executor = self._statistics(data, client, mean, centre, d)
        # The driver's eigenproblems are small: below ~1000 features one BLAS thread is faster (two
        # threads' synchronisation costs more than they share: 0.9 vs 2.6 ms for n = 200 on 2 cores).
        with _blas_controller().limit(limits=1 if grams.shape[1] <= 1000 else None, user_api="blas"):
            result = solvers.multigroup_vectors(grams, d, solver, self.tol, self.max_iter, self.fw_step)
            self._set_results(data, executor, result, grams, basis, traces, mean if self.center else np.zeros(n),
                              col_scale, solver)
        return self

    @survives_worker_loss
    def _statistics(self, data, client, mean, centre, d):
        """The passes over X: (Grams, column scale, basis, traces, executor); basis and traces are None on
        the Gram path (n <= max_gram_features), set on the sketch path."""
        executor = self._executor(data, client)
        try:
            if data.shape[1] <= self.max_gram_features:
                return *self._gram_path(data, executor, mean, centre), None, None, executor
            return *self._sketch_path(data, executor, mean, centre, d), executor
        finally:
            executor.close()

    def _check_n_components(self, n) -> int:
        d = self.n_components
        if not isinstance(d, numbers.Integral) or d < 1:
            raise ValueError(f"n_components must be a positive integer, got {d!r}")
        if d > n:
            raise ValueError(f"n_components={d} is larger than the number of features n={n}: the components "
                             "are orthonormal vectors in R^n")
        return int(d)

    def _resolved_solver(self, n_groups: int) -> str:
        if self.solver not in solvers.SOLVERS:
            raise ValueError(f"solver must be one of {solvers.SOLVERS}, got {self.solver!r}")
        if self.solver == "brent" and n_groups != 2:
            raise ValueError(f"solver='brent' is for exactly two groups; the data have {n_groups} "
                             "(use 'fw' or 'sdp')")
        if self.solver == "auto":
            return "brent" if n_groups == 2 else "fw"
        return self.solver

    def _gram_path(self, data, executor, mean, centre):
        """One pass: each group's Gram about ``centre`` and its columns' squared deviations from the mean."""
        wanted = mean if self.center or self.scale else None  # the deviations serve centring and scaling only
        stats = executor.run_pass(passes.gram_block, centre, wanted, update=False)
        grams = np.stack([s["gram"] for s in stats])
        if self.center:  # the direct sums are exact where a sparse block's Gram had to cancel large terms
            for gram, s in zip(grams, stats):
                np.fill_diagonal(gram, s["sq_dev"])
        if not self.scale:
            return grams, np.ones(data.shape[1])
        std = passes.column_scale(sum(s["sq_dev"] for s in stats), mean, data.shape[0])
        return grams / np.outer(std, std), std

    def _sketch_path(self, data, executor, mean, centre, d):
        """The wide-data sketch (see ``max_gram_features``): returns the Grams restricted to Q, Q itself,
        and each group's exact ||A_l||_F^2."""
        m, n = data.shape
        k = data.n_groups
        size = self.sketch_size or d + 20
        stats = executor.run_pass(passes.deviations_block, mean, update=False)
        sq_dev = np.stack([s["sq_dev"] for s in stats])
        std = passes.column_scale(sq_dev.sum(axis=0), mean, m) if self.scale else np.ones(n)
        # ||A_l||^2 about the centre: sum (x - c)^2 = sum (x - mean)^2 + 2 (mean - c) sum (x - mean) + n_l (mean - c)^2
        offset = mean - centre
        sums_about_mean = np.stack([s["sum"] for s in stats]) - np.outer(data.group_sizes, mean)
        sq_about_centre = sq_dev + 2 * offset * sums_about_mean + np.outer(data.group_sizes, offset ** 2)
        traces = (sq_about_centre / std ** 2).sum(axis=1)
        rng = np.random.default_rng(self.random_state)
        omegas = np.broadcast_to(rng.standard_normal((n, size)), (k, n, size))
        for _ in range(1 + self.power_iterations):
            # Y_l = D^-1 G_l D^-1 Omega_l, then an orthonormal basis of it for the next iteration
            stats = executor.run_pass(passes.sketch_block, centre, np.ascontiguousarray(omegas / std[None, :, None]),
                                      update=False)
            omegas = np.stack([np.linalg.qr(s["Y"] / std[:, None])[0] for s in stats])
        basis = np.linalg.qr(np.concatenate(list(omegas), axis=1))[0]
        stats = executor.run_pass(passes.projected_gram_block, centre, np.ascontiguousarray(basis / std[:, None]),
                                  update=False)
        return np.stack([s["gram"] for s in stats]), std, basis, traces

    def _set_results(self, data, executor, result, grams, basis, traces, mean, col_scale, solver):
        self._grams, self._basis, self._traces = grams, basis, traces  # for losses_of: k n^2 doubles
        losses = solvers.group_losses(grams, result.components, result.s, traces)
        self.components_ = result.components if basis is None else result.components @ basis.T
        self.mu_ = result.mu
        self.primal_objective_ = result.primal
        self.dual_objective_ = result.dual
        self.duality_gap_ = result.primal - result.dual
        self.group_names_ = list(data.group_names)
        self._set_table("group_losses_", loss_frame, self.group_names_, losses)
        self.singular_values_ = np.sqrt(np.maximum(losses["captured"], 0.0))
        self.explained_variance_ = losses["captured"] / data.group_sizes[:, None]
        self.group_sizes_ = np.asarray(data.group_sizes)
        self.mean_ = mean
        self.scale_ = col_scale
        self.solver_ = solver
        self.n_iter_ = result.n_iter
        self.objective_history_ = np.asarray(result.primal, dtype=np.float64)
        self.converged_ = bool(np.all(self.duality_gap_ <= self.tol * result.s.max(axis=1)))
        self._set_table("group_metrics_", group_metric_frame, self.group_names_, {
            "relative_error": relative_error(losses["reconstruction"], losses["sq_norms"][:, None]),
            "objective": result.s.T - losses["captured"],
            **{f"{kind}_loss": losses[kind] for kind in ("marginal", "incremental", "reconstruction")}}, ranked=True)
        self.n_passes_ = executor.n_passes
        self.sketched_ = basis is not None
        self.scheduler_ = executor.describe()
        self.n_components_ = result.components.shape[0]
        self.n_features_in_ = data.shape[1]
        if data.feature_names is not None:
            self.feature_names_in_ = np.asarray(data.feature_names, dtype=object)

    def losses_of(self, components) -> pd.DataFrame:
        """``group_losses_`` for any orthonormal rows ``components`` (d x n) on the fitted data, e.g. the
        standard SVD's (``svd_components()``), to compare with the multigroup vectors."""
        self._check_fitted()
        V = np.atleast_2d(np.asarray(components, dtype=np.float64))
        if V.shape[1] != self.n_features_in_ or not np.allclose(V @ V.T, np.eye(len(V)), atol=1e-8):
            raise ValueError(f"components must be orthonormal rows of length {self.n_features_in_}")
        if self._basis is not None:  # coordinates in the sketch's basis, which must hold the components
            V = V @ self._basis
            if not np.allclose(np.linalg.norm(V, axis=1), 1.0, atol=1e-8):
                raise ValueError("components outside the span of the wide-data sketch: their losses are unknown")
        s = solvers.deflated_top_eigenvalues(self._grams, V)
        return loss_frame(self.group_names_, solvers.group_losses(self._grams, V, s, self._traces))

    def svd_components(self) -> np.ndarray:
        """The standard SVD's first d right singular vectors of the (centred/scaled) stacked data."""
        self._check_fitted()
        V = solvers.pooled_svd_components(self._grams, self.n_components_)
        return V if self._basis is None else V @ self._basis.T

    # -- using the components ---------------------------------------------------------------------------
    def transform(self, X):
        """((X - mean_) / scale_) V^T: the coordinates of X's rows on the components (sparse X stays sparse
        until the product). A GroupedMatrix or store is read block by block; rows come back in input order."""
        self._check_fitted()
        if isinstance(X, GroupedMatrix) or isinstance(X, (str, bytes)) or hasattr(X, "__fspath__"):
            data = as_grouped(X, signed=True)
            self._refuse_stored_mask(data, "transform")
            self._check_width(data.shape[1])
            executor = self._executor(data, None)
            try:
                blocks = executor.map_blocks(_project_block, *self._projection())
            finally:
                executor.close()
            return self._rows_in_caller_order(data, blocks)
        X = check_array(X, accept_sparse=("csr", "csc"), dtype=np.float64)
        self._check_width(X.shape[1])
        return _project_block(X, None, None, *self._projection())

    def _projection(self):
        weights = np.ascontiguousarray((self.components_ / self.scale_).T)  # n x d
        return weights, self.mean_ @ weights

    def inverse_transform(self, Z):
        """Z V scale_ + mean_: back to X's units."""
        self._check_fitted()
        return (np.asarray(Z) @ self.components_) * self.scale_ + self.mean_


@functools.lru_cache(maxsize=1)
def _blas_controller():
    """Finding the BLAS libraries reads /proc (~3 ms): once per process."""
    return threadpoolctl.ThreadpoolController()


def _project_block(X_b, local, block, weights, offset):
    return np.asarray(X_b @ weights) - offset


def _multigroup_facts(model) -> dict:
    return {"solver": model.solver_, "center": model.center, "scale": model.scale, "mu": model.mu_.tolist(),
            "duality_gap": model.duality_gap_.tolist(), "primal": model.primal_objective_.tolist(),
            "dual": model.dual_objective_.tolist()}


DECLARATION = MethodDeclaration(
    name="multigroup-svd", estimator=MultigroupSVD,
    summary="consistent multigroup singular vectors: min-max group loss, signed data, one pass",
    metrics=("relative_error", "marginal_loss", "incremental_loss", "reconstruction_loss", "objective"),
    nested_ranks=True,
    numba_kernels=False,  # LAPACK and an SDP solver: the warm-up runs none of its fits (BENCHMARKS.md, 2026-11-30)
    facts=_multigroup_facts,
    views="distfact.reports.multigroup_svd:views",
    paper_report=PaperReport("multigroup", "the multigroup low-rank paper's report (Figs. 2, 3): losses by rank "
                             "per group against the SVD, duality gaps", "distfact.reports.multigroup_svd:paper_report"))
