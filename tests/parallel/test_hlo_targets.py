"""The HLO reader on programs compiled for XLA:CPU, XLA:GPU (H100) and TPU (v5e, v5p).

The fixtures in tests/data/hlo/ were written by tools/make_hlo_fixtures.py (JAX 0.10.2,
libtpu 0.0.42.1, jax-cuda12 0.10.2; GPU and TPU compiled deviceless). Every expected value
below is derived by hand from the program and from reading the HLO text, never from the
reader: per kind, (collectives, runs, bytes) where runs sums ``count`` and bytes sums
``bytes * count`` (result bytes per device).

Meshes: ("data", "model") = (2, 4) on 8 devices, (8, 8) on 64. CPU programs are f32, the GPU
and TPU ones bf16. KiB = 1024 B, MiB = 1024 KiB.
"""

from __future__ import annotations

import collections
from pathlib import Path

import pytest

from shardlab.parallel.compiled.hlo import collectives_from_hlo, shape_bytes

DATA = Path(__file__).resolve().parent.parent / "data" / "hlo"
KiB, MiB = 1024, 1024 * 1024
LOSS = 4  # the loss: one f32 scalar all-reduced over the batch's devices

# (a) dp: W1 [512,1024] + W2 [1024,512] replicated, batch over all devices; the weight
#     gradients are 2 x 512Ki elements = 2 MiB bf16 / 4 MiB f32, all-reduced over all devices.
# (b) fsdp: 4 weights [4096,4096] sharded on dim 0 over all devices: each gathered in full
#     (32 MiB bf16, 64 MiB f32); the gradient shards are 1/n of that (4 MiB on 8, 512 KiB
#     on 64, bf16).
# (c) tp: 2 Megatron MLP blocks, W1 [512,2048] P(None,'model'), W2 [2048,512] P('model',None),
#     batch 64 over 'data': activations per device [64/data, 512]; an all-reduce over 'model'
#     after each block (2 forward) and one in the backward pass at the second block's input
#     (the first block's input needs no gradient): 3 x [32,512] on 8 (32 KiB bf16,
#     64 KiB f32), 3 x [8,512] = 8 KiB on 64. The 4 weight gradients (per device [512,512]
#     on 8: 512 KiB bf16 / 1 MiB f32; [512,256] = 256 KiB on 64) all-reduce over 'data'.
# (d) perm: ppermute then all_to_all of [64,256] per device (32 KiB bf16, 64 KiB f32).
# (e) loop: fori_loop(0, 6) of a psum over 'model' of [32,512]: 6 runs of 32 KiB bf16 /
#     64 KiB f32.
# (f) seqtp: x [8,1024,4096] P('data','model'), W1 [4096,16384] P(None,'model'),
#     W2 [16384,4096] P('model',None). x and the output gradient are gathered over 'model'
#     (2 all-gathers of [8/data, 1024, 4096]); the weight gradients (2 x 4096 x 16384/model)
#     all-reduce over 'data'; the second matmul's reduce-scatter runs as collective-permutes.
EXPECTED: dict[str, dict[str, tuple[int, int, int]]] = {
    # XLA:CPU: synchronous collectives, one instruction each.
    "cpu_dp_8": {
        # one combined all-reduce: (dW2, dW1, loss)
        "all-reduce": (1, 1, 4 * MiB + LOSS),
    },
    "cpu_fsdp_8": {
        "all-gather": (4, 4, 4 * 64 * MiB),
        # CPU makes no reduce-scatter: the 4 full gradients and the loss in one all-reduce
        # (then each device slices its shard)
        "all-reduce": (1, 1, 4 * 64 * MiB + LOSS),
    },
    "cpu_tp_8": {
        # 3 x [32,512] f32 over 'model', then one tuple (4 x [512,512] f32, loss) over 'data'
        "all-reduce": (4, 4, 3 * 64 * KiB + 4 * MiB + LOSS),
    },
    "cpu_perm_8": {"collective-permute": (1, 1, 64 * KiB), "all-to-all": (1, 1, 64 * KiB)},
    "cpu_loop_8": {"all-reduce": (1, 6, 6 * 64 * KiB)},  # known_trip_count 6
    # XLA:GPU: -start/-done pairs, counted once each.
    "gpu_dp_8": {
        # the gradients concatenated into one bf16[1048576] (2 MiB); the loss apart
        "all-reduce": (2, 2, 2 * MiB + LOSS),
    },
    "gpu_dp_64": {"all-reduce": (2, 2, 2 * MiB + LOSS)},
    "gpu_fsdp_8": {
        "all-gather": (4, 4, 4 * 32 * MiB),
        # one reduce-scatter-start of the 4 gradients; its -done is 4 x bf16[512,4096]
        "reduce-scatter": (1, 1, 4 * 4 * MiB),
        "all-reduce": (1, 1, LOSS),
    },
    "gpu_fsdp_64": {
        "all-gather": (4, 4, 4 * 32 * MiB),
        "reduce-scatter": (1, 1, 4 * 512 * KiB),  # 4 x bf16[64,4096]
        "all-reduce": (1, 1, LOSS),
    },
    "gpu_tp_8": {
        # 3 over 'model', the 4 gradients concatenated (bf16[1048576]) over 'data', the loss
        "all-reduce": (5, 5, 3 * 32 * KiB + 4 * 512 * KiB + LOSS),
    },
    "gpu_tp_64": {"all-reduce": (5, 5, 3 * 8 * KiB + 4 * 256 * KiB + LOSS)},
    "gpu_perm_8": {"collective-permute": (1, 1, 32 * KiB), "all-to-all": (1, 1, 32 * KiB)},
    "gpu_loop_8": {"all-reduce": (1, 6, 6 * 32 * KiB)},  # known_trip_count 6
    # TPU (v5e): async collectives cloned into fusions, all-reduce-scatter fusions, and
    # loops without a known_trip_count.
    "tpu-v5e_dp_8": {"all-reduce": (2, 2, 2 * MiB + LOSS)},  # tuple (dW1, dW2); the loss
    "tpu-v5e_dp_64": {"all-reduce": (2, 2, 2 * MiB + LOSS)},
    "tpu-v5e_fsdp_8": {
        # channel_id 1, 2, 3: one all-gather each in the entry (async_collective_name=...);
        # channel_id 4: five clones (AsyncCollectiveStart fusion, 3 async_collective_fusion
        # updates, AsyncCollectiveDone fusion) of one all-gather
        "all-gather": (4, 4, 4 * 32 * MiB),
        # 4 fusions calls=%all-reduce-scatter* (all-reduce of a full gradient, dynamic-slice
        # to the device's shard): reduce-scatters sized by the fusion result [512,4096]
        "reduce-scatter": (4, 4, 4 * 4 * MiB),
        "all-reduce": (1, 1, LOSS),
    },
    "tpu-v5e_fsdp_64": {
        "all-gather": (4, 4, 4 * 32 * MiB),  # the same pattern: channel_id 4 cloned 5 times
        # on 64 chips the gradients are all-reduced in full (then sliced): a tuple of 3,
        # one alone, and the loss
        "all-reduce": (3, 3, 4 * 32 * MiB + LOSS),
    },
    "tpu-v5e_tp_8": {"all-reduce": (5, 5, 3 * 32 * KiB + 4 * 512 * KiB + LOSS)},
    "tpu-v5e_perm_8": {"collective-permute": (1, 1, 32 * KiB), "all-to-all": (1, 1, 32 * KiB)},
    # the while has no known_trip_count: cond `i < 6`, body `i + 1`, init copy(constant(0))
    "tpu-v5e_loop_8": {"all-reduce": (1, 6, 6 * 32 * KiB)},
    "tpu-v5e_loop_64": {"all-reduce": (1, 6, 6 * 32 * KiB)},
    "tpu-v5e_seqtp_8": {
        "all-gather": (2, 2, 2 * 32 * MiB),  # [4,1024,4096] bf16
        "all-reduce": (2, 2, 2 * 32 * MiB + LOSS),  # tuple of 2 x [4096,4096]; the loss
        # the windowed einsum unrolled: 5 collective-permute-start/-done of [4,256,4096]
        "collective-permute": (5, 5, 5 * 8 * MiB),
    },
    "tpu-v5e_seqtp_64": {
        "all-gather": (2, 2, 2 * 8 * MiB),  # [1,1024,4096] bf16
        "all-reduce": (2, 2, 2 * 16 * MiB + LOSS),  # tuple ([4096,2048], [2048,4096]); loss
        # windowed_dot_general_body_rs: 4 collective-permutes of [1,128,4096] (1 MiB) per
        # trip; no known_trip_count: cond `i < 4`, body `i + 2`, init copy(constant(0)),
        # so 2 trips; then one more collective-permute after the loop
        "collective-permute": (5, 9, 9 * MiB),
    },
    # TPU (v5p)
    "tpu-v5p_fsdp_8": {
        "all-gather": (4, 4, 4 * 32 * MiB),  # four plain all-gathers
        "all-reduce": (3, 3, 4 * 32 * MiB + LOSS),  # tuple of 3, one alone, the loss
    },
    "tpu-v5p_tp_8": {"all-reduce": (5, 5, 3 * 32 * KiB + 4 * 512 * KiB + LOSS)},
    "tpu-v5p_loop_8": {"all-reduce": (1, 6, 6 * 32 * KiB)},
}


