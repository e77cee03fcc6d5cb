"""The engine: driver loop, passes, fixed-order reduction, checkpoints, scheduler choice.

It knows nothing of any method's mathematics (DESIGN §1, §6)."""

from .checkpoint import Checkpointer, DamagedCheckpointWarning, config_hash
from .driver import BlockSeeds, FitState, IterationInfo, IterativeMethod, fit, initialise
from .executor import make_executor
from .executor.base import WorkerLost
from .executor.distributed import DistributedExecutor
from .executor.inprocess import InProcessExecutor
from .reduce import tree_reduce

__all__ = ["BlockSeeds", "Checkpointer", "DamagedCheckpointWarning", "DistributedExecutor", "FitState",
           "InProcessExecutor", "IterationInfo", "IterativeMethod", "WorkerLost", "config_hash", "fit", "initialise", "make_executor",
           "tree_reduce"]
