"""Build hook: the gRPC stubs are generated from `server/decision.proto` when a wheel is
built, so an installed policyc carries them (in a checkout, `scripts/setup.sh` and
`policyc.server.proto` generate them in place; they are not committed)."""

import importlib.util
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class build_py_with_stubs(build_py):
    def run(self) -> None:
        path = Path(__file__).resolve().parent / "server" / "protogen.py"
        spec = importlib.util.spec_from_file_location("_policyc_protogen", path)
        protogen = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(protogen)
        if not protogen.is_current():
            protogen.generate()
        super().run()


setup(cmdclass={"build_py": build_py_with_stubs})
