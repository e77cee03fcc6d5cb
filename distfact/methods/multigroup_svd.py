"""Consistent multigroup low-rank approximation: multigroup singular vectors (multigroup-lowrank.txt).

Groups A^1..A^k are the row groups of X (centred and scaled as asked); all the work after the
one pass over X is on their Gram matrices G_l = (A^l)^T A^l, stacked as ``grams`` (k x n x n):

- eq. (1), Problem 1: v minimises max_l h_l(v), h_l(v) = s_l - v^T G_l v, ||v|| = 1, where
  s_l = sigma_1^2(A^l) = lambda_max(G_l)                       -> :func:`constraint_values`
- Problem 2 (the dual, Appendix B): max over the simplex of g(mu) = mu^T s - lambda_max(A(mu)),
  A(mu) = sum_l mu_l G_l                                          -> :func:`dual_value`
- eq. (6): (grad g)_l = s_l - v(mu)^T G_l v(mu) = h_l(v(mu)), v(mu) the top eigenvector of A(mu).
  Algorithm 2's line 6 prints ``s_l + ...``: a sign typo; eq. (6) is right.
- Algorithm 2: Frank-Wolfe on Problem 2                            -> :func:`frank_wolfe`
- Section 7, Lemma E.1, eq. (11): two groups, the root of q(mu) = h_1(v(mu)) - h_2(v(mu)) on
  [0, 1] (q(0) >= 0 >= q(1), q decreasing) by Brent's method       -> :func:`brent_two_groups`
- Algorithm 3 (Appendix C): the SDP relaxation, through cvxpy      -> :func:`sdp_relaxation`
- Algorithm 1: a solution per rank, then deflation G_l <- P G_l P, P = I - v v^T
                                                                   -> :func:`multigroup_vectors`
- Appendix A, Section 8.1: marginal, incremental and reconstruction losses -> :func:`group_losses`

The empirical duality gap of a rank (Section 8.3) is f - g: f = max_l h_l(v) at the returned v,
g = g(mu) at the returned mu. It is zero at an optimum for two groups (Theorem 7.1).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import scipy.linalg
import scipy.optimize
import scipy.sparse as sp

from ..kernels.gram import (centred_gram, deflate, projected_gram, sketch_products, squared_deviations, top_eigenpair,
                            top_eigenvalue)

log = logging.getLogger(__name__)
SOLVERS = ("auto", "fw", "brent", "sdp")
REFINE_EVERY = 10  # Frank-Wolfe iterations between two eigenspace refinements (each a 2k x 2k SDP, ~50 ms)
FW_STEPS = ("line-search", "2/(t+2)")


# -- the pass over X (block statistics; the engine sums them per group) ---------------------------

def gram_block(X_b, local, block, centre, mean):
    """One block's contribution to its group's Gram matrix about ``centre``, and (unless ``mean`` is None:
    neither centring nor scaling asked) to its columns' sums of squared deviations from ``mean`` (the scale,
    free of the cancellation of sum x^2 - m mean^2)."""
    gram = centred_gram(X_b, centre)
    if mean is None:
        return {"gram": gram}
    if not sp.issparse(X_b) and np.array_equal(centre, mean):  # a dense block centred on the mean: the
        return {"gram": gram, "sq_dev": gram.diagonal().copy()}  # diagonal is these sums already
    return {"gram": gram, "sq_dev": squared_deviations(X_b, mean)}


def sketch_block(X_b, local, block, centre, omegas):
    """One block's (A_b^T A_b) Omega_l, Omega_l = ``omegas[l]`` for its group l (the wide-data sketch)."""
    return {"Y": sketch_products(X_b, centre, omegas[block.group])}


def projected_gram_block(X_b, local, block, centre, basis):
    """One block's Q^T A_b^T A_b Q (the Gram matrix restricted to the sketch's basis Q)."""
    return {"gram": projected_gram(X_b, centre, basis)}


def deviations_block(X_b, local, block, mean):
    """One block's column sums and sums of squared deviations from ``mean`` (the wide path's scale and
    its groups' ||A_l||_F^2)."""
    return {"sum": np.asarray(X_b.sum(axis=0, dtype=np.float64)).ravel(), "sq_dev": squared_deviations(X_b, mean)}


