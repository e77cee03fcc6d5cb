"""Regenerate the figures of docs/fairer-nmf.md (a few minutes):

    python docs/figures/make_fairer_figures.py
"""

import os
import warnings

from sklearn.exceptions import ConvergenceWarning

from distfact.datasets import load_heart_disease, make_fairer_synthetic
from distfact.reports.fairness import fairness_table, write_fairness_report

HERE = os.path.dirname(os.path.abspath(__file__))


def publish(rows, name, title):
    """The figures and the CSV; the HTML page and JSON would repeat them in the repository."""
    paths = write_fairness_report(rows, os.path.join(HERE, name), title=title)
    os.remove(paths["html"])
    os.remove(paths["json"])

if __name__ == "__main__":
    warnings.simplefilter("ignore", ConvergenceWarning)
    X, groups = make_fairer_synthetic(0)
    for solver in ("mu", "am"):
        rows = fairness_table(X, groups, ranks=range(1, 11), solver=solver, random_state=0)
        publish(rows, f"fairer-synthetic-{solver}", f"Fairer-NMF ({solver.upper()}) on the paper's synthetic data")
    X, groups, _ = load_heart_disease()
    rows = fairness_table(X, groups, ranks=range(1, 11), random_state=0)
    publish(rows, "fairer-heart-mu", "Fairer-NMF (MU) on UCI Heart Disease (Cleveland), groups by sex")
