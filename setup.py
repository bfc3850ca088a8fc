"""Build script: compiles the native kernels in ``native/``.

Every ``native/<name>.pyx`` becomes the Cython module ``pyspark_cq._<name>`` and every
``native/<name>.cpp`` that defines ``PYBIND11_MODULE`` becomes the pybind11 module
``pyspark_cq._<name>``. Package metadata lives in ``pyproject.toml``.
"""
import os
import re
import sys
from pathlib import Path

import numpy
from Cython.Build import cythonize
from pybind11.setup_helpers import Pybind11Extension
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).parent
NATIVE = HERE / "native"

# -O3 and no -march=native: wheels must run on any x86-64 / aarch64 machine of a cluster.
CFLAGS = ["-O3"] if sys.platform != "win32" else ["/O2"]


def cython_extensions():
    """Every ``native/<name>.pyx`` as the Cython extension ``pyspark_cq._<name>``."""
    exts = []
    for pyx in sorted(NATIVE.glob("*.pyx")):
        exts.append(
            Extension(
                f"pyspark_cq._{pyx.stem}",
                [os.path.relpath(pyx, HERE)],
                include_dirs=[numpy.get_include(), str(NATIVE)],
                define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
                extra_compile_args=CFLAGS,
            )
        )
    return cythonize(exts, language_level=3, compiler_directives={"boundscheck": False, "wraparound": False})


def pybind_extensions():
    """Every ``native/<name>.cpp`` with a ``PYBIND11_MODULE`` as the extension ``pyspark_cq._<name>``."""
    exts = []
    for cpp in sorted(NATIVE.glob("*.cpp")):
        if not re.search(r"PYBIND11_MODULE\s*\(", cpp.read_text()):
            continue
        exts.append(
            Pybind11Extension(
                f"pyspark_cq._{cpp.stem}",
                [os.path.relpath(cpp, HERE)],
                include_dirs=[str(NATIVE)],
                cxx_std=17,
                extra_compile_args=CFLAGS,
            )
        )
    return exts


class ParallelBuildExt(build_ext):
    """``build_ext`` that compiles the extensions concurrently, one per core, unless ``--parallel``/``-j`` says."""

    def finalize_options(self):
        """Default ``parallel`` to the number of cores."""
        super().finalize_options()
        # each extension is one translation unit of 10-60 s; serially the install takes minutes
        if self.parallel is None:
            self.parallel = os.cpu_count() or 1


setup(ext_modules=cython_extensions() + pybind_extensions(), cmdclass={"build_ext": ParallelBuildExt})
