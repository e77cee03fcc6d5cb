"""The multigroup SVD on the driver, from the groups' Gram matrices: the rank-1 problem (Problems 1 and 2) by
Frank-Wolfe with its eigenspace refinement, by the root of q for two groups, or by the SDP relaxation; Algorithm 1
with deflation; and the losses of Appendix A and Section 8.1."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import scipy.optimize
import scipy.sparse as sp

from ...kernels.gram import deflate, fixed_sign, solve_on_complement, top_eigenpair, top_eigenpairs, top_eigenvalue

log = logging.getLogger(__name__)
SOLVERS = ("auto", "fw", "brent", "sdp")
REFINE_EVERY = 10  # Frank-Wolfe iterations between two eigenspace refinements (the first at the first iteration)
REFINE_ROUNDS = 10  # at most this many subspace rounds (small SDPs) per refinement
FW_STEPS = ("line-search", "2/(t+2)")


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
    """Algorithm 2: Frank-Wolfe ascent of g over the simplex, from its centre mu = (1/k, ..., 1/k) (the
    paper starts at e_1; any start converges, and the centre, which treats the groups alike, is the better
    start for the refinement below).

    Each iteration: v(mu) (line 5), the gradient h(v(mu)) of eq. (6) (line 6), the best vertex
    e_j, j = argmax_l h_l (line 7), then mu <- mu + gamma (e_j - mu). ``step='2/(t+2)'`` is the
    paper's gamma_t (lines 8-9); ``'line-search'`` maximises the concave g on the segment instead:
    the root of its derivative d^T h(v(mu + gamma d)) by Brent's method. Stops when
    ||mu^(t+1) - mu^(t)|| < tol (line 11) or when the duality gap f - g falls below ``tol * max(s)``
    (then v is optimal), or after ``max_iter`` iterations.

    Frank-Wolfe needs a smooth objective; g has kinks where lambda_max(A(mu)) is repeated, which is where
    its optimum tends to lie with 3+ groups: there the iterates crawl (the paper's step) or stall (the
    line search), and the single eigenvector v(mu) can be far from the primal optimum although the span of
    the top eigenvectors holds it. So while a gap remains, :func:`eigenspace_primal` solves the relaxation
    (Algorithm 3) on a subspace grown from the top eigenvectors of A(mu) at the best mu, at the first
    iteration, every ``REFINE_EVERY`` iterations after it and at the end: its v and its mu (g evaluated
    on the full Grams, a valid bound) replace FW's when better, and FW goes on from the better mu. The
    loop stops as soon as the gap is closed, or when a refinement has settled: the relaxation's value
    known to tol and its rounding no longer improving (with 3+ groups the relaxation need not be tight,
    and a gap may remain that no method closes, Section 8.3). On compas-3 and communities-4 the first
    refinement closes the gap at every rank, before any FW step; FW's own iterations are the fallback.
    Returns the best v and the best mu met (each v bounds the optimum from above, each mu from below).
    """
    k = len(s)
    mu = np.full(k, 1.0 / k)
    best = RankOne(None, mu, np.inf, -np.inf, 0)
    scale = max(float(s.max()), np.finfo(np.float64).tiny)
    settled = k == 1  # one group: v(mu) is optimal, there is nothing to refine
    t = 0
    for t in range(1, max_iter + 1):
        lam, v = top_eigenpair(np.tensordot(mu, grams, axes=1))
        h = constraint_values(grams, s, v)
        best = _better(best, RankOne(v, mu, float(h.max()), float(mu @ s) - lam, t))
        if best.gap <= tol * scale:
            break
        if (t - 1) % REFINE_EVERY == 0 and not settled:
            refined, settled = eigenspace_primal(grams, s, best.mu, tol)
            best = _better(best, refined)
            if best.gap <= tol * scale or settled:
                break
            if best.mu is not mu:  # Frank-Wolfe goes on from the refinement's better weights
                mu = best.mu
                continue
        direction = -mu
        direction[int(np.argmax(h))] += 1.0
        gamma = 2.0 / (t + 1) if step == "2/(t+2)" else _line_search(grams, s, mu, direction, float(direction @ h))
        mu_next = np.clip(mu + gamma * direction, 0.0, None)
        mu_next /= mu_next.sum()
        moved = np.linalg.norm(mu_next - mu)
        mu = mu_next
        if moved < tol:
            break
    if best.gap > tol * scale and not settled:
        best = _better(best, eigenspace_primal(grams, s, best.mu, tol)[0])
    if best.gap > tol * scale and k > 1:  # not tight: a second rounding may find a better v (it often does)
        try:
            best = _better(best, top_eigenspace_rounding(grams, s, best.mu, tol))
        except RuntimeError:
            pass
    best.n_iter = t
    return best


def top_eigenspace_rounding(grams, s, mu, tol: float) -> RankOne:
    """Algorithm 3 on the top 2k eigenvectors of A(mu) at once, rounded (:func:`_rounded`): another primal
    candidate where the relaxation is not tight, as :func:`eigenspace_primal`'s growing subspace rounds
    differently (a review found this one better in 5 of 6 non-tight random cases)."""
    n = grams.shape[1]
    U = top_eigenpairs(np.tensordot(mu, grams, axes=1), min(2 * len(s), n))[1]
    reduced = U.T @ grams @ U
    X, weights = _solve_sdp(reduced, s, tol)
    v = U @ _rounded(reduced, s, X)
    v /= np.linalg.norm(v)
    return RankOne(v, weights, float(constraint_values(grams, s, v).max()), dual_value(grams, s, weights), 1)


def _better(a: RankOne, b: RankOne) -> RankOne:
    """The better primal side (smaller f) of two solutions with the better dual side (larger g)."""
    primal_side = a if a.primal <= b.primal else b
    dual_side = a if a.dual >= b.dual else b
    return RankOne(primal_side.v, dual_side.mu, primal_side.primal, dual_side.dual, b.n_iter)


def eigenspace_primal(grams, s, mu, tol: float) -> tuple[RankOne, bool]:
    """Algorithm 3 on a subspace, grown until it answers for the whole space: a primal v and weights mu.

    Each round solves Algorithm 3 on the p x p matrices U^T G_l U, U orthonormal (first the top k
    eigenvectors of A(mu), k groups): its solution X_U gives v in span(U) (:func:`_rounded`), a point of
    Problem 1, and its weights mu_U, whose g on the full Grams is a lower bound like any mu's. U X_U U^T
    is feasible for the full relaxation, so z_U = max_l s_l - Tr(U^T G_l U X_U) (X_U of trace 1) bounds
    the relaxation's value, which is max g (strong duality for the SDP), from above. Unless they meet,
    lambda_max(A(mu_U)) exceeds lambda_max(U^T A(mu_U) U), and the top two eigenvectors of A(mu_U), the
    directions U lacks, join it: a cutting-plane method on Problem 2 whose cuts are eigenvectors (as in
    the spectral bundle method). With 3+ groups the dual optimum tends to lie where lambda_max(A(mu)) is
    repeated, and the optimal v then mixes those eigenvectors: 2 to 4 rounds find them on compas-3 and
    communities-4. v is also searched on the circle of those two eigenvectors (:func:`best_on_circle`),
    which helps where the relaxation is not tight. The small SDPs are solved to tol / 100.

    Stops when the gap f - g is below tol max(s); or when z_U - g(mu_U) is (mu_U is dual optimal to tol)
    and the round did not improve f by more than that, or U spans the whole space: the relaxation is
    solved and its rounding is as good as it gets (a near-optimal X_U can still be of rank 2 while the
    optimum is of rank 1, so a certified dual alone does not stop the rounds); or after ``REFINE_ROUNDS``
    rounds, or when a small SDP fails. Returns the best v and mu met (v None if none was) and whether it
    settled (either of the first two)."""
    k, n = len(s), grams.shape[1]
    scale = max(float(s.max()), np.finfo(np.float64).tiny)
    U = top_eigenpairs(np.tensordot(mu, grams, axes=1), min(k, n))[1]
    best, relaxation_bound = RankOne(None, mu, np.inf, -np.inf, 0), np.inf
    for round_ in range(1, REFINE_ROUNDS + 1):
        reduced = U.T @ grams @ U
        try:
            X, mu_U = _solve_sdp(reduced, s, tol * 1e-2)
        except RuntimeError:  # the solver gave up (numerically): keep what the earlier rounds found
            break
        values, vectors = top_eigenpairs(np.tensordot(mu_U, grams, axes=1), min(2, n))
        relaxation_bound = min(relaxation_bound, float((s - np.einsum("lij,ij->l", reduced, X) / np.trace(X)).max()))
        previous_primal = best.primal
        best = _better(best, RankOne(None, mu_U, np.inf, float(mu_U @ s) - values[0], round_))
        candidates = [U @ _rounded(reduced, s, X)]  # a unit vector: U is orthonormal
        if n > 1:
            candidates.append(best_on_circle(grams, s, vectors))
        for v in candidates:
            best = _better(best, RankOne(v, mu_U, float(constraint_values(grams, s, v).max()), -np.inf, round_))
        whole_space = U.shape[1] == n
        certified = relaxation_bound - best.dual <= tol * scale
        if best.gap <= tol * scale or certified and (previous_primal - best.primal <= tol * scale or whole_space):
            return best, True
        if whole_space:
            break
        Q, R = np.linalg.qr(np.hstack([U, vectors]))
        U = Q[:, np.abs(R.diagonal()) > 1e-8]  # the new vectors' parts outside span(U), unless negligible
    return best, False


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


class RootPoint(NamedTuple):
    """q (eq. 11) at one mu, its first two derivatives, and the eigenproblem they come from."""

    q: float
    dq: float  # q'(mu); NaN where lambda_1 is repeated or not asked for
    d2q: float  # q''(mu)
    lam: float  # lambda_1(A(mu))
    v: np.ndarray  # v(mu), the top eigenvector
    h: np.ndarray  # h(v(mu))


def root_function(grams, s, mu: float, zero: float = 0.0) -> RootPoint:
    """q(mu) = h_1(v(mu)) - h_2(v(mu)) (eq. 11) and its first two derivatives, at A(mu) = mu G_1 + (1 - mu) G_2.

    A(mu) moves along D = G_1 - G_2, so q = s_1 - s_2 - lambda_1' (v^T D v is lambda_1's derivative), and
    the derivatives of q are those of the top eigenvalue from perturbation theory: with the top eigenpair
    (lambda_1, v), w = (I - v v^T) D v and x = (lambda_1 I - A)^+ w (= dv/dmu; one Cholesky solve, see
    :func:`solve_on_complement`), lambda_1'' = 2 w^T x and lambda_1''' = 6 (x^T D x - lambda_1' x^T x).
    q' = -lambda_1'' <= 0 (g is concave, eq. 6); both derivatives are NaN where lambda_1 is repeated, and
    where |q| <= ``zero`` (mu is the root: they are not needed, and not computed)."""
    D = grams[0] - grams[1]
    A = grams[1] + mu * D
    values, vectors = top_eigenpairs(A)
    lam, v = float(values[0]), vectors[:, 0]
    Dv = D @ v
    slope = float(v @ Dv)  # lambda_1'
    # v^T G_1 v = lambda_1 + (1 - mu) lambda_1' and v^T G_2 v = lambda_1 - mu lambda_1', as A = G_2 + mu D
    h = np.array([s[0] - lam - (1.0 - mu) * slope, s[1] - lam + mu * slope])
    if abs(h[0] - h[1]) <= zero:
        return RootPoint(h[0] - h[1], np.nan, np.nan, lam, v, h)
    w = Dv - slope * v
    x = solve_on_complement(A, lam, v, w)
    if x is None:
        return RootPoint(h[0] - h[1], np.nan, np.nan, lam, v, h)
    return RootPoint(h[0] - h[1], -2.0 * float(w @ x), -6.0 * (float(x @ (D @ x)) - slope * float(x @ x)), lam, v, h)


def brent_two_groups(grams, s, max_iter: int, top_vectors=None, start: float | None = None) -> RankOne:
    """Section 7 and Lemma E.1: for two groups the dual optimum mu* (weight of group 1) is the root of
    q(mu) = s_1 - s_2 - v(mu)^T (G_1 - G_2) v(mu) (eq. 11) on [0, 1], q(0) >= 0 >= q(1), q decreasing;
    there h_1 = h_2 and the duality gap is zero (Theorem 7.1).

    The paper finds it by Brent's method; here (solver='brent' still) by Halley's method on the exact
    derivatives of q (:func:`root_function`), safeguarded: every point stays inside a bracket [lo, hi] with
    q(lo) > 0 > q(hi), and a Halley point outside it, or after a point that did not halve |q|, is replaced by
    the bracket's midpoint (so it converges whenever bisection does). Convergence is
    cubic: 3 to 6 eigenproblems per rank instead of Brent's 7 to 15, from ``start`` (Algorithm 1 passes the
    previous rank's root: successive ranks' roots are close, and it saves 10-30% of the eigenproblems on
    Table 1's data) or else the secant point of q(0) and q(1). The gap is at most |q| at the returned mu,
    so it runs until |q| <= 1e-14 max(s) or the bracket is below 1e-15 (mu exact to rounding);
    g(mu) = mu^T s - lambda_1 comes from the same eigenproblem.

    Theorem 7.1 assumes lambda_max(C(mu)) simple. Where it is double at mu* (the groups' Grams commute,
    e.g. groups on disjoint columns), q jumps across 0 instead of crossing it (its derivatives are
    unbounded there, and bisection takes over), and the optimum mixes the two eigenvectors:
    :func:`best_on_circle` finds it exactly. ``top_vectors``: the groups' top eigenvectors, which are v(1)
    and v(0)."""
    scale = max(float(s.max()), np.finfo(np.float64).tiny)
    v0, v1 = top_vectors[::-1] if top_vectors is not None else (top_eigenpair(G)[1] for G in grams[::-1])
    h0, h1 = constraint_values(grams, s, v0), constraint_values(grams, s, v1)
    # q(0) = h_1(v(0)) >= 0 (h_2(v(0)) = 0) and q(1) <= 0; a zero end is optimal (its vector serves both groups)
    if h0[0] - h0[1] <= 1e-14 * scale:
        mu, lam, v, h, n_evaluations = 0.0, s[1], v0, h0, 0
    elif h1[0] - h1[1] >= -1e-14 * scale:
        mu, lam, v, h, n_evaluations = 1.0, s[0], v1, h1, 0
    else:
        lo, hi = 0.0, 1.0
        secant = (h0[0] - h0[1]) / ((h0[0] - h0[1]) - (h1[0] - h1[1]))
        next_mu = start if start is not None and 0 < start < 1 else secant
        last_q = np.inf
        for n_evaluations in range(1, max_iter + 1):
            mu = next_mu  # the point evaluated: mu, lam, v and h always belong together
            point = root_function(grams, s, mu, 1e-14 * scale)
            lam, v, h = point.lam, point.v, point.h
            lo, hi = (mu, hi) if point.q > 0 else (lo, mu)
            if abs(point.q) <= 1e-14 * scale or hi - lo <= 1e-15:
                break
            halley = mu - 2 * point.q * point.dq / (2 * point.dq ** 2 - point.q * point.d2q) if point.dq < 0 else np.nan
            # Halley only while it is inside the bracket and has at least halved |q| since the last point; else
            # bisect. Near an avoided crossing of lambda_1 and lambda_2 (q's derivatives huge but not NaN) Halley
            # can creep towards the crossing with q unchanged; this rule sends it back to the sign change. Each
            # step halves |q| or the bracket, so it ends within ~100 evaluations at worst.
            progress = abs(point.q) <= abs(last_q) / 2
            next_mu = halley if lo < halley < hi and progress else (lo + hi) / 2
            last_q = point.q if progress else np.inf  # (after a bisection, the next Halley step is let through)
    if abs(h[0] - h[1]) > 1e-10 * scale and grams.shape[1] > 1:  # a jump: lambda_max double at mu*
        U = top_eigenpairs(mu * grams[0] + (1.0 - mu) * grams[1], 2)[1]
        w = best_on_circle(grams, s, U)
        h_w = constraint_values(grams, s, w)
        if h_w.max() < h.max():
            v, h = w, h_w
    weights = np.array([mu, 1.0 - mu])
    return RankOne(v, weights, float(h.max()), float(weights @ s) - lam, n_evaluations)


def sdp_relaxation(grams, s, tol: float) -> RankOne:
    """Algorithm 3: min z s.t. s_l - Tr(G_l X) <= z, X PSD, Tr(X) <= 1; v from X's top eigenvector
    (lines 3-4, see :func:`_rounded`) and mu the constraints' dual values (the weights of Problem 2). When X
    is not of rank one (the relaxation is not tight, possible with 3+ groups) the primal is also searched
    within the top eigenvectors of A(mu) (:func:`eigenspace_primal`), as Frank-Wolfe's is.

    The paper's constraint [[X, x], [x^T, 1]] >= 0 with x free is X - x x^T >= 0 for some x, which x = 0
    makes X >= 0: the same feasible set for X."""
    try:
        X, mu = _solve_sdp(grams, s, tol)
    except RuntimeError as exc:
        raise RuntimeError(f"{exc}; try solver='fw'") from exc
    v = _rounded(grams, s, X)
    primal = float(constraint_values(grams, s, v).max())
    dual = dual_value(grams, s, mu)
    if primal - dual > tol * max(float(s.max()), np.finfo(np.float64).tiny):  # X of rank > 1: also search
        refined = eigenspace_primal(grams, s, mu, tol)[0]                       # near the dual optimum's vectors
        if refined.primal < primal:
            v, primal = refined.v, refined.primal
    return RankOne(v, mu, primal, dual, 1)


def _solve_sdp(grams, s, tol: float) -> tuple[np.ndarray, np.ndarray]:
    """Algorithm 3's program through its dual, Problem 2 as an SDP in k + 1 variables:
    max mu^T s - t s.t. t I - sum_l mu_l G_l PSD, mu in the simplex. X is the multiplier of the
    semidefinite constraint (of trace 1, as t is free; Tr(X) <= 1 holds with equality at an optimum), z
    that of sum mu = 1. Solved by Clarabel (interior point, a dependency of cvxpy) called directly:
    setting the same problem up through cvxpy costs ~15 ms a call, ten times the solve of the small
    problems of :func:`eigenspace_primal`. Clarabel's semidefinite cone holds the upper triangle by
    columns, off-diagonal entries times sqrt(2) (so that its inner product is the trace's). The Grams are
    divided by max(s) for the solver's sake. Returns X and mu (on the simplex)."""
    import clarabel

    k, n, _ = grams.shape
    scale = max(float(s.max()), np.finfo(np.float64).tiny)
    cols, rows = np.tril_indices(n)  # (the lower triangle by rows is the upper one by columns)
    weights = np.where(rows == cols, 1.0, np.sqrt(2.0))
    semidefinite = np.column_stack([grams[:, rows, cols].T * weights[:, None] / scale, -1.0 * (rows == cols)])
    constraints = sp.csc_matrix(np.vstack([np.append(np.ones(k), 0.0)[None, :],  # sum mu = 1
                                           np.eye(k, k + 1) * -1.0,  # mu >= 0
                                           semidefinite]))  # t I - sum mu_l G_l PSD
    rhs = np.zeros(constraints.shape[0])
    rhs[0] = 1.0
    settings = clarabel.DefaultSettings()
    settings.verbose = False
    settings.tol_gap_abs = settings.tol_gap_rel = settings.tol_feas = tol
    solution = clarabel.DefaultSolver(sp.csc_matrix((k + 1, k + 1)), np.append(-s / scale, 1.0),
                                      constraints, rhs, [clarabel.ZeroConeT(1), clarabel.NonnegativeConeT(k),
                                                         clarabel.PSDTriangleConeT(n)], settings).solve()
    if solution.status not in (clarabel.SolverStatus.Solved, clarabel.SolverStatus.AlmostSolved):
        raise RuntimeError(f"the SDP relaxation ended with status {solution.status}")
    X = np.zeros((n, n))
    X[rows, cols] = X[cols, rows] = np.asarray(solution.z)[1 + k:] / weights
    mu = np.clip(np.asarray(solution.x)[:k], 0.0, None)
    return X, (mu / mu.sum() if mu.sum() > 0 else np.full(k, 1.0 / k))


def solve_rank_one(grams, s, solver: str, tol: float, max_iter: int, fw_step: str, top_vectors=None,
                   previous: RankOne | None = None) -> RankOne:
    """The rank-1 problem by ``solver``; ``previous``: the previous rank's solution (Brent starts at its mu)."""
    if solver == "brent":
        return brent_two_groups(grams, s, max_iter, top_vectors, None if previous is None else previous.mu[0])
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
    sol = None
    for r in range(n_components):
        tops = [top_eigenpairs(G) for G in current]  # (the kept vector's sign is fixed below)
        s = np.array([values[0] for values, _ in tops])
        sol = solve_rank_one(current, s, solver, tol, max_iter, fw_step, [vectors[:, 0] for _, vectors in tops], sol)
        V[r] = fixed_sign(_orthogonal_to(sol.v, V[:r]))
        sol.primal = float(constraint_values(current, s, V[r]).max())  # of the vector kept (rounding moves it)
        current = deflate(current, V[r])
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
        current = deflate(current, v)
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
    ``traces``: ||A^l||_F^2 when ``grams`` are restricted to a subspace (the wide-data sketch); returned as
    "sq_norms" (k), with "captured" (k x d): ||A^l v_r||^2.
    """
    d = components.shape[0]
    captured = ((grams @ components.T) * components.T).sum(axis=1)  # k x d: v_r^T G_l v_r
    cumulative = np.cumsum(captured, axis=1)
    sigma2 = np.linalg.eigvalsh(grams)[:, ::-1][:, :d]
    traces = np.trace(grams, axis1=1, axis2=2) if traces is None else np.asarray(traces)
    return {"marginal": np.cumsum(sigma2, axis=1) - cumulative,
            "incremental": np.cumsum(s_by_rank.T - captured, axis=1),
            "reconstruction": traces[:, None] - cumulative,
            "captured": captured, "sq_norms": traces}