def _mesh(name: str) -> dict[str, int]:
    return {"data": 2, "model": 4} if name.endswith("_8") else {"data": 8, "model": 8}


def _read(name: str):
    return collectives_from_hlo((DATA / f"{name}.hlo").read_text(), _mesh(name))


def _per_kind(collectives) -> dict[str, tuple[int, int, int]]:
    out: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0])
    for c in collectives:
        out[c.kind][0] += 1
        out[c.kind][1] += c.count
        out[c.kind][2] += c.bytes * c.count
    return {k: (v[0], v[1], v[2]) for k, v in out.items()}


def test_every_fixture_has_expectations():
    assert sorted(p.stem for p in DATA.glob("*.hlo")) == sorted(EXPECTED)
    assert sum(p.stat().st_size for p in DATA.glob("*.hlo")) < 3 * MiB


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_per_kind_counts_and_bytes_match_the_hand_count(name):
    assert _per_kind(_read(name)) == EXPECTED[name]


def test_tpu_cloned_all_gather_is_read_once():
    text = (DATA / "tpu-v5e_fsdp_8.hlo").read_text()
    # what the text holds: five all-gather instructions share channel_id=4, all in fusions
    assert text.count("all-gather(") - text.count("async_collective_name") == 5
    assert "AsyncCollectiveStart" in text and "AsyncCollectiveDone" in text
    gathers = [c for c in _read("tpu-v5e_fsdp_8") if c.kind == "all-gather"]
    assert len(gathers) == 4
    assert all(c.group_size == 8 and c.mesh_axes == ("data", "model") for c in gathers)
    assert all(c.source.startswith("tools/make_hlo_fixtures.py:") for c in gathers)


