"""Consistent multigroup low-rank approximation: multigroup singular vectors. A. Matakos, M. Ciaperoni and
H. Mannila, "Consistent Multigroup Low-Rank Approximation", 2025 (arXiv:2503.21563).

Groups A^1..A^k are the row groups of X (centred and scaled as asked); all the work after the
one pass over X is on their Gram matrices G_l = (A^l)^T A^l, stacked as ``grams`` (k x n x n):

- eq. (1), Problem 1: v minimises max_l h_l(v), h_l(v) = s_l - v^T G_l v, ||v|| = 1, where
  s_l = sigma_1^2(A^l) = lambda_max(G_l)                       -> :func:`constraint_values`
- Problem 2 (the dual, Appendix B): max over the simplex of g(mu) = mu^T s - lambda_max(A(mu)),
  A(mu) = sum_l mu_l G_l                                          -> :func:`dual_value`
- eq. (6): (grad g)_l = s_l - v(mu)^T G_l v(mu) = h_l(v(mu)), v(mu) the top eigenvector of A(mu).
  Algorithm 2's line 6 prints ``s_l + ...``: a sign typo; eq. (6) is right.
- Algorithm 2: Frank-Wolfe on Problem 2, with Algorithm 3 on growing subspaces (the top
  eigenvectors of A(mu)) to close the gap                           -> :func:`frank_wolfe`, :func:`eigenspace_primal`
- Section 7, Lemma E.1, eq. (11): two groups, the root of q(mu) = h_1(v(mu)) - h_2(v(mu)) on
  [0, 1] (q(0) >= 0 >= q(1), q decreasing), by Halley's method on q's exact derivatives (eigenvalue
  perturbation) inside Brent's bracket                              -> :func:`brent_two_groups`, :func:`root_function`
- Algorithm 3 (Appendix C): the SDP relaxation, by Clarabel        -> :func:`sdp_relaxation`
- Algorithm 1: a solution per rank, then deflation G_l <- P G_l P, P = I - v v^T
                                                                   -> :func:`multigroup_vectors`
- Appendix A, Section 8.1: marginal, incremental and reconstruction losses -> :func:`group_losses`

The empirical duality gap of a rank (Section 8.3) is f - g: f = max_l h_l(v) at the returned v,
g = g(mu) at the returned mu. It is zero at an optimum for two groups (Theorem 7.1).

``passes.py`` holds the one pass over X (its block statistics) and ``solvers.py`` everything after it, on the
driver.
"""
