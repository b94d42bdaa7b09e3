"""Models: ``mp.Model`` (functional or subclassed) and ``mp.Sequential``."""

from mpcore.models.model import Model
from mpcore.models.sequential import Sequential

__all__ = ["Model", "Sequential"]
