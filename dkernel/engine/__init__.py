"""The distributed engine: cluster connection, the coordinator loop, checkpoints, progress."""

from dkernel.engine.cluster import connect, local_cluster, workers_info
from dkernel.engine.guard import DivergenceError, FitQualityWarning
from dkernel.engine.loop import Engine, EngineOptions, tree_sum
from dkernel.engine.program import StepProgram
from dkernel.engine.stall import WorkersPaused

__all__ = ["connect", "local_cluster", "DivergenceError", "Engine", "EngineOptions",
           "FitQualityWarning",
           "StepProgram", "WorkersPaused", "tree_sum", "workers_info"]
