"""A [[fit]] table with ``ranks = "auto"``: the fit stage chooses its rank with ``distfact.select_rank`` (masked
cross-validation, the spec's [select] settings), writes the selection beside the fit, then fits the chosen rank
as any fit of a fixed rank (``run.py: _fit_one``, with its checkpoints)."""

from __future__ import annotations

import os
import time

from ..engine.progress import show_iterations
from ..estimators.select import select_rank
from ..registry import get_method
from ..reports.selection import SELECTION_JSON, read_selection, write_selection


def selected_rank(fit, name: str, data, directory: str, client, spec, log) -> int:
    """The rank ``select_rank`` chooses for ``fit`` (its ``select`` settings; each model is the fit's estimator
    with its parameters and ``seed``), its table and choice written into ``directory`` (``selection.csv``, then
    ``selection.json``, last). A fit stage resumed after a kill finds a complete selection there and reuses it (the
    selection is a sweep, which writes no checkpoints: interrupted before its end, it runs again)."""
    if os.path.isfile(os.path.join(directory, SELECTION_JSON)):
        result, _ = read_selection(directory)
        log("fit", "skip-select", fit=name, rank=result.rank_, reason="selected before the interruption")
        return result.rank_
    settings = fit.select
    declaration = get_method(fit.method)
    ranks = settings["ranks"]
    template = declaration.make(ranks[0], fit.params, random_state=fit.seed)
    progress = show_iterations(template, f"{name}: selecting among ranks {ranks[0]}..{ranks[-1]} x "
                                         f"{settings['n_splits']} folds: iteration",
                               **log.progress_options("fit", fit=name))
    arguments = declaration.fit_arguments(template, {**fit.inputs, **spec.input_files(fit)}, data, client)
    started = time.perf_counter()
    result = select_rank(template, data, ranks=ranks, n_splits=settings["n_splits"], holdout=settings["holdout"],
                         random_state=settings["random_state"], rule=settings["rule"], fit=settings["fit"],
                         **arguments)
    seconds = time.perf_counter() - started
    if progress is not None:
        progress.close()
    write_selection(directory, result, settings)
    log("fit", "select-done", fit=name, rank=result.rank_, rule=result.rule, choices=result.choices,
        seconds=round(seconds, 3))
    return result.rank_
