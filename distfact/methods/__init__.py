"""One module per method: local step, statistics, global step, objective, stopping rule."""