def column_scale(sq_dev: np.ndarray, mean: np.ndarray, n_rows: int, feature_names) -> np.ndarray:
    """Population standard deviation of every column (Section 8.1's standardisation) from the sums of
    squared deviations from the mean. A column is constant when its deviations are rounding (below
    64 eps |mean|): it cannot be scaled, and a ``ValueError`` names it."""
    var = sq_dev / n_rows
    constant = var <= (64 * np.finfo(np.float64).eps * np.maximum(np.abs(mean), np.finfo(np.float64).tiny)) ** 2
    if constant.any():
        idx = np.flatnonzero(constant)
        names = [str(feature_names[i]) if feature_names is not None else str(i) for i in idx[:10]]
        more = f" and {len(idx) - 10} more" if len(idx) > 10 else ""
        raise ValueError(f"scale=True: column(s) {', '.join(names)}{more} of X are constant (zero variance) "
                         "and cannot be standardised; drop them or use scale=False")
    return np.sqrt(var)


# -- the rank-1 problem on the driver ---------------------------------------------------------------

@dataclass
class RankOne:
    """A solution of MG-SINGULARVECTOR: the vector, the dual weights, both objectives, the work done."""

    v: np.ndarray
    mu: np.ndarray
    primal: float  # f = max_l h_l(v)
    dual: float  # g(mu)
    n_iter: int

    @property
    def gap(self) -> float:
        return self.primal - self.dual


def quadratic_forms(grams: np.ndarray, v: np.ndarray) -> np.ndarray:
    """v^T G_l v for every group."""
    return (grams @ v) @ v


def constraint_values(grams: np.ndarray, s: np.ndarray, v: np.ndarray) -> np.ndarray:
    """h_l(v) = s_l - ||A^l v v^T||_F^2 = s_l - v^T G_l v (Problem 1's constraint functions)."""
    return s - quadratic_forms(grams, v)


def dual_value(grams: np.ndarray, s: np.ndarray, mu: np.ndarray) -> float:
    """g(mu) = mu^T s - lambda_max(A(mu)) (Problem 2)."""
    return float(mu @ s) - top_eigenvalue(np.tensordot(mu, grams, axes=1))


def frank_wolfe(grams, s, tol: float, max_iter: int, step: str = "line-search") -> RankOne:
    """Algorithm 2: Frank-Wolfe ascent of g over the simplex, from mu = e_1.

    Each iteration: v(mu) (line 5), the gradient h(v(mu)) of eq. (6) (line 6), the best vertex
    e_j, j = argmax_l h_l (line 7), then mu <- mu + gamma (e_j - mu). ``step='2/(t+2)'`` is the
    paper's gamma_t (lines 8-9); ``'line-search'`` maximises the concave g on the segment instead:
    the root of its derivative d^T h(v(mu + gamma d)) by Brent's method. Stops when
    ||mu^(t+1) - mu^(t)|| < tol (line 11) or when the duality gap f - g falls below ``tol * max(s)``
    (then v is optimal), or after ``max_iter`` iterations.

    Frank-Wolfe needs a smooth objective; g has kinks where lambda_max(A(mu)) is repeated, which is where
    its optimum tends to lie with 3+ groups: there the iterates crawl (the paper's step) or stall (the
    line search), and the single eigenvector v(mu) can be far from the primal optimum although the span of
    the top eigenvectors holds it. So if a gap remains, :func:`eigenspace_primal` solves the problem within
    the top 2k eigenvectors of A(mu) (Algorithm 3 on 2k x 2k matrices), every ``REFINE_EVERY`` iterations
    and at the end: its v and its mu (g evaluated on the full Grams, a valid bound) replace FW's when
    better, and the loop stops as soon as the gap is closed.
    Returns the best v and the best mu met (each v bounds the optimum from above, each mu from below).
    """
    k = len(s)
    mu = np.zeros(k)
    mu[0] = 1.0
    best_v, best_primal, best_mu, best_dual = None, np.inf, mu, -np.inf
    scale = max(float(s.max()), np.finfo(np.float64).tiny)
    t = 0
    for t in range(1, max_iter + 1):
        lam, v = top_eigenpair(np.tensordot(mu, grams, axes=1))
        h = constraint_values(grams, s, v)
        primal, dual = float(h.max()), float(mu @ s) - lam
        if primal < best_primal:
            best_v, best_primal = v, primal
        if dual > best_dual:
            best_mu, best_dual = mu, dual
        if best_primal - best_dual <= tol * scale:
            break
        if t % REFINE_EVERY == 0:
            best_v, best_primal, best_mu, best_dual = _refined(grams, s, tol, best_v, best_primal, best_mu, best_dual)
            if best_primal - best_dual <= tol * scale:
                break
        direction = -mu
        direction[int(np.argmax(h))] += 1.0
        gamma = 2.0 / (t + 1) if step == "2/(t+2)" else _line_search(grams, s, mu, direction, float(direction @ h))
        mu_next = np.clip(mu + gamma * direction, 0.0, None)
        mu_next /= mu_next.sum()
        moved = np.linalg.norm(mu_next - mu)
        mu = mu_next
        if moved < tol:
            break
    if best_primal - best_dual > tol * scale:
        best_v, best_primal, best_mu, best_dual = _refined(grams, s, tol, best_v, best_primal, best_mu, best_dual)
    return RankOne(best_v, best_mu, best_primal, best_dual, t)


