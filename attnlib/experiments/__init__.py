"""What the labs measure, kept apart from the operators: tasks, timers, fits and counts.
One submodule per subject; chapters add theirs with one import line below."""

from . import anna, grassmann

__all__ = ["anna", "grassmann"]