def test_tpu_all_reduce_scatter_fusion_is_a_reduce_scatter():
    scatters = [c for c in _read("tpu-v5e_fsdp_8") if c.kind == "reduce-scatter"]
    assert len(scatters) == 4
    for c in scatters:
        assert c.hlo_name.startswith("fusion")  # the kCustom fusion, not its all-reduce
        assert c.bytes == 4 * MiB and c.group_size == 8  # bf16[512,4096] kept per device
        assert c.wire_bytes == 7 * 4 * MiB  # a ring reduce-scatter of that result
        assert c.shape.startswith("bf16[512,4096]")


def test_windowed_einsum_loop_trip_count_is_inferred():
    text = (DATA / "tpu-v5e_seqtp_64.hlo").read_text()
    assert "windowed_dot_general_body_rs" in text and "known_trip_count" not in text
    permutes = [c for c in _read("tpu-v5e_seqtp_64") if c.kind == "collective-permute"]
    assert sorted(c.count for c in permutes) == [1, 2, 2, 2, 2]
    assert {c.mesh_axes for c in permutes} == {("model",)}


def test_tensor_parallel_axes_and_combined_operands():
    cs = _read("tpu-v5e_tp_8")
    acts = [c for c in cs if c.bytes == 32 * KiB]
    assert len(acts) == 3 and {c.mesh_axes for c in acts} == {("model",)}
    (grads,) = [c for c in cs if c.bytes == 2 * MiB]
    assert grads.mesh_axes == ("data",) and grads.operands == 4
    (combined,) = _read("cpu_dp_8")
    assert combined.operands == 3  # dW2, dW1 and the loss
    (rs,) = [c for c in _read("gpu_fsdp_8") if c.kind == "reduce-scatter"]
    assert rs.operands == 4 and rs.hlo_name == "reduce-scatter-start"
    (a2a,) = [c for c in _read("cpu_perm_8") if c.kind == "all-to-all"]
    assert a2a.operands == 4  # CPU's all-to-all: a tuple of 4 [16,256]


