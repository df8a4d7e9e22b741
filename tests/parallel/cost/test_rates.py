"""Achievable compute rates of the datasheet profiles (``DeviceProfile.op_time``): checked
against measured figures the rates were not read from."""

from __future__ import annotations

import math

import pytest

from shardlab.parallel.cost.profiles import DEVICE_PROFILES

# Rows of XLA's own measured H100 matrix-multiply table (openxla/xla:
# xla/service/gpu/model/matmul_interpolator_data.h, "sm_90", bf16): (batch, m, n, k) -> TFLOP/s.
# The profile's three figures were read off the 4096^3 row and the smallest rows; these are
# other rows, from skinny to square.
XLA_SM90_BF16 = {
    (1, 1024, 2048, 256): 139.5,
    (2, 256, 2048, 2048): 332.2,
    (1, 4096, 512, 512): 238.8,
    (4, 4096, 256, 2048): 588.7,
    (2, 1024, 2048, 1024): 493.4,
    (4, 1024, 2048, 2048): 712.7,
    (1, 2048, 2048, 2048): 632.0,
    (2, 4096, 4096, 2048): 763.0,
    (1, 1024, 256, 1024): 68.3,
    (2, 4096, 512, 4096): 729.7,
    (4, 256, 256, 4096): 171.6,
    (2, 2048, 256, 512): 139.2,
}


def test_h100_matmul_rates_follow_xlas_measured_table():
    h100 = DEVICE_PROFILES["h100-nvlink"]
    errors = []
    for shape, measured in XLA_SM90_BF16.items():
        predicted = h100.achieved_rate(shape) / 1e12
        errors.append(abs(math.log(predicted / measured)))
        assert 0.8 < predicted / measured < 1.25, (shape, predicted, measured)
    assert sum(errors) / len(errors) < 0.1


def test_large_matmuls_reach_the_published_share_of_peak_not_the_datasheet():
    for name in ("h100-nvlink", "a100-nvlink", "h200"):
        p = DEVICE_PROFILES[name]
        rate = p.achieved_rate((1, 8192, 8192, 8192))
        assert 0.75 * p.peak_flops < rate < 0.82 * p.peak_flops, name


def test_tpu_computes_in_whole_mxu_tiles():
    v5e = DEVICE_PROFILES["tpu-v5e"]
    aligned = v5e.achieved_rate((1, 4096, 4096, 1024))
    ragged = v5e.achieved_rate((1, 4096, 4096 + 8, 1024))  # one more partial tile of 128
    assert ragged == pytest.approx(aligned * (4096 + 8) / (4096 + 128))
    assert v5e.tile_padding((1, 128, 256, 384)) == 1.0
    assert v5e.tile_padding((1, 129, 256, 384)) == pytest.approx(256 / 129)
    v6e = DEVICE_PROFILES["tpu-v6e"]
    assert v6e.tile_padding((1, 128, 256, 256)) == pytest.approx(2.0)  # 256 x 256 MXU


def test_cpu_and_calibrated_profiles_keep_their_measured_rates():
    cpu = DEVICE_PROFILES["cpu-sim"]
    flops, nbytes = 2.0 * 512**3, 3 * 512 * 512 * 4
    assert cpu.op_time(flops, nbytes, matmul=(1, 512, 512, 512)) == cpu.op_time(flops, nbytes)
