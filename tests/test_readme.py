"""The README: its two set-up commands, and its embedding example, run against a cluster."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

from cluster_state.config import load_config, synthetic_config
from cluster_state.store import ClusterStore
from consensus.runtime.cli import cluster_toml
from consensus.runtime.cluster_config import load_cluster_config
from consensus.runtime.local_cluster import free_base_port
from consensus.runtime.node import ReplicaNode

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def test_the_readme_opens_with_the_demo_and_the_test_command() -> None:
    first_block = README.split("```bash\n", 1)[1].split("```", 1)[0].strip().splitlines()
    assert len(first_block) == 2
    assert first_block[0].endswith("&& sdpaxos demo")
    assert first_block[1].endswith("&& pytest")
    ci = (Path(__file__).resolve().parent.parent / ".ci" / "run").read_text()
    assert "\npytest\n" in ci  # CI runs the README's test command


def test_the_embedding_example_runs(tmp_path: Path) -> None:
    code = re.search(r"<!-- example: embedded -->\n```python\n(.*?)```", README, re.S)
    assert code is not None
    namespace: dict[str, Any] = {}
    exec(compile(code.group(1), "README.md", "exec"), namespace)
    (tmp_path / "gpu.yaml").write_text(synthetic_config(nodes=16, vcs=2, pinned=1).to_yaml())
    text = cluster_toml(3, free_base_port(), wan=False)
    text += '\n[state_machine]\nkind = "cluster_state"\ngpu_config = "gpu.yaml"\n'
    (tmp_path / "cluster.toml").write_text(text)

    async def run() -> int:
        config = load_cluster_config(tmp_path / "cluster.toml")
        others = [
            ReplicaNode(config, i, ClusterStore(load_config(tmp_path / "gpu.yaml")), fsync=False)
            for i in (1, 2)
        ]
        for node in others:
            await node.start()
        try:
            token: int = await namespace["schedule"](str(tmp_path / "cluster.toml"), 0)
            return token
        finally:
            for node in others:
                await node.stop()

    assert asyncio.run(asyncio.wait_for(run(), 60)) >= 0