# --- snippets: rules the fixtures do not reach ------------------------------------------------


def _module(body: str, extra: str = "", partitions: int = 8) -> str:
    return (
        f"HloModule m, num_partitions={partitions}\n\n"
        "%add (x: bf16[], y: bf16[]) -> bf16[] {\n  %x = bf16[] parameter(0)\n"
        "  %y = bf16[] parameter(1)\n  ROOT %s = bf16[] add(%x, %y)\n}\n\n"
        f"{extra}"
        "ENTRY %main (p: bf16[1024,1024]) -> bf16[1024,1024] {\n"
        "  %p = bf16[1024,1024]{1,0:T(8,128)(2,1)} parameter(0)\n" + body + "\n}\n"
    )


def test_same_channel_outside_fusions_counts_each_and_kinds_never_merge():
    hlo = _module(
        "  %a = bf16[1024,1024]{1,0} all-reduce(%p), channel_id=1, replica_groups={}, "
        "to_apply=%add\n"
        "  %b = bf16[1024,1024]{1,0} all-reduce(%a), channel_id=1, replica_groups={}, "
        "to_apply=%add\n"
        "  %c = bf16[1024,1024]{1,0} collective-permute(%b), channel_id=1, "
        "source_target_pairs={{0,1},{1,0}}\n"
        "  ROOT %d = bf16[1024,1024]{1,0} all-gather(%c), channel_id=1, "
        "replica_groups={}, dimensions={0}"
    )
    kinds = [c.kind for c in collectives_from_hlo(hlo, {"data": 8})]
    assert kinds == ["all-reduce", "all-reduce", "collective-permute", "all-gather"]


def test_combined_all_reduce_scatter_fusion_and_fusion_clones():
    scatter = (
        "%all-reduce-scatter.4 (input_0: bf16[1024,1024], input_1: bf16[1024,1024]) -> "
        "(bf16[128,1024], bf16[128,1024]) {\n"
        "  %input_0 = bf16[1024,1024]{1,0} parameter(0)\n"
        "  %input_1 = bf16[1024,1024]{1,0} parameter(1)\n"
        "  %all-reduce.9 = (bf16[1024,1024]{1,0}, bf16[1024,1024]{1,0}) all-reduce(%input_0, "
        "%input_1), channel_id=1, replica_groups={}, use_global_device_ids=true, to_apply=%add\n"
        "  %g0 = bf16[1024,1024]{1,0} get-tuple-element(%all-reduce.9), index=0\n"
        "  %g1 = bf16[1024,1024]{1,0} get-tuple-element(%all-reduce.9), index=1\n"
        "  %pid = u32[] partition-id()\n  %z = u32[] constant(0)\n"
        "  %d0 = bf16[128,1024]{1,0} dynamic-slice(%g0, %pid, %z), dynamic_slice_sizes={128,1024}\n"
        "  %d1 = bf16[128,1024]{1,0} dynamic-slice(%g1, %pid, %z), dynamic_slice_sizes={128,1024}\n"
        "  ROOT %t = (bf16[128,1024]{1,0}, bf16[128,1024]{1,0}) tuple(%d0, %d1)\n}\n\n"
    )
    clone = (
        "%fused.{i} (param_0.{i}: bf16[128,1024]) -> bf16[1024,1024] {{\n"
        "  %param_0.{i} = bf16[128,1024]{{1,0}} parameter(0)\n"
        "  ROOT %all-gather.{i} = bf16[1024,1024]{{1,0:T(8,128)(2,1)S(1)}} "
        "all-gather(%param_0.{i}), channel_id=1, replica_groups=[1,8]<=[8], dimensions={{0}}\n"
        "}}\n\n"
    )
    extra = scatter + "".join(clone.format(i=i) for i in range(3))
    hlo = _module(
        "  %s = bf16[128,1024]{1,0} slice(%p), slice={[0:128], [0:1024]}\n"
        "  %f = (bf16[128,1024]{1,0}, bf16[128,1024]{1,0}) fusion(%p, %p), kind=kCustom, "
        "calls=%all-reduce-scatter.4\n"
        + "".join(
            f"  %c{i} = bf16[1024,1024]{{1,0}} fusion(%s), kind=kOutput, calls=%fused.{i}\n"
            for i in range(3)
        )
        + "  ROOT %r = bf16[1024,1024]{1,0} add(%c0, %c2)",
        extra,
    )
    ag, rs = collectives_from_hlo(hlo, {"data": 8})  # text order: the fusion bodies first
    assert (rs.kind, rs.bytes, rs.operands, rs.group_size) == ("reduce-scatter", 512 * KiB, 2, 8)
    assert rs.hlo_name == "f" and rs.wire_bytes == 7 * 512 * KiB
    assert (ag.kind, ag.bytes, ag.count) == ("all-gather", 2 * MiB, 1)  # 3 clones, one op