def _refined(grams, s, tol, v, primal, mu, dual):
    """The better of FW's (v, mu) and :func:`eigenspace_primal`'s at mu, each side separately."""
    if len(s) < 2:
        return v, primal, mu, dual
    refined = eigenspace_primal(grams, s, mu, tol)
    if refined.primal < primal:
        v, primal = refined.v, refined.primal
    if refined.dual > dual:
        mu, dual = refined.mu, refined.dual
    return v, primal, mu, dual


def eigenspace_primal(grams, s, mu, tol: float) -> RankOne:
    """Problem 1 restricted to the span U of the top 2k eigenvectors of A(mu) (k = number of groups),
    solved by Algorithm 3 on the 2k x 2k matrices U^T G_l U: a primal v for a dual mu, and the SDP's own
    weights mu (whose g, on the full Grams, is a lower bound like any mu's). At a dual optimum
    with a repeated lambda_max the optimal v is a combination of the eigenvectors, not one of them."""
    n = grams.shape[1]
    k = min(2 * len(s), n)
    _, U = scipy.linalg.eigh(np.tensordot(mu, grams, axes=1), subset_by_index=[n - k, n - 1], driver="evx",
                             check_finite=False)
    reduced = np.stack([U.T @ G @ U for G in grams])
    X, dual_mu = _solve_sdp(reduced, s, tol)
    v = U @ _rounded(reduced, s, X)
    v /= np.linalg.norm(v)
    return RankOne(v, dual_mu, float(constraint_values(grams, s, v).max()), dual_value(grams, s, dual_mu), 1)


def best_on_circle(grams, s, U: np.ndarray) -> np.ndarray:
    """The exact minimiser of max_l h_l(v) over the unit circle of span(U), U n x 2 orthonormal.

    With v = cos(phi/2) u_1 + sin(phi/2) u_2, h_l = a_l + b_l cos(phi) + c_l sin(phi), so the minimum of
    their maximum is at the minimum of one h_l or where two of them cross: O(k^2) candidates, all checked.
    This is Problem 1 where lambda_max(A(mu)) is double: the optimum mixes the two eigenvectors."""
    B = np.einsum("ia,lij,jb->lab", U, grams, U)
    a = s - (B[:, 0, 0] + B[:, 1, 1]) / 2
    b = -(B[:, 0, 0] - B[:, 1, 1]) / 2
    c = -B[:, 0, 1]
    candidates = [np.arctan2(-c, -b)]  # each h_l's minimum
    i, j = np.triu_indices(len(s), k=1)
    da, db, dc = a[i] - a[j], b[i] - b[j], c[i] - c[j]
    radius, shift = np.hypot(db, dc), np.arctan2(dc, db)
    crossing = radius >= np.abs(da)  # da + radius cos(phi - shift) = 0 has a solution
    angle = np.arccos(np.clip(-da[crossing] / np.where(crossing, radius, 1.0)[crossing], -1.0, 1.0))
    candidates += [shift[crossing] + angle, shift[crossing] - angle]
    phi = np.concatenate(candidates)
    values = (a[:, None] + b[:, None] * np.cos(phi) + c[:, None] * np.sin(phi)).max(axis=0)
    best = phi[int(np.argmin(values))]
    return np.cos(best / 2) * U[:, 0] + np.sin(best / 2) * U[:, 1]


