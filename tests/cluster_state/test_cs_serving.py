"""Serving the store: the cluster file's ``[state_machine]`` table and ``grpc_address``,
``sdpaxos cluster init --gpu-store | --gpu-config``, and a local cluster brought up with it
answering ``sdpaxos ctl --config``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.cli import main
from cluster_state.config import load_config, synthetic_config
from cluster_state.plugin import gpu_config_path, store_cluster_toml
from consensus.errors import ConfigError
from consensus.runtime.cli import cluster_toml
from consensus.runtime.cluster_config import load_cluster_config
from consensus.runtime.local_cluster import free_base_port

BASE = cluster_toml(3, 7000, wan=False)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cluster.toml"
    path.write_text(text)
    return path


def test_the_state_machine_table_is_validated(tmp_path: Path) -> None:
    assert load_cluster_config(write(tmp_path, BASE)).state_machine == "kv"
    config = load_cluster_config(write(tmp_path, store_cluster_toml(3, 7000, wan=False,
                                                                    gpu_config="sub/gpu.yaml")))
    assert config.state_machine == "cluster_state"
    assert gpu_config_path(config) == tmp_path / "sub" / "gpu.yaml"  # relative to the file
    assert [r.grpc_address for r in config.replicas] == [("127.0.0.1", 7300 + i)
                                                         for i in range(3)]
    absolute = "/srv/gpu.yaml"
    text = BASE + f'\n[state_machine]\nkind = "cluster_state"\ngpu_config = "{absolute}"\n'
    assert gpu_config_path(load_cluster_config(write(tmp_path, text))) == Path(absolute)
    cases = [
        ('[state_machine]\nkind = "etcd"', 'kind must be "kv" or "cluster_state"'),
        ('[state_machine]\nkind = "cluster_state"', "gpu_config (the GPU cluster YAML file)"),
        ('[state_machine]\nkind = "cluster_state"\ngpu_config = 7', "gpu_config"),
        ('[state_machine]\ngpu_config = "gpu.yaml"', 'only for kind = "cluster_state"'),
        ('[state_machine]\nkind = "kv"\nhosts = 3', "unknown keys ['hosts']"),
        ("state_machine = 3", "[state_machine] must be a table"),
    ]
    for table, message in cases:
        with pytest.raises(ConfigError, match=r"cluster\.toml: ") as caught:
            load_cluster_config(write(tmp_path, table + "\n" + BASE
                                      if table.startswith("state_machine") else
                                      BASE + "\n" + table + "\n"))
        assert message in str(caught.value)
    with_grpc = BASE.replace('site = "CA"', 'grpc_address = "127.0.0.1:7300"\nsite = "CA"')
    with pytest.raises(ConfigError, match='needs \\[state_machine\\] kind = "cluster_state"'):
        load_cluster_config(write(tmp_path, with_grpc))
    store = '\n[state_machine]\nkind = "cluster_state"\ngpu_config = "g.yaml"\n'
    for address, message in (("7300", "expected host:port"),
                             ("127.0.0.1:7100", "is used twice")):
        text = BASE.replace('site = "CA"', f'grpc_address = "{address}"\nsite = "CA"') + store
        with pytest.raises(ConfigError, match=message):
            load_cluster_config(write(tmp_path, text))


def test_cluster_init_writes_a_store_serving_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["cluster", "init", "--dir", str(tmp_path / "a"), "--gpu-store"]) == 0
    assert "sdpaxos ctl --config" in capsys.readouterr().out
    config = load_cluster_config(tmp_path / "a" / "cluster.toml")
    assert config.state_machine == "cluster_state"
    assert len(load_config(gpu_config_path(config)).virtual_clusters) == 4
    assert all(r.grpc_address is not None for r in config.replicas)

    mine = tmp_path / "mine.yaml"
    mine.write_text(synthetic_config(nodes=16, vcs=2).to_yaml())
    assert main(["cluster", "init", "--dir", str(tmp_path / "b"), "--replicas", "5",
                 "--gpu-config", str(mine)]) == 0
    config = load_cluster_config(tmp_path / "b" / "cluster.toml")
    assert gpu_config_path(config) == mine.resolve() and len(config.replicas) == 5

    (tmp_path / "broken.yaml").write_text("virtualClusters: {}\n")
    capsys.readouterr()
    assert main(["cluster", "init", "--dir", str(tmp_path / "c"), "--gpu-config",
                 str(tmp_path / "broken.yaml")]) == 2
    assert "broken.yaml" in capsys.readouterr().err
    assert not (tmp_path / "c" / "cluster.toml").exists()
    with pytest.raises(SystemExit):  # one or the other
        main(["cluster", "init", "--dir", str(tmp_path / "d"), "--gpu-store",
              "--gpu-config", str(mine)])


def test_serve_refuses_a_bad_gpu_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = BASE + '\n[state_machine]\nkind = "cluster_state"\ngpu_config = "missing.yaml"\n'
    path = write(tmp_path, text)
    assert main(["serve", "--config", str(path), "--id", "0"]) == 2
    err = capsys.readouterr().err
    assert "sdpaxos serve:" in err and "missing.yaml" in err


@pytest.mark.timeout(120)
def test_a_local_cluster_serving_the_store_is_one_command_away(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = str(tmp_path / "c")
    assert main(["cluster", "init", "--dir", directory, "--gpu-store", "--no-wan",
                 "--base-port", str(free_base_port())]) == 0
    config = str(tmp_path / "c" / "cluster.toml")
    assert main(["cluster", "up", "--dir", directory, "--timeout", "60"]) == 0
    try:
        capsys.readouterr()
        assert main(["ctl", "--config", config, "--json", "submit", "job", "--vc", "vc01",
                     "--priority", "10", "--pods", "2x4"]) == 0
        placed = json.loads(capsys.readouterr().out)
        assert placed["placed"] == "job" and len(placed["pods"]) == 2
        assert main(["ctl", "--config", config, "--json", "vc", "vc01"]) == 0
        assert json.loads(capsys.readouterr().out)["leaves"]["used"] == 8
        assert main(["ctl", "--config", config, "--json", "watch", "--count", "1"]) == 0
        event = json.loads(capsys.readouterr().out)
        assert (event["kind"], event["subject"], event["revision"]) == (
            "placed", "job", placed["token"])
    finally:
        assert main(["cluster", "down", "--dir", directory]) == 0
