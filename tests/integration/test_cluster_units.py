"""The cluster's pieces that need no second process: per-process slices, device sets, messages."""

from __future__ import annotations

import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import shardlab
from shardlab.cluster.manager import ClusterError, ProcessDied, clean_stdout, device_sets
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
