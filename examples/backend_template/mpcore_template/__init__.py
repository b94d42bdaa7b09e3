"""mpcore_template: an out-of-tree mpcore backend, as a starting point for your own.

mpcore finds this package through its entry point (``[project.entry-points.mpcore] template =
"mpcore_template"`` in pyproject.toml), imports it, and calls the hook below. Importing must be
cheap: no device is opened and nothing is compiled until the backend is first used.
"""

from __future__ import annotations

import mpcore

from .backend import TemplateBackend, template_device
from .rules import template_policy_support

__all__ = ["TemplateBackend", "template_device", "template_policy_support"]


@mpcore.hookimpl
def mpcore_backends() -> list[mpcore.Backend]:
    return [TemplateBackend()]
