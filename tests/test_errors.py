"""The exception hierarchies drawn in ``consensus.errors`` and ``cluster_state.errors`` name
every exception of their packages, wherever it is defined, and no exception name of the two
packages means two things."""

from __future__ import annotations

import collections
import importlib
import inspect
import pkgutil
from types import ModuleType

import pytest

import cluster_state
import cluster_state.errors
import consensus
import consensus.errors

PACKAGES = (consensus, cluster_state)


def exceptions() -> list[type[BaseException]]:
    """Every exception class defined in a module of either package (all imported)."""
    found = []
    for package in PACKAGES:
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            module = importlib.import_module(info.name)
            found += [value for value in vars(module).values()
                      if inspect.isclass(value) and issubclass(value, BaseException)
                      and value.__module__ == module.__name__]
    return found


@pytest.mark.parametrize(("errors", "root"), [
    (consensus.errors, consensus.errors.SDPaxosError),
    (cluster_state.errors, cluster_state.errors.ClusterStateError),
])
def test_each_drawn_tree_names_every_exception_of_its_hierarchy(
    errors: ModuleType, root: type[BaseException],
) -> None:
    tree = (errors.__doc__ or "").split("::", 1)[1].split("\n\n", 2)[1]
    drawn = {line.split("── ", 1)[1].split()[0] for line in tree.splitlines() if "── " in line}
    # (a private class never leaves its module: the codec's walk raises and catches its own)
    assert drawn == {cls.__name__ for cls in exceptions() if issubclass(cls, root)
                     and cls is not root and not cls.__name__.startswith("_")}


def test_no_exception_name_means_two_things() -> None:
    counts = collections.Counter(cls.__name__ for cls in exceptions())
    assert [name for name, count in counts.items() if count > 1] == []
