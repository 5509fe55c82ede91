"""Build the C++ core (reducer._core).

Everything in csrc/ is compiled into one extension module for baseline x86-64
(no host-specific -march flag): the SIMD kernels are compiled per target with
function attributes and picked at run time (see csrc/kernels/dispatch.cc).
"""
from glob import glob

from pybind11.setup_helpers import ParallelCompile, Pybind11Extension, build_ext
from setuptools import setup

# Compile the sources in parallel (RS_BUILD_JOBS, default: every CPU).
ParallelCompile("RS_BUILD_JOBS").install()

# csrc/fuzz holds the libFuzzer targets (scripts/fuzz.sh builds them), not part of the module.
sources = sorted(src for src in glob("csrc/**/*.cc", recursive=True) if not src.startswith("csrc/fuzz/"))

ext = Pybind11Extension(
    "reducer._core",
    sources,
    include_dirs=["csrc"],
    cxx_std=17,
    extra_compile_args=["-O3", "-fvisibility=hidden", "-Wall", "-Wextra", "-Wno-unused-parameter"],
    extra_link_args=["-pthread"],
)

setup(ext_modules=[ext], cmdclass={"build_ext": build_ext})
