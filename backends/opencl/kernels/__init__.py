"""The OpenCL C sources of the OpenCL backend (package data, read by mpcore_opencl.programs);
a package so that setuptools installs them as one."""
