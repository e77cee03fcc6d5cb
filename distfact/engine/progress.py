"""Progress display for long fits (the CLI's bar; any callback works in the library)."""

from __future__ import annotations

from tqdm.auto import tqdm


class ProgressBar:
    """A per-iteration callback drawing a tqdm bar with the current loss."""

    def __init__(self, max_iter: int, desc: str = "fit", disable: bool | None = None):
        self.bar = tqdm(total=max_iter, desc=desc, unit="it", disable=disable, leave=True)

    def __call__(self, info) -> None:
        self.bar.update(info.iteration - self.bar.n)
        self.bar.set_postfix(loss=f"{info.objective:.5g}", passes=info.n_passes, refresh=False)

    def close(self) -> None:
        self.bar.close()
