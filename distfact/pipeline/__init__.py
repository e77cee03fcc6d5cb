"""Declarative nightly pipelines: a TOML spec run as ingest -> fit -> evaluate -> report -> publish."""

from .run import STAGES, RunLocked, StageFailed, run_pipeline
from .spec import SpecError, load_spec

__all__ = ["STAGES", "RunLocked", "SpecError", "StageFailed", "load_spec", "run_pipeline"]