def _rounded(grams, s, X: np.ndarray) -> np.ndarray:
    """A unit v from a PSD solution X of Algorithm 3: its top eigenvector (lines 3-4), or, when X has a
    second eigenvalue above 1e-6 of the first, the best v on the circle of its top two eigenvectors if
    that is better (X of rank 2 is what the relaxation returns when the optimum mixes two directions)."""
    values, vectors = np.linalg.eigh((X + X.T) / 2)
    v = vectors[:, -1]
    if len(values) > 1 and values[-2] > 1e-6 * values[-1]:
        w = best_on_circle(grams, s, vectors[:, -2:])
        if constraint_values(grams, s, w).max() < constraint_values(grams, s, v).max():
            v = w
    return v


def _line_search(grams, s, mu, direction, slope_at_0: float) -> float:
    """argmax over gamma in [0, 1] of g(mu + gamma d): g is concave with derivative d^T h(v(mu + gamma d))."""
    def slope(gamma):
        _, v = top_eigenpair(np.tensordot(mu + gamma * direction, grams, axes=1))
        return float(direction @ constraint_values(grams, s, v))

    if slope_at_0 <= 0:
        return 0.0
    if slope(1.0) >= 0:
        return 1.0
    return scipy.optimize.brentq(slope, 0.0, 1.0, xtol=1e-4)  # finer costs ~2x the evaluations, same g


class _Root(Exception):
    """Raised inside Brent's iteration when q is zero to rounding: no need to narrow the bracket further."""


def brent_two_groups(grams, s, max_iter: int, top_vectors=None) -> RankOne:
    """Section 7 and Lemma E.1: for two groups the dual optimum mu* (weight of group 1) is the root of
    q(mu) = s_1 - s_2 - v(mu)^T (G_1 - G_2) v(mu) (eq. 11) on [0, 1], found by Brent's method; there
    h_1 = h_2 and the duality gap is zero (Theorem 7.1). The gap is at most |q| at the returned mu, so
    Brent runs until |q| <= 1e-14 max(s) or mu is bracketed to 1e-15 (exact to rounding).

    Theorem 7.1 assumes lambda_max(C(mu)) simple. Where it is double at mu* (the groups' Grams commute,
    e.g. groups on disjoint columns), q jumps across 0 instead of crossing it, and the optimum mixes the
    two eigenvectors: :func:`best_on_circle` finds it exactly. ``top_vectors``: the groups' top
    eigenvectors, which are v(1) and v(0)."""
    scale = max(float(s.max()), np.finfo(np.float64).tiny)
    seen = {}

    def q(mu):
        if mu not in seen:
            v = top_eigenpair(mu * grams[0] + (1.0 - mu) * grams[1])[1] if top_vectors is None or 0 < mu < 1 \
                else top_vectors[0 if mu == 1 else 1]
            seen[mu] = v, constraint_values(grams, s, v)
        h = seen[mu][1]
        if abs(h[0] - h[1]) <= 1e-14 * scale:
            raise _Root(mu)
        return h[0] - h[1]

    try:
        q0, q1 = q(0.0), q(1.0)
        # q(0) < 0 or q(1) > 0 happens only by rounding: that endpoint's vector serves both groups
        mu_star = 0.0 if q0 < 0 else 1.0 if q1 > 0 else scipy.optimize.brentq(
            q, 0.0, 1.0, xtol=1e-15, maxiter=max_iter, disp=False)
    except _Root as root:
        mu_star = root.args[0]
    q(mu_star) if mu_star not in seen else None
    v, h = seen[mu_star]
    n_evaluations = len(seen)
    if abs(h[0] - h[1]) > 1e-10 * scale and grams.shape[1] > 1:  # a jump: lambda_max double at mu*
        n = grams.shape[1]
        _, U = scipy.linalg.eigh(mu_star * grams[0] + (1.0 - mu_star) * grams[1], subset_by_index=[n - 2, n - 1],
                                 driver="evx", check_finite=False)
        w = best_on_circle(grams, s, U)
        h_w = constraint_values(grams, s, w)
        if h_w.max() < h.max():
            v, h = w, h_w
    mu = np.array([mu_star, 1.0 - mu_star])
    return RankOne(v, mu, float(h.max()), dual_value(grams, s, mu), n_evaluations)


