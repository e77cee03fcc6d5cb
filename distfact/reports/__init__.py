"""Reports: per-group tables (CSV/JSON), PNG figures and one self-contained HTML page embedding them.

``page.py`` writes the page; one module per paper's views (``fairness.py`` for Fairer-NMF against standard NMF,
``stratified_nmf.py``, ``ssnmf.py``, ``multigroup_svd.py``), ``pipeline.py`` for a pipeline run's report, and
``terminal.py`` for the command line's plain-text tables."""
