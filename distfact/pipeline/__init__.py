"""Declarative nightly pipelines: a TOML spec run as ingest -> fit -> evaluate -> report -> publish.

The public names are imported when first used (PEP 562, as ``distfact``'s own): the stages import every method and
scikit-learn, which ``distfact runs`` and retention (``nightly.py``, ``alerts.py``) do not need.
"""

import importlib

# public name -> its module in this package
_PUBLIC = {**dict.fromkeys(("STAGES", "RunLocked", "StageFailed", "run_pipeline"), "run"),
           **dict.fromkeys(("SpecError", "load_spec"), "spec")}
MODULES = ("alerts", "nightly", "run", "select", "spec")

__all__ = sorted(_PUBLIC)


def __getattr__(name):
    if name in MODULES:  # ``distfact.pipeline.spec`` as when the package imported its stages at once
        return importlib.import_module(f"{__name__}.{name}")
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_PUBLIC[name]}"), name)
    globals()[name] = value  # looked up once
    return value


def __dir__():
    return sorted({*globals(), *_PUBLIC, *MODULES})
