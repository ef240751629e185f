"""The extender tests' ``setup`` fixture: an extender (its pod cache synced, served over
HTTP), its reaper and a node watcher on an in-process store behind a fake API server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from cluster_state.k8s.extender import Extender, GangReaper
from cluster_state.k8s.kube import KubeApi
from cluster_state.k8s.nodes import NodeWatcher
from cluster_state.k8s.pods import PodCache
from cluster_state.k8s.web import serve

from .test_extender_phases import NODES, Setup


@pytest.fixture
async def setup() -> AsyncIterator[Setup]:
    s = Setup()
    await s.api.start()
    for node in NODES:
        s.api.set_node(node, True)
    kube = KubeApi(s.api.url)
    s.pods = PodCache(kube)
    s.tasks = [asyncio.create_task(s.pods.run())]
    await asyncio.wait_for(s.pods.synced.wait(), 10)
    s.extender = Extender(s.client, kube, s.pods)
    server = await serve(s.extender.handle, "127.0.0.1", 0)
    s.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    s.reaper = GangReaper(s.client, kube, s.pods)
    s.nodes = NodeWatcher(s.client, kube)
    s.tasks += [asyncio.create_task(s.reaper.run()), asyncio.create_task(s.nodes.run())]
    yield s
    for task in s.tasks:
        task.cancel()
    await asyncio.gather(*s.tasks, return_exceptions=True)
    await kube.close()
    await server.stop()
    await s.api.stop()
