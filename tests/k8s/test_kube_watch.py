"""The node watch through ``kubernetes_asyncio`` when its stream breaks, against the fake API
server: a watch the server ends resumes from the last version seen without listing again; a
version compacted away (410 Gone) makes the watcher list again, and a node that changed or
was deleted meanwhile still gets its health; a bookmark moves the resume version on, so a
quiet watch survives a compaction without listing. Also: a kubeconfig's server and token, and
the extender's error when the ``k8s`` extra is not installed."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml
from runtime.polling import wait_until

from cluster_state.client import AllocationStore
from cluster_state.config import load_config
from cluster_state.k8s import cli
from cluster_state.k8s.kube import KubeApi
from cluster_state.k8s.nodes import NodeWatcher
from cluster_state.store import ClusterStore

from .fake_apiserver import FakeApiServer, hived_pod
from .test_extender_phases import GPU_CONFIG, NODES, LocalChannel


class Watching:
    def __init__(self) -> None:
        self.store = ClusterStore(load_config(GPU_CONFIG))
        self.api = FakeApiServer()
        self.client = AllocationStore(LocalChannel(self.store), 1)  # type: ignore[arg-type]

    def bad(self) -> set[str]:
        return set(self.store.allocator.bad_nodes)

    def watches_from(self) -> list[int]:
        """The resource versions the node watches asked to start after, in order."""
        return [int(query.get("resourceVersion") or 0) for method, path, query in
                self.api.requests if path == "/api/v1/nodes" and "watch" in query]


@pytest.fixture
async def w() -> AsyncIterator[Watching]:
    import asyncio

    w = Watching()
    await w.api.start()
    for node in NODES:
        w.api.set_node(node, True)
    kube = KubeApi(w.api.url)
    watcher = NodeWatcher(w.client, kube)
    task = asyncio.create_task(watcher.run())
    await wait_until(lambda: watcher.known == dict.fromkeys(NODES, True),
                     "the watcher reports every listed node")
    await wait_until(lambda: len(w.watches_from()) == 1, "the watcher watches")
    yield w
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await kube.close()
    await w.api.stop()


async def test_a_watch_the_server_ends_resumes_without_listing(w: Watching) -> None:
    assert w.api.lists("nodes") == 1
    seen = w.api.version
    w.api.drop_watches()  # as the API server does at its request timeout
    w.api.set_node("n1", False)
    await wait_until(lambda: w.bad() == {"n1"}, "a change after the drop arrives")
    await wait_until(lambda: len(w.watches_from()) == 2, "the watch was reopened")
    assert w.watches_from() == [seen, seen]  # resumed from the last version it saw
    assert w.api.lists("nodes") == 1  # no listing again


async def test_an_expired_version_lists_again(w: Watching) -> None:
    w.api.hold_watches()  # these two changes never reach the watch...
    w.api.set_node("n1", False)
    w.api.delete_node("n2")
    w.api.compact()  # ...and are compacted away: resuming gets 410 Gone
    await wait_until(lambda: w.bad() == {"n1", "n2"},
                     "listing again finds the NotReady node and misses the deleted one")
    assert w.api.lists("nodes") == 2
    await wait_until(lambda: w.watches_from()[-1] == w.api.compacted,
                     "a new watch starts from the new listing")
    refused = w.watches_from()[1:-1]  # the resumptions from the expired version
    assert refused and all(start < w.api.compacted for start in refused)
    w.api.set_node("n1", True)
    await wait_until(lambda: w.bad() == {"n2"}, "the new watch delivers changes")


async def test_a_bookmark_carries_a_quiet_watch_over_a_compaction(w: Watching) -> None:
    for i in range(3):  # the pods change, the nodes do not: the node watch's version ages
        w.api.add_pod(hived_pod(f"p{i}", vc="vc1", priority=1, leaves=1, group=f"p{i}",
                                members=[(1, 1)]))
    w.api.bookmark("nodes")
    await wait_until(lambda: w.api.bookmarks_sent == 1, "the bookmark went out")
    w.api.compact()
    w.api.set_node("n0", False)
    await wait_until(lambda: w.bad() == {"n0"}, "the resumed watch delivers changes")
    assert w.watches_from()[-1] == w.api.compacted  # resumed from the bookmark's version
    assert w.api.lists("nodes") == 1  # no 410, no listing again


async def test_a_kubeconfig_names_the_server_and_its_token(w: Watching, tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": w.api.url}}],
        "users": [{"name": "me", "user": {"token": "sesame"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "me"}}]}))
    kube = await KubeApi.from_kubeconfig(str(kubeconfig))
    try:
        names = [n["metadata"]["name"] for n in (await kube.list_nodes())["items"]]
    finally:
        await kube.close()
    assert names == list(NODES)
    assert w.api.headers[-1].get("Authorization") == "Bearer sesame"
    with pytest.raises(RuntimeError, match="kubeconfig"):
        await KubeApi.from_kubeconfig(str(tmp_path / "missing"))


def test_the_extender_without_kubernetes_asyncio_says_which_extra(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "kubernetes_asyncio", None)  # as if not installed
    monkeypatch.delitem(sys.modules, "cluster_state.k8s.kube")
    with pytest.raises(ImportError, match=r"sdpaxos\[k8s\]"):
        importlib.import_module("cluster_state.k8s.kube")
    monkeypatch.delitem(sys.modules, "cluster_state.k8s.kube", raising=False)
    args = argparse.Namespace(log_level="warning", config="unused.toml", home=0)
    assert cli.run(args) == 2
    assert "pip install 'sdpaxos[k8s]'" in capsys.readouterr().err
