"""The distributed engine: cluster connection, the coordinator loop, checkpoints, progress."""

from dkernel.engine.cluster import connect
from dkernel.engine.loop import Engine, EngineOptions, tree_sum
from dkernel.engine.program import StepProgram

__all__ = ["connect", "Engine", "EngineOptions", "StepProgram", "tree_sum"]
