"""A method that exists only for the tests: projected-gradient NMF, added to distfact as a plug-in would be.

Its kernel, its method (the engine's hooks), its estimator and its declaration are all in this file, and it
touches no other: ``DISTFACT_METHODS=plugin_pgnmf`` (with this directory on the path) or importing it makes
``distfact fit --method pg-nmf``, ``method = "pg-nmf"`` in a pipeline spec and ``distfact report`` of its fit
work (tests/test_method_contract.py). It is deliberately simple, not a method anyone should use.

    minimise 1/2 ||X - W H||_F^2 over W, H >= 0 by projected gradient steps of size 1/L (L the gradient's
    Lipschitz constant), H then W each iteration:
    global step  H <- max(0, H - (W^T W H - W^T X) / ||W^T W||_2)
    local step   W_b <- max(0, W_b - (W_b H H^T - X_b H^T) / ||H H^T||_2)
    statistics   per group: W_l^T X_l, W_l^T W_l; so 1/2 ||X_l - W_l H||^2 = 1/2 (||X_l||^2 - 2 <W_l^T X_l, H>
                 + <W_l^T W_l, H H^T>)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from sklearn.utils._param_validation import StrOptions

from distfact.engine import fit as run_loop
from distfact.engine import initialise
from distfact.estimators.base import FactorEstimator, check_rank
from distfact.estimators.contract import COUNT, NON_NEGATIVE, SURFACE_CONSTRAINTS, MethodDeclaration
from distfact.estimators.persistence import register_estimators
from distfact.metrics import frobenius_sq_errors
from distfact.registry import register


# -- kernel ----------------------------------------------------------------------------------------
def gram_stats(X_b, W_b):
    """W_b^T X_b and W_b^T W_b (X_b dense or CSR)."""
    return np.asarray((X_b.T @ W_b).T), W_b.T @ W_b


def projected_step(F, gradient, lipschitz):
    return np.maximum(F - gradient / max(lipschitz, np.finfo(float).tiny), 0.0)


# -- method ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ProjectedGradientNMF:
    n_components: int
    tol: float

    def _global(self, H):
        HHt = H @ H.T
        return {"H": H, "HHt": HHt, "L": float(np.linalg.norm(HHt, 2))}

    def initial_global(self, data, rng):
        scale = np.sqrt(data.group_totals.sum() / np.prod(data.shape) / self.n_components)
        return {**self._global(scale * np.abs(rng.standard_normal((self.n_components, data.shape[1])))),
                "scale": scale}

    def initial_local(self, block, G, rows):
        return G["scale"] * np.abs(rows.standard_normal(self.n_components))

    def block_stats(self, X_b, W_b, block, G):
        WtX, WtW = gram_stats(X_b, W_b)
        return {"WtX": WtX, "WtW": WtW}

    def local_step(self, X_b, W_b, block, G):
        W_new = projected_step(W_b, W_b @ G["HHt"] - np.asarray(X_b @ G["H"].T), G["L"])
        return W_new, self.block_stats(X_b, W_new, block, G)

    def global_step(self, G, stats, data):
        WtX, WtW = sum(s["WtX"] for s in stats), sum(s["WtW"] for s in stats)
        H = projected_step(G["H"], WtW @ G["H"] - WtX, np.linalg.norm(WtW, 2))
        return {**self._global(H), "scale": G["scale"]}

    def objective(self, G, stats, data):
        losses = 0.5 * frobenius_sq_errors(data.group_sq_norms, [(s["WtX"], s["WtW"]) for s in stats], G["H"],
                                           G["HHt"])
        return float(losses.sum()), losses

    def converged(self, objectives, group_objectives):
        return len(objectives) > 1 and abs(objectives[-2] - objectives[-1]) <= self.tol * abs(objectives[-2])


# -- estimator -------------------------------------------------------------------------------------
class PGNMF(FactorEstimator):
    """Projected-gradient NMF (a test-only method).

    Parameters
    ----------
    n_components : int
        The rank.
    step : {'lipschitz'}
        The step size rule: 1 / the gradient's Lipschitz constant.
    max_iter : int
        Iterations at most.
    tol : float
        Stop when the objective changes by less than tol relative.
    random_state : int or None
    """

    _fitted_private = ()
    _parameter_constraints = {**SURFACE_CONSTRAINTS, "step": [StrOptions({"lipschitz"})], "max_iter": [COUNT],
                              "tol": [NON_NEGATIVE]}

    def __init__(self, n_components, *, step="lipschitz", max_iter=50, tol=1e-6, random_state=None):
        self.n_components = n_components
        self.step = step
        self.max_iter = max_iter
        self.tol = tol
        self.random_state = random_state

    def fit(self, X, y=None, *, groups=None, client=None):
        data = self._grouped(X, groups)
        method = ProjectedGradientNMF(check_rank(self.n_components, data.shape), float(self.tol))
        executor = self._executor(data, client, method.n_components)
        try:
            state = run_loop(method, data, executor, max_iter=self.max_iter,
                             start=lambda: initialise(method, data, executor, self.random_state))
        finally:
            executor.close()
        self.components_ = state.global_state["H"]
        self._set_run_facts(method, data, state, executor)
        self.group_names_ = data.group_names
        self.objective_history_ = np.asarray(state.objectives)
        losses = state.group_objectives[-1]
        errors = np.sqrt(2 * losses / data.group_sq_norms)
        self.group_metrics_ = pd.DataFrame({
            "group": [*data.group_names, *data.group_names],
            "metric": ["relative_error"] * len(losses) + ["objective"] * len(losses),
            "value": np.concatenate([errors, losses])})
        return self


register_estimators(PGNMF)  # so that distfact.load reads its saved models back

# -- declaration -----------------------------------------------------------------------------------
DECLARATION = register(MethodDeclaration(name="pg-nmf", estimator=PGNMF, summary="projected-gradient NMF (tests)",
                                         metrics=("relative_error", "objective")))
