"""pyproject.toml's dependencies: the benchmarks' own in a ``bench`` extra, which the README's
set-up commands (and CI's ``.[test]``) still install; the replica, the store and their tools
run without it."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
#: the import names of the bench-only distributions (hdrhistogram, matplotlib)
BENCH_MODULES = ("hdrh", "matplotlib")


def names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")
            for requirement in requirements}


def test_bench_only_dependencies_are_an_extra_the_setup_commands_install() -> None:
    core = names(PROJECT["dependencies"])
    extras = PROJECT["optional-dependencies"]
    assert {"hdrhistogram", "matplotlib"} <= names(extras["bench"])
    assert not core & names(extras["bench"]), "bench-only dependencies in the core ones"
    assert "prometheus-client" in core  # /metrics
    assert f"{PROJECT['name']}[bench]" in extras["test"]  # the tests run the benchmarks
    readme = (ROOT / "README.md").read_text()
    setup = readme.split("```bash\n", 1)[1].split("```", 1)[0].strip().splitlines()
    assert all("pip install -e '.[test]'" in command for command in setup)
    assert "pip install -q -e '.[test]'" in (ROOT / ".ci" / "run").read_text()


#: run in a fresh interpreter: the bench-only modules cannot be imported at all
_WITHOUT_BENCH = """
import importlib.abc, sys
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {modules!r}:
            raise ImportError(f"{{name}} is a bench-only dependency")
        return None
sys.meta_path.insert(0, Refuse())
import consensus.runtime.node, consensus.runtime.metrics, cluster_state.plugin
import cluster_state.ctl, cluster_state.grpc_api.service, cluster_state.demo
from bench.cli import main
for verb in ("serve", "cluster", "ctl", "demo", "extender"):
    try:
        main([verb, "--help"])
    except SystemExit as done:
        assert done.code == 0, (verb, done.code)
print("ok")
"""


def test_the_replica_and_its_tools_run_without_the_bench_extra() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_BENCH.format(modules=BENCH_MODULES)],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "ok"
