"""The cluster's pieces that need no second process: per-process slices, device sets, messages,
leftover folders."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import shardlab
from shardlab.cluster import manager
from shardlab.cluster.manager import ClusterError, ProcessDied, clean_stdout, device_sets
from shardlab.cluster.watched import remove_if_owned
from shardlab.data import process_slice


def test_one_process_reads_everything_once():
    mesh = shardlab.mesh(data=2, model=4)
    data = np.arange(64 * 8, dtype=np.float32).reshape(64, 8)
    reads = []

    def load(index):
        reads.append(index)
        return data[index]

    array = shardlab.data.shard(load, mesh, P("data", "model"), shape=data.shape)
    assert reads == [(slice(0, 64), slice(0, 8))]
    np.testing.assert_array_equal(np.asarray(array), data)
    assert array.sharding.spec == P("data", "model")


def test_array_like_sources_are_indexed_not_loaded(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, np.ones((16, 4), np.float32))
    mesh = shardlab.mesh(data=8)
    array = shardlab.data.shard(np.load(path, mmap_mode="r"), mesh, P("data"))
    assert array.shape == (16, 4) and float(array.sum()) == 64.0


def test_slices_of_another_process_and_errors():
    mesh = shardlab.mesh(data=2, model=4)
    assert process_slice(mesh, P("data"), (64, 8)) == (slice(0, 64), slice(0, 8))
    with pytest.raises(ValueError, match="holds no device"):
        process_slice(mesh, P("data"), (64, 8), process_index=1)
    with pytest.raises(ValueError, match="give shape="):
        shardlab.data.shard(lambda index: None, mesh, P("data"))
    with pytest.raises(ValueError, match=r"returned shape \(3,\); this process's block"):
        shardlab.data.shard(lambda index: np.ones(3), mesh, P("data"), shape=(8,))


def test_device_sets():
    assert device_sets(2, devices_per_process=4) == ["cpu:4", "cpu:4"]
    assert device_sets(2, gpus="0,1,2,3") == ["gpu:0,1", "gpu:2,3"]
    assert device_sets(3, gpus="per-process") == ["gpu:0", "gpu:1", "gpu:2"]
    with pytest.raises(ClusterError, match="do not split evenly over 2"):
        device_sets(2, gpus="0,1,2")
    with pytest.raises(ClusterError, match="not both"):
        device_sets(2, devices_per_process=4, gpus="0,1")


def test_messages():
    died = ProcessDied(1, -9)
    assert str(died) == (
        "process 1 died (killed by SIGKILL); the cluster is stopped; `%cluster restart`"
    )
    noisy = "[Gloo] Rank 3 is connected to 7 peer ranks. Expected number of connected peer ranks is : 7\nloss 1.0\n"
    assert clean_stdout(noisy) == "loss 1.0\n"


def _folder(root, name: str, owner: dict | None) -> str:
    path = root / f"{manager.FOLDER_PREFIX}{name}"
    (path / "security").mkdir(parents=True)
    (path / "security" / "ipcontroller-engine.json").write_text('{"key": "secret"}')
    if owner is not None:
        (path / manager.OWNER_FILE).write_text(json.dumps(owner))
    return str(path)


def test_leftover_folders_of_gone_kernels_are_swept(tmp_path, monkeypatch):
    """What a killed kernel leaves (its cluster's keys) goes when the next kernel or cluster
    starts; folders of running kernels, young unowned folders and links stay."""
    import psutil

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone_started = psutil.Process(gone.pid).create_time()
    gone.wait()
    me = psutil.Process()
    dead = _folder(tmp_path, "dead", {"pid": gone.pid, "started": gone_started})
    reused = _folder(tmp_path, "reused", {"pid": me.pid, "started": me.create_time() - 100})
    live = _folder(tmp_path, "live", {"pid": me.pid, "started": me.create_time()})
    _folder(tmp_path, "young", None)
    old = _folder(tmp_path, "old", None)
    day_ago = time.time() - manager.UNOWNED_AGE_S - 60
    os.utime(old, (day_ago, day_ago))
    (tmp_path / f"{manager.FOLDER_PREFIX}link").symlink_to(live)
    other = tmp_path / "not-a-cluster"
    other.mkdir()
    removed = manager.sweep_leftovers(str(tmp_path))
    assert sorted(removed) == sorted([dead, reused, old])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"{manager.FOLDER_PREFIX}{n}" for n in ("live", "young", "link")] + ["not-a-cluster"]
    )
    monkeypatch.setattr(manager.tempfile, "tempdir", str(tmp_path))
    made = manager.make_folder()  # what a cluster start makes: owned by this process
    assert manager.folder_owner_alive(made) is True
    assert manager.sweep_leftovers() == []


def test_a_cluster_process_removes_only_its_dead_parents_folder(tmp_path):
    folder = _folder(tmp_path, "x", {"pid": 12345, "started": 0.0})
    assert not remove_if_owned(folder, 54321)  # another kernel's folder
    assert not remove_if_owned(str(tmp_path / "missing"), 12345)
    assert os.path.isdir(folder)
    assert remove_if_owned(folder, 12345)
    assert not os.path.exists(folder)