def _loop(cond_root: str, step: str, start: int, carried: str = "%q") -> str:
    # tuple (i, x, n): i the induction variable, n carried unchanged (init `carried`)
    init = f"  %i0 = s32[] constant({start})\n  %n0 = s32[] constant(10)\n"
    return (
        "HloModule m, num_partitions=8\n\n"
        "%add (x: f32[], y: f32[]) -> f32[] {\n  %x = f32[] parameter(0)\n"
        "  %y = f32[] parameter(1)\n  ROOT %s = f32[] add(%x, %y)\n}\n\n"
        "%body (bp: (s32[], f32[4], s32[])) -> (s32[], f32[4], s32[]) {\n"
        "  %bp = (s32[], f32[4], s32[]) parameter(0)\n"
        "  %bi = s32[]{:T(128)} get-tuple-element(%bp), index=0\n"
        "  %bx = f32[4]{0} get-tuple-element(%bp), index=1\n"
        "  %bn = s32[] get-tuple-element(%bp), index=2\n"
        "  %one = s32[] constant(1)\n  %three = s32[] constant(3)\n"
        f"  %next = s32[] {step}\n"
        "  %ar = f32[4]{0} all-reduce(%bx), channel_id=1, replica_groups=[1,8]<=[8], "
        "to_apply=%add\n"
        "  ROOT %bt = (s32[], f32[4], s32[]) tuple(%next, %ar, %bn)\n}\n\n"
        "%cond (cp: (s32[], f32[4], s32[])) -> pred[] {\n"
        "  %cp = (s32[], f32[4], s32[]) parameter(0)\n"
        "  %ci = s32[] get-tuple-element(%cp), index=0\n"
        "  %cn = s32[] get-tuple-element(%cp), index=2\n"
        "  %ten = s32[] constant(10)\n"
        f"  ROOT %lt = pred[] {cond_root}\n}}\n\n"
        "ENTRY %main (p: f32[4], q: s32[]) -> f32[4] {\n  %p = f32[4]{0} parameter(0)\n"
        "  %q = s32[] parameter(1)\n" + init + "  %c = s32[] copy(%i0)\n"
        f"  %t = (s32[], f32[4], s32[]) tuple(%c, %p, {carried})\n"
        "  %w = (s32[], f32[4], s32[]) while(%t), condition=%cond, body=%body\n"
        "  ROOT %o = f32[4]{0} get-tuple-element(%w), index=1\n}\n"
    )


