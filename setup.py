"""The packages of the distribution, found rather than listed: mpcore's, and those of the
plugins that ship with it, found under their folders, whose import names differ from the
folders' (``backends/cpu`` is ``mpcore_cpu``): pyproject.toml's
``[tool.setuptools.packages.find]`` cannot express that, and setuptools ignores setup.py's
packages when it is there. Everything else is in pyproject.toml."""

from setuptools import find_packages, setup

PLUGINS = {
    "mpcore_cpu": "backends/cpu", "mpcore_cuda": "backends/cuda",
    "mpcore_opencl": "backends/opencl", "mpcore_onednn": "backends/onednn",
    "mpcore_onnxruntime": "backends/onnxruntime", "mpcore_xp": "backends/xp",
    "mpcore_mpi": "collectives/mpi", "mpcore_nccl": "collectives/nccl",
}



def packages() -> list[str]:
    found = find_packages(include=["mpcore", "mpcore.*"])
    for name, folder in PLUGINS.items():
        found += [name, *(f"{name}.{sub}" for sub in find_packages(folder))]
    return found


if __name__ == "__main__":   # as setuptools runs it (tests read packages() alone)
    setup(packages=packages(), package_dir={"": ".", **PLUGINS})
