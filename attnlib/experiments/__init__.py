"""What the labs measure, kept apart from the operators: tasks, timers, fits and counts.
Chapters add their own submodule with one import line below."""

from . import anna

__all__ = ["anna"]
