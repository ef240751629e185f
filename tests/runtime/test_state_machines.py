"""The state machine registry (``consensus.runtime.state_machines``): kinds found by name
through entry points, the ``[state_machine]`` table judged by the kinds, and ``consensus``
importing nothing of ``cluster_state``."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator, Mapping
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import consensus
from consensus.errors import ConfigError
from consensus.runtime import state_machines
from consensus.runtime.cli import cluster_toml
from consensus.runtime.cluster_config import load_cluster_config
from consensus.runtime.state_machines import (
    ENTRY_POINT_GROUP,
    KV_KIND,
    StateMachineKind,
    kinds,
    parse_state_machine_table,
)
from consensus.statemachine import KVStore

CONSENSUS = Path(consensus.__file__).resolve().parent


def imported_modules(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, module) of every import in ``tree``, also inside functions, and of every
    ``importlib.import_module("...")``/``__import__("...")`` with a literal name."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module
        elif (isinstance(node, ast.Call) and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and ((isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                   or (isinstance(node.func, ast.Name) and node.func.id == "__import__"))):
            yield node.lineno, node.args[0].value


def test_consensus_imports_nothing_of_cluster_state() -> None:
    sources = sorted(CONSENSUS.rglob("*.py"))
    assert len(sources) > 20  # the package, not an empty directory
    found = [
        f"{path.relative_to(CONSENSUS.parent)}:{line}: {module}"
        for path in sources
        for line, module in imported_modules(ast.parse(path.read_text(), str(path)))
        if module == "cluster_state" or module.startswith("cluster_state.")
    ]
    assert found == []


def test_the_scanner_sees_every_form_of_import() -> None:
    code = ("import cluster_state\n"
            "def f():\n    from cluster_state.store import ClusterStore\n"
            "importlib.import_module('cluster_state.plugin')\n")
    assert [m for _, m in imported_modules(ast.parse(code))] == [
        "cluster_state", "cluster_state.store", "cluster_state.plugin"]


def test_both_kinds_are_installed_as_entry_points(tmp_path: Path) -> None:
    # what `pip install -e .` registers from pyproject.toml: kv first (built in)
    assert list(kinds()) == ["kv", "cluster_state"]
    assert kinds()["kv"] is KV_KIND
    from cluster_state.plugin import CLUSTER_STATE

    assert kinds()["cluster_state"] is CLUSTER_STATE
    (tmp_path / "cluster.toml").write_text(cluster_toml(3, 7000, wan=False))
    assert isinstance(KV_KIND.build(load_cluster_config(tmp_path / "cluster.toml")), KVStore)


def test_a_kv_cluster_file_imports_no_other_kind(tmp_path: Path) -> None:
    path = tmp_path / "cluster.toml"
    path.write_text(cluster_toml(3, 7000, wan=False))
    code = ("import sys\nfrom consensus.runtime.cluster_config import load_cluster_config\n"
            f"assert load_cluster_config({str(path)!r}).state_machine == 'kv'\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'cluster_state'))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == "[]"


# ---------------------------------------------------------------- a third kind, installed


class _Echo(StateMachineKind):
    name = "echo"
    option_keys = frozenset({"depth"})
    grpc_service = "the echo service"

    def parse_options(self, table: Mapping[str, Any], base: Path) -> Mapping[str, Any]:
        depth = table.get("depth", 1)
        if not isinstance(depth, int) or depth < 1:
            raise ConfigError("[state_machine].depth must be a positive integer")
        return {"depth": depth}

    def build(self, config: Any) -> KVStore:
        return KVStore()


ECHO = _Echo()
NOT_A_KIND = object()


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[EntryPoint]]:
    """The entry points the registry sees: this project's plus what the test appends."""
    real = list(entry_points(group=ENTRY_POINT_GROUP))
    points = list(real)
    monkeypatch.setattr(state_machines, "entry_points",
                        lambda group: [p for p in points if p.group == group])
    module = ModuleType("_echo_kind")
    module.ECHO = ECHO  # type: ignore[attr-defined]
    module.NOT_A_KIND = NOT_A_KIND  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "_echo_kind", module)
    state_machines._targets.cache_clear()
    state_machines._load.cache_clear()
    yield points
    state_machines._targets.cache_clear()
    state_machines._load.cache_clear()


def point(name: str, value: str) -> EntryPoint:
    return EntryPoint(name=name, value=value, group=ENTRY_POINT_GROUP)


def test_an_installed_kind_is_found_by_name_and_judges_its_keys(
    installed: list[EntryPoint], tmp_path: Path
) -> None:
    installed.append(point("echo", "_echo_kind:ECHO"))
    assert list(kinds()) == ["kv", "cluster_state", "echo"]  # built in, then by name
    assert parse_state_machine_table({"kind": "echo", "depth": 3}, tmp_path) == (
        "echo", {"depth": 3})
    cases: list[tuple[dict[str, Any], str]] = [
        ({"kind": "etcd"}, 'kind must be "kv", "cluster_state" or "echo", got \'etcd\''),
        ({"kind": 7}, "got 7"),
        ({"depth": 2}, '[state_machine].depth is only for kind = "echo"'),
        ({"kind": "echo", "gpu_config": "g.yaml"}, 'gpu_config is only for kind = "cluster_state"'),
        ({"kind": "echo", "hosts": 2}, "[state_machine]: unknown keys ['hosts']"),
        ({"kind": "etcd", "hosts": 2}, "unknown keys ['hosts']"),  # first, as before
        ({"kind": "echo", "depth": 0}, "depth must be a positive integer"),
    ]
    for table, message in cases:
        with pytest.raises(ConfigError) as caught:
            parse_state_machine_table(table, tmp_path)
        assert message in str(caught.value), (table, str(caught.value))
    # with two kinds serving gRPC, a grpc_address under kv names both
    text = cluster_toml(3, 7000, wan=False).replace(
        'site = "CA"', 'grpc_address = "127.0.0.1:7300"\nsite = "CA"')
    (tmp_path / "cluster.toml").write_text(text)
    with pytest.raises(ConfigError, match='serves gRPC: "cluster_state" or "echo"'):
        load_cluster_config(tmp_path / "cluster.toml")
    (tmp_path / "cluster.toml").write_text(text + '\n[state_machine]\nkind = "echo"\n')
    config = load_cluster_config(tmp_path / "cluster.toml")
    assert (config.state_machine, dict(config.state_machine_options)) == ("echo", {"depth": 1})


def test_a_bad_installation_is_a_clear_config_error(installed: list[EntryPoint]) -> None:
    installed.append(point("cluster_state", "_echo_kind:ECHO"))  # a second, different one
    with pytest.raises(ConfigError, match="two state machines are installed as kind"):
        kinds()
    installed.pop()
    state_machines._targets.cache_clear()
    for value, message in (("_echo_kind:NOT_A_KIND", "is not a StateMachineKind"),
                           ("_echo_kind:ECHO", "is not a StateMachineKind named 'other'"),
                           ("_no_such_module:X", "cannot be loaded")):
        installed[:] = [p for p in installed if p.name != "other"] + [point("other", value)]
        state_machines._targets.cache_clear()
        state_machines._load.cache_clear()
        with pytest.raises(ConfigError, match=message):
            state_machines.state_machine_kind("other")
