"""Print the defaults table of docs/fairer-nmf.md (about a minute on 2 cores):

    python docs/figures/make_fairer_defaults_table.py

``FairerNMF(r, random_state=0)`` and ``NMF(r, random_state=0)``, nothing else set, on the paper's Table 1 data and on
UCI Heart Disease by sex, ranks 3 to 10: the worst group's R-Loss of each (both with Fairer-NMF's E_l, recomputed
from W and H), Fairer-NMF's iterations and passes, whether every E_l run and the scheme converged, and its seconds.
The same fits as tests/test_fairer_nmf.py::test_defaults_reproduce_the_paper.
"""

import time
import warnings

import numpy as np
from sklearn.exceptions import ConvergenceWarning

import distfact
from distfact.datasets import load_heart_disease, make_fairer_synthetic


def worst_r_loss(X, groups, W, H, names, E):
    return max((np.linalg.norm(X[groups == n] - W[groups == n] @ H) - e) / np.linalg.norm(X[groups == n])
               for n, e in zip(names, E))


def rows(X, groups):
    for r in range(3, 11):
        start = time.perf_counter()
        fair = distfact.FairerNMF(r, random_state=0)
        W_fair = fair.fit_transform(X, groups=groups)
        seconds = time.perf_counter() - start
        standard = distfact.NMF(r, random_state=0)
        W_standard = standard.fit_transform(X, groups=groups)
        yield (r, worst_r_loss(X, groups, W_fair, fair.components_, fair.group_names_, fair.E_),
               worst_r_loss(X, groups, W_standard, standard.components_, fair.group_names_, fair.E_),
               fair.n_iter_, fair.n_passes_, bool(fair.E_converged_.all()), fair.converged_, seconds)


if __name__ == "__main__":
    warnings.simplefilter("ignore", ConvergenceWarning)  # standard NMF's default stops at max_iter=200
    heart, heart_groups, _ = load_heart_disease()
    print("| data | rank | Fairer-NMF worst R-Loss | NMF worst R-Loss | iterations | passes | E_l converged "
          "| eq. (10) met | seconds |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, (X, groups) in (("Table 1", make_fairer_synthetic(0)), ("Heart Disease", (heart, heart_groups))):
        for r, fairer, std, n_iter, passes, estimated, converged, seconds in rows(X, groups):
            print(f"| {name} | {r} | {fairer:.4f} | {std:.4f} | {n_iter:,} | {passes:,} | "
                  f"{'yes' if estimated else 'no'} | {'yes' if converged else 'no'} | {seconds:.1f} |")