def sdp_relaxation(grams, s, tol: float) -> RankOne:
    """Algorithm 3: min z s.t. s_l - Tr(G_l X) <= z, X PSD, Tr(X) <= 1 (cvxpy); v from X's top eigenvector
    (lines 3-4, see :func:`_rounded`) and mu the constraints' dual values (the weights of Problem 2). When X
    is not of rank one (the relaxation is not tight, possible with 3+ groups) the primal is also searched
    within the top eigenvectors of A(mu) (:func:`eigenspace_primal`), as Frank-Wolfe's is.

    The paper's constraint [[X, x], [x^T, 1]] >= 0 with x free is X - x x^T >= 0 for some x, which x = 0
    makes X >= 0: the same feasible set for X."""
    X, mu = _solve_sdp(grams, s, tol)
    v = _rounded(grams, s, X)
    primal = float(constraint_values(grams, s, v).max())
    dual = dual_value(grams, s, mu)
    if primal - dual > tol * max(float(s.max()), np.finfo(np.float64).tiny):  # X of rank > 1: also search
        refined = eigenspace_primal(grams, s, mu, tol)                          # near the dual optimum's vectors
        if refined.primal < primal:
            v, primal = refined.v, refined.primal
    return RankOne(v, mu, primal, dual, 1)


def _solve_sdp(grams, s, tol: float) -> tuple[np.ndarray, np.ndarray]:
    """Algorithm 3's program; returns X and the weights mu (dual values, on the simplex). The Grams are
    divided by max(s) for the solver's sake."""
    import cvxpy as cp

    k, n, _ = grams.shape
    scale = max(float(s.max()), np.finfo(np.float64).tiny)
    X = cp.Variable((n, n), PSD=True)
    z = cp.Variable()
    group_constraints = [s[l] / scale - cp.trace((grams[l] / scale) @ X) <= z for l in range(k)]
    problem = cp.Problem(cp.Minimize(z), group_constraints + [cp.trace(X) <= 1])
    try:
        _run_solver(problem, tol)
    except cp.error.SolverError as exc:
        raise RuntimeError(f"the SDP solver failed ({exc}); try solver='fw'") from exc
    if problem.status not in ("optimal", "optimal_inaccurate") or X.value is None:
        raise RuntimeError(f"the SDP relaxation ended with status {problem.status!r}; try solver='fw'")
    mu = np.clip(np.array([float(c.dual_value) for c in group_constraints]), 0.0, None)
    return X.value, (mu / mu.sum() if mu.sum() > 0 else np.full(k, 1.0 / k))


def _run_solver(problem, tol: float) -> None:
    """Clarabel (interior point, accurate) when installed, else SCS."""
    import cvxpy as cp

    if "CLARABEL" in cp.installed_solvers():
        problem.solve(solver="CLARABEL", tol_gap_abs=tol, tol_gap_rel=tol, tol_feas=tol)
    else:
        problem.solve(solver="SCS", eps=tol)


def solve_rank_one(grams, s, solver: str, tol: float, max_iter: int, fw_step: str, top_vectors=None) -> RankOne:
    if solver == "brent":
        return brent_two_groups(grams, s, max_iter, top_vectors)
    if solver == "sdp":
        return sdp_relaxation(grams, s, tol)
    return frank_wolfe(grams, s, tol, max_iter, fw_step)


# -- Algorithm 1 and the losses ---------------------------------------------------------------------

@dataclass
class MultigroupResult:
    components: np.ndarray  # d x n, orthonormal rows v_1..v_d
    mu: np.ndarray  # d x k
    primal: np.ndarray  # d: f at each rank
    dual: np.ndarray  # d: g at each rank
    s: np.ndarray  # d x k: sigma_1^2 of each deflated group at each rank
    n_iter: np.ndarray  # d