@pytest.mark.parametrize(
    ("cond_root", "step", "start", "carried", "trips"),
    [
        ("compare(%ci, %ten), direction=LT", "add(%bi, %one)", 0, "%q", 10),
        ("compare(%ci, %ten), direction=LE", "add(%bi, %three)", 1, "%q", 4),  # 1,4,7,10
        ("compare(%ten, %ci), direction=GT", "add(%one, %bi)", 4, "%q", 6),  # 10 > i
        ("compare(%ci, %ten), direction=NE", "add(%bi, %one)", 2, "%q", 8),
        ("compare(%ci, %ten), direction=LT", "add(%bi, %three)", 0, "%q", 4),  # 0,3,6,9
        ("compare(%ci, %cn), direction=LT", "add(%bi, %one)", 7, "%n0", 3),  # bound carried
        ("compare(%ci, %cn), direction=LT", "add(%bi, %one)", 0, "%q", 1),  # bound unknown
        ("compare(%ci, %ten), direction=LT", "add(%bi, %one)", 12, "%q", 1),  # 0 trips: unsure
        ("compare(%ci, %ten), direction=LT", "multiply(%bi, %three)", 1, "%q", 1),  # not i+c
    ],
)
def test_while_trip_count_inferred_from_condition_body_and_init(
    cond_root, step, start, carried, trips
):
    (c,) = collectives_from_hlo(_loop(cond_root, step, start, carried), {"data": 8})
    assert c.count == trips


def test_counting_down_and_known_trip_count_wins():
    # i = 9; i > 0; i -= 3  ->  9, 6, 3: three trips
    hlo = _loop("compare(%ci, %z), direction=GT", "subtract(%bi, %three)", 9).replace(
        "  %ten = s32[] constant(10)\n", "  %z = s32[] constant(0)\n"
    )
    (c,) = collectives_from_hlo(hlo, {"data": 8})
    assert c.count == 3
    known = hlo.replace("body=%body", 'body=%body, backend_config={"known_trip_count":{"n":"5"}}')
    assert collectives_from_hlo(known, {"data": 8})[0].count == 5


def test_shape_bytes_ignores_tpu_layouts_and_tokens():
    assert shape_bytes("bf16[4096,4096]{1,0:T(8,128)(2,1)S(1)}") == 32 * MiB
    tpu_tuple = "(bf16[4,256,4096]{2,1,0:T(8,128)(2,1)S(1)}, u32[]{:S(2)}, token[])"
    assert shape_bytes(tpu_tuple) == 8 * MiB + 4


@pytest.mark.parametrize("compiler", ["cpu", "gpu", "tpu-v5e", "tpu-v5p"])
def test_matmul_flops_count_every_trip_of_a_loop(compiler):
    """The loop fixture: a fori_loop of 6 trips of [32,512] @ [512,512] per device. XLA's cost
    analysis counts the body once, on every compiler; ``matmul_flops`` counts each trip."""
    from shardlab.parallel.compiled.hlo import matmul_flops

    runs, once = matmul_flops((DATA / f"{compiler}_loop_8.hlo").read_text())
    trip = 2 * 32 * 512 * 512
    assert (runs, once) == (6 * trip, trip)


@pytest.mark.parametrize(
    ("name", "flops"),
    [
        # data parallel MLP train step: 2 forward matmuls and 3 backward (no input gradient)
        # of 2·256·512·1024 each, over 8 or 64 devices
        *[(f"{c}_dp_8", 5 * 2 * 256 * 512 * 1024 / 8) for c in ("cpu", "gpu", "tpu-v5e")],
        *[(f"{c}_dp_64", 5 * 2 * 256 * 512 * 1024 / 64) for c in ("gpu", "tpu-v5e")],
        # sequence-parallel Megatron MLP: 5 matmuls of 2·8·1024·4096·16384; at 64 chips XLA:TPU
        # runs one as a windowed-einsum loop (8 trips of a slice)
        ("tpu-v5e_seqtp_8", 5 * 2 * 8 * 1024 * 4096 * 16384 / 8),
        ("tpu-v5e_seqtp_64", 5 * 2 * 8 * 1024 * 4096 * 16384 / 64),
    ],
)
def test_matmul_flops_equal_the_hand_count_on_every_compiler(name, flops):
    from shardlab.parallel.compiled.hlo import matmul_flops

    runs, once = matmul_flops((DATA / f"{name}.hlo").read_text())
    assert runs == flops
    if name == "tpu-v5e_seqtp_64":  # what the compiler's own count would miss
        assert once < 0.95 * runs
