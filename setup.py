"""The build step that compiles distfact's numba kernels into the wheel (everything else is in pyproject.toml).

``pip install .`` builds the wheel on the machine it installs on; after copying the package, the build runs
``python -m distfact.warmup`` on the copy (distfact/warmup.py; a process per core), so the wheel carries numba's
cache of every kernel signature the methods' fits use, beside the kernels' sources. A fresh installation's first fit then
loads its kernels instead of compiling them. The warm-up needs distfact's dependencies in the build
environment (``setup_requires``, from pyproject.toml). If it fails, the build goes on without the cache and
the kernels compile on first use, as they would without this step (``distfact warmup`` makes the cache later).
An editable install has no build copy: its kernels compile into the source tree on first use.
"""

import glob
import os
import subprocess
import sys
import tempfile
import tomllib

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildWithKernelCache(build_py):
    def run(self):
        super().run()
        if self.editable_mode:
            return
        package = os.path.join(os.path.abspath(self.build_lib), "distfact")
        for stale in glob.glob(os.path.join(package, "**", "__pycache__", "*.nb[ic]"), recursive=True):
            os.remove(stale)  # left by an earlier build in the same build directory
        env = {key: value for key, value in os.environ.items() if key != "NUMBA_CACHE_DIR"}  # the cache goes in-tree
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (os.path.dirname(package), env.get("PYTHONPATH"))))
        env["PYTHONDONTWRITEBYTECODE"] = "1"  # the wheel carries the kernels' cache, not this interpreter's .pyc
        with tempfile.TemporaryDirectory() as cwd:  # not the source tree, whose distfact would come first on the path
            done = subprocess.run([sys.executable, "-m", "distfact.warmup"], cwd=cwd, env=env).returncode == 0
        if not done:
            print("distfact: compiling the numba kernels failed; they will compile on first use", file=sys.stderr)


with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "pyproject.toml"), "rb") as f:
    DEPENDENCIES = tomllib.load(f)["project"]["dependencies"]

setup(cmdclass={"build_py": BuildWithKernelCache}, setup_requires=DEPENDENCIES)