def multigroup_vectors(grams: np.ndarray, n_components: int, solver: str, tol: float, max_iter: int,
                       fw_step: str = "line-search", progress=None) -> MultigroupResult:
    """Algorithm 1: v_r solves MG-SINGULARVECTOR on the groups deflated by v_1..v_{r-1}; each group's
    Gram matrix is then deflated, G_l <- P G_l P, P = I - v_r v_r^T."""
    k, n, _ = grams.shape
    current = np.array(grams, dtype=np.float64)
    V = np.zeros((n_components, n))
    out = {name: [] for name in ("mu", "primal", "dual", "s", "n_iter")}
    for r in range(n_components):
        tops = [top_eigenpair(G) for G in current]
        s = np.array([value for value, _ in tops])
        sol = solve_rank_one(current, s, solver, tol, max_iter, fw_step, [vector for _, vector in tops])
        V[r] = _orthogonal_to(sol.v, V[:r])
        sol.primal = float(constraint_values(current, s, V[r]).max())  # of the vector kept (rounding moves it)
        current = np.stack([deflate(G, V[r]) for G in current])
        for name, value in (("mu", sol.mu), ("primal", sol.primal), ("dual", sol.dual), ("s", s),
                            ("n_iter", sol.n_iter)):
            out[name].append(value)
        log.info("multigroup SVD: component %d: f = %.6g, g = %.6g, %d iterations", r + 1, sol.primal, sol.dual,
                 sol.n_iter)
        if progress is not None:
            progress(r + 1)
    return MultigroupResult(V, *(np.array(out[name]) for name in ("mu", "primal", "dual", "s", "n_iter")))


def _orthogonal_to(v: np.ndarray, previous: np.ndarray) -> np.ndarray:
    """v with the components along earlier vectors removed (rounding only), renormalised. When the data
    have no rank left, every direction has zero loss and v may lie in their span: any unit vector of the
    orthogonal complement is then optimal."""
    w = v - previous.T @ (previous @ v)
    norm = np.linalg.norm(w)
    if norm < 0.5:
        w = np.linalg.svd(previous, full_matrices=True)[2][len(previous)]
        norm = np.linalg.norm(w)
    return w / norm


def deflated_top_eigenvalues(grams: np.ndarray, components: np.ndarray) -> np.ndarray:
    """sigma_1^2 of every group deflated by v_1..v_{r-1}, for r = 1..d (d x k): the s of each rank's
    rank-1 problem, for any orthonormal sequence (e.g. the standard SVD's, to compare losses)."""
    current = np.array(grams, dtype=np.float64)
    out = []
    for v in components:
        out.append([top_eigenvalue(G) for G in current])
        current = np.stack([deflate(G, v) for G in current])
    return np.array(out)


def pooled_svd_components(grams: np.ndarray, n_components: int) -> np.ndarray:
    """The standard SVD's top right singular vectors of the stacked groups: eigenvectors of sum_l G_l."""
    values, vectors = np.linalg.eigh(grams.sum(axis=0))
    return vectors[:, ::-1][:, :n_components].T


def group_losses(grams: np.ndarray, components: np.ndarray, s_by_rank: np.ndarray, traces=None) -> dict:
    """Per group (rows) and rank r = 1..d (columns), with V_r = v_1..v_r and sum_i over i <= r:

    - marginal (Appendix A, Def. A.2): sum_i sigma_i^2(A^l) - ||A^l V_r V_r^T||_F^2
    - incremental (Section 4): sum_i [sigma_1^2(A^l_i) - ||A^l_i v_i v_i^T||_F^2], A^l_i deflated by v_<i
    - reconstruction (Section 8.1): ||A^l - A^l V_r V_r^T||_F^2 = ||A^l||_F^2 - ||A^l V_r V_r^T||_F^2

    Uses ||A V V^T||_F^2 = sum_i v_i^T G v_i (Property 1) and A^l_i v_i = A^l v_i (v_i is orthogonal to v_<i).
    ``traces``: ||A^l||_F^2 when ``grams`` are restricted to a subspace (the wide-data sketch).
    """
    d = components.shape[0]
    captured = np.stack([quadratic_forms(grams, v) for v in components], axis=1)  # k x d
    cumulative = np.cumsum(captured, axis=1)
    sigma2 = np.stack([np.linalg.eigvalsh(G)[::-1][:d] for G in grams])
    traces = np.trace(grams, axis1=1, axis2=2) if traces is None else np.asarray(traces)
    return {"marginal": np.cumsum(sigma2, axis=1) - cumulative,
            "incremental": np.cumsum(s_by_rank.T - captured, axis=1),
            "reconstruction": traces[:, None] - cumulative,
            "captured": captured}
