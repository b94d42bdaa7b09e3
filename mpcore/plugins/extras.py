"""How to install mpcore or one of its optional extras, said the same way in every message, and
which version is installed.

mpcore is on no package index, so installing it by name would fail: it and its extras are
installed from the checkout (or from a wheel built there, as the README says).

>>> install_command("cuda")
'pip install -e ".[cuda]" in the mpcore checkout'
>>> install_command("opencl", "pocl")
'pip install -e ".[opencl,pocl]" in the mpcore checkout'
>>> install_command()
'pip install -e . in the mpcore checkout'
"""

from __future__ import annotations

__all__ = ["install_command", "installed_version"]


def install_command(*extras: str) -> str:
    """The command that installs mpcore with ``extras`` from its checkout."""
    target = f'".[{",".join(extras)}]"' if extras else "."
    return f"pip install -e {target} in the mpcore checkout"


def installed_version() -> str:
    """The installed distribution's version (the metadata pip wrote), as ``pip show`` says."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mpcore")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "(not installed)"
