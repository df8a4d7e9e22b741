"""The cluster's pieces that need no JAX cluster: per-process slices, device sets, messages,
leftover folders, heartbeats and who is to blame when a process hangs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import shardlab
from shardlab.cluster import manager
from shardlab.cluster.health import Heartbeats, Verdict, blame, read_jax_abort
from shardlab.cluster.manager import (
    ClusterError,
    ProcessDied,
    ProcessHung,
    clean_stdout,
    device_sets,
)
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


ABORT = -int(signal.SIGABRT)
KILL = -int(signal.SIGKILL)
# What process 0 of a 2-process cluster logged (JAX 0.10) when JAX's coordination service,
# which it hosts, found process 1 stopped (SIGSTOP) and aborted it.
JAX_ABORT_LOG = textwrap.dedent(
    """\
    E1208 00:11:05.863934    4283 coordination_service.cc:1549] [15992074106899096640] Use error polling to propagate the following error to all tasks: UNAVAILABLE: The following tasks are unhealthy (stopped sending heartbeats):
    1
    The tasks have crashed. Check the task logs for an earlier error, or scheduler events (e.g. preemption, eviction) to debug further. [type.googleapis.com/tensorflow.CoordinationServiceError='']
    E1208 00:11:05.864879    4294 coordination_service_agent.cc:289] Polled an error from coordination service (this can be an error from this or another task).
    F1208 00:11:05.865007    4294 client.h:80] Terminating process because the JAX distributed service detected fatal errors. This most likely indicates that another task died; see the other task logs for more details.
    RPC: /xla.coordination.CoordinationService/PollForError [type.googleapis.com/tensorflow.CoordinationServiceError='']
    *** Check failure stack trace: ***
        @     0x7fd26fc40634  absl::lts_20260107::log_internal::LogMessage::SendToLog()
    """
)


def test_the_first_to_stop_answering_is_blamed_not_the_processes_jax_aborted():
    limits = {"hang_after_s": 4.0, "evidence_s": 1.0}
    # nothing wrong: every engine answers
    assert blame({}, [0.0, 0.1, 0.2], **limits) is None
    # an idle or busy engine silent for the heartbeat timeout is hung, whichever it is
    assert blame({}, [0.0, 0.1, 4.2], **limits) == Verdict(2, True, 4.2)
    assert blame({}, [4.5, 0.1, 4.2], **limits) == Verdict(0, True, 4.5)
    # process 1 stopped answering; JAX's runtime then aborted process 0: 1 is the culprit
    aborted, named = read_jax_abort(JAX_ABORT_LOG)
    assert aborted and named == {1}
    assert blame({0: ABORT}, [0.0, 2.9], **limits, aborted_by_jax=frozenset({0})) == Verdict(
        1, True, 2.9, (0,)
    )
    # the same from the silence alone (a log that says nothing) and from the log alone
    assert blame({0: ABORT}, [0.0, 2.9], **limits) == Verdict(1, True, 2.9, (0,))
    assert blame(
        {0: ABORT}, [0.0, 0.2], **limits, aborted_by_jax=frozenset({0}), named_by_jax=frozenset({1})
    ) == Verdict(1, True, 0.2, (0,))
    # the coordinator (0) hung: 1 and 2 were aborted, whatever order they are seen in
    assert blame({2: ABORT, 1: ABORT}, [3.8, 0.0, 0.0], **limits) == Verdict(0, True, 3.8, (1, 2))
    # two quiet engines: the one silent longer stopped first
    assert blame({0: ABORT}, [0.0, 1.5, 3.5], **limits) == Verdict(2, True, 3.5, (0,))
    # kill -9 is a death of its own, even when another engine is slow to answer
    assert blame({1: KILL}, [0.0, 0.0], **limits) == Verdict(1, False)
    assert blame({1: KILL}, [0.0, 0.0, 2.0], **limits) == Verdict(1, False)
    # seen in the same poll as the abort it caused, the killed engine is still the cause
    assert blame({0: ABORT, 1: KILL}, [0.0, 0.0], **limits, aborted_by_jax=frozenset({0})) == (
        Verdict(1, False, 0.0, (0,))
    )
    # an abort with every other engine answering is that process's own crash
    assert blame({0: ABORT}, [0.0, 0.1], **limits) == Verdict(0, False)
    assert read_jax_abort("Segmentation fault\n") == (False, frozenset())
    older = "The following tasks are unhealthy (stopped sending heartbeats):\n/job:jax_worker/replica:0/task:2\n"
    assert read_jax_abort(older) == (False, frozenset({2}))


def test_hang_messages_name_the_process_and_when():
    hung = ProcessHung(
        1,
        4242,
        3.04,
        state="it is stopped: SIGSTOP, Ctrl-Z or a debugger",
        consequences=[(0, ABORT)],
    )
    assert str(hung) == (
        "process 1 (pid 4242) hung: it stopped answering for 3.0 s (it is stopped: SIGSTOP, "
        "Ctrl-Z or a debugger); JAX's runtime then aborted process 0 (killed by SIGABRT) as a "
        "consequence; the cluster is stopped; `%cluster restart`"
    )
    two = ProcessHung(0, 7, 4.0, consequences=[(1, ABORT), (2, ABORT)])
    assert "aborted processes 1, 2 (killed by SIGABRT) as a consequence" in str(two)
    # told to a later call: when it happened, and that no cell was running then
    hung.at -= 75
    later = hung.earlier()
    assert isinstance(later, ProcessHung) and later.pid == 4242
    stamp = time.strftime("%H:%M:%S", time.localtime(hung.at))
    assert str(later).startswith(f"earlier, at {stamp} (75 s ago, while no cell ran on it): ")
    assert str(later).endswith(str(hung))
    hung.during_cell = True
    assert "(75 s ago, during an earlier cell)" in str(hung.earlier())
    died = ProcessDied(1, KILL, consequences=[(0, ABORT)])
    assert str(died).startswith(
        "process 1 died (killed by SIGKILL); JAX's runtime then aborted process 0 (killed by "
        "SIGABRT) as a consequence; the cluster is stopped"
    )


ECHO = (
    "import ctypes, time\n"
    "from shardlab.cluster.worker import start_heartbeat\n"
    "print(start_heartbeat(), flush=True)\n"
    "input()\n"
    "ctypes.PyDLL(None).sleep(2)  # holds the GIL for 2 s\n"
    "print('held', flush=True)\n"
    "time.sleep(60)\n"
)


def _beat_for(heartbeats: Heartbeats, seconds: float) -> float:
    """Beats every 0.1 s for ``seconds``; returns the longest silence seen."""
    longest = 0.0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        heartbeats.beat()
        longest = max(longest, *heartbeats.silent_s())
        time.sleep(0.1)
    return longest


def test_heartbeats_stop_when_the_process_stops_not_when_it_holds_the_gil():
    with subprocess.Popen(
        [sys.executable, "-c", ECHO], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as engine:
        assert engine.stdout is not None and engine.stdin is not None
        heartbeats = None
        try:
            heartbeats = Heartbeats([int(engine.stdout.readline())])
            assert _beat_for(heartbeats, 0.5) < 0.5
            engine.stdin.write("\n")
            engine.stdin.flush()
            # the process holds the GIL, in C, for 2 s: its echo answers all along
            assert _beat_for(heartbeats, 1.5) < 0.5
            assert engine.stdout.readline().strip() == "held"
            # a kernel too busy to beat for a while does not make the engine look silent
            time.sleep(1.2)
            heartbeats.beat()
            assert max(heartbeats.silent_s()) < 0.2
            os.kill(engine.pid, signal.SIGSTOP)
            assert _beat_for(heartbeats, 1.2) > 0.9
            answered = heartbeats.last_answer(0)
            assert time.time() - 1.5 < answered < time.time() - 0.9
            os.kill(engine.pid, signal.SIGCONT)
            time.sleep(0.2)
            heartbeats.beat()
            assert max(heartbeats.silent_s()) < 0.2
        finally:
            if heartbeats is not None:
                heartbeats.close()
            os.kill(engine.pid, signal.SIGCONT)
            engine.kill()
