"""Where distfact's warnings point: at the user's call, however deep in the library they are raised."""

from __future__ import annotations

import functools
import inspect
import os

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


@functools.cache
def passed_through() -> tuple:
    """scikit-learn's set_output wrapper sits between the user and every estimator's transform and fit_transform
    (TransformerMixin puts it there): a warning pointing into it would tell the user nothing either. (Imported
    when a warning is raised, not when distfact is: the command line starts without scikit-learn.)"""
    import sklearn.utils._set_output

    return (os.path.abspath(sklearn.utils._set_output.__file__),)


def user_stacklevel() -> int:
    """The ``stacklevel`` for ``warnings.warn``, called in the function that calls it, that attributes the
    warning to the first frame outside distfact (and scikit-learn's set_output wrapper): the user's call,
    whichever helpers and decorators (``survives_worker_loss``) the warning is raised under. As pandas'
    ``find_stack_level``; a fixed stacklevel breaks whenever a helper is added or moved."""
    frame = inspect.currentframe()
    level = 0
    try:
        while frame is not None and (os.path.abspath(frame.f_code.co_filename).startswith(PACKAGE_DIR)
                                     or os.path.abspath(frame.f_code.co_filename) in passed_through()):
            frame = frame.f_back
            level += 1
    finally:
        del frame  # a frame held in a local makes a reference cycle
    return level
