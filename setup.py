"""Only here to put the pack's build inputs into the wheel (see packaging/sources.py).

Everything else about the package is in pyproject.toml.
"""

import importlib.util
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildPyWithSources(build_py):
    def run(self) -> None:
        super().run()
        spec = importlib.util.spec_from_file_location(
            "piwork_sources", ROOT / "packaging/sources.py"
        )
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        mod.copy_sources(ROOT, Path(self.build_lib) / "piwork" / "_sources")


setup(cmdclass={"build_py": BuildPyWithSources})
