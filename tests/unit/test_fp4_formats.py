"""The FP4 formats against hand-worked values: every E2M1 code, rounding ties to even,
saturation, MXFP4's power-of-two scales, NVFP4's E4M3 block scales and tensor scale, NaN and Inf,
and blocks that stay within their row."""

import math

import pytest
import torch

from tuneforge.precision.fp4 import (
    E2M1_VALUES,
    e2m1_codes,
    e2m1_round,
    e2m1_values,
    fake_quantize,
    pack_pairs,
    quantize_fp4,
    quantize_mxfp4,
    quantize_nvfp4,
    unpack_pairs,
)


def test_every_e2m1_code_has_its_value_and_comes_back():
    codes = torch.arange(16, dtype=torch.uint8)
    values = e2m1_values(codes)
    assert values[:8].tolist() == list(E2M1_VALUES)
    assert values[8:].tolist() == [-v for v in E2M1_VALUES]
    assert torch.signbit(values[8])  # code 8 is -0
    assert torch.equal(e2m1_codes(values), codes)


def test_stochastic_rounding_picks_a_neighbour_and_is_unbiased():
    torch.manual_seed(0)
    values = torch.tensor([0.3, 1.2, 2.6, 5.0, 4.0, -0.1]).repeat(20000, 1)
    rounded = e2m1_values(e2m1_codes(values, stochastic=True))
    neighbours = [(0.0, 0.5), (1.0, 1.5), (2.0, 3.0), (4.0, 6.0), (4.0, 4.0), (-0.5, 0.0)]
    for column, (low, high) in enumerate(neighbours):
        seen = set(rounded[:, column].tolist())
        assert seen <= {low, high} and len(seen) == (1 if low == high else 2)
    # the mean of many roundings is the value (0.3: 0 with p 0.4, 0.5 with p 0.6); to nearest
    # it would be 0.5, 1.0, 3.0, 4.0
    torch.testing.assert_close(rounded.mean(0), values[0], atol=0.03, rtol=0)  # 4 sigma


def test_rounding_is_to_nearest_with_ties_to_even_and_saturates():
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    # each tie goes to the neighbour whose mantissa bit is 0: 0, 1, 1, 2, 2, 4, 4
    assert e2m1_values(e2m1_codes(ties)).tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    assert e2m1_values(e2m1_codes(-ties)).tolist() == [-0.0, -1.0, -1.0, -2.0, -2.0, -4.0, -4.0]
    near = torch.tensor([0.26, 0.74, 1.26, 2.49, 2.51, 4.99, 5.01])
    assert e2m1_values(e2m1_codes(near)).tolist() == [0.5, 0.5, 1.5, 2.0, 3.0, 4.0, 6.0]
    huge = torch.tensor([6.0, 7.0, 1e9, -100.0])
    assert e2m1_values(e2m1_codes(huge)).tolist() == [6.0, 6.0, 6.0, -6.0]


def test_direct_rounding_gives_the_codes_values_at_every_grid_point_and_tie():
    grid = torch.tensor(E2M1_VALUES)
    midpoints = (grid[1:] + grid[:-1]) / 2
    near = torch.cat(
        [grid, midpoints, midpoints.nextafter(grid[1:]), midpoints.nextafter(grid[:-1])]
    )
    values = torch.cat([near, -near, torch.rand(10_000) * 12 - 6])
    assert torch.equal(e2m1_round(values), e2m1_values(e2m1_codes(values)))
    torch.manual_seed(3)
    codes = e2m1_codes(values, stochastic=True)
    torch.manual_seed(3)
    assert torch.equal(e2m1_round(values, stochastic=True), e2m1_values(codes))


@pytest.mark.parametrize("recipe", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("square", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fake_quantisation_is_the_quantised_tensor_dequantised_bit_for_bit(recipe, square, dtype):
    values = torch.randn(64, 128) * torch.logspace(-6, 3, 64).unsqueeze(1)
    values[0, :5] = torch.tensor([math.nan, math.inf, -math.inf, 1e30, -0.0])
    values[1] = 0.0
    values[2, 40:48] = 1e-38
    values = values.to(dtype)
    for stochastic in (False, True):
        torch.manual_seed(7)
        expected = quantize_fp4(values, recipe, stochastic, square).dequantize(dtype)
        torch.manual_seed(7)
        got = fake_quantize(values, recipe, stochastic, square)
        assert got.dtype == dtype
        torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)
        assert torch.equal(torch.signbit(got), torch.signbit(expected))


def test_two_codes_share_a_byte_the_first_in_the_low_nibble():
    codes = torch.tensor([[1, 15, 8, 7]], dtype=torch.uint8)
    packed = pack_pairs(codes)
    assert packed.tolist() == [[0xF1, 0x78]]
    assert torch.equal(unpack_pairs(packed), codes)


def test_mxfp4_scales_are_powers_of_two_from_the_blocks_largest_exponent():
    block = torch.zeros(32)
    block[0], block[1] = 1.0, 0.3
    mx = quantize_mxfp4(block)
    # floor(log2(1.0)) - 2 = -2: the scale is 0.25, stored as 127 - 2
    assert mx.scales.tolist() == [125]
    out = mx.dequantize()
    assert out[0] == 1.0  # 1.0 / 0.25 = 4, exact
    assert out[1] == 0.25  # 0.3 / 0.25 = 1.2 -> 1.0 -> 0.25
    # amax 7.9: floor(log2) = 2, scale 1: 7.9 saturates to 6 (the cost of rounding the scale down)
    high = torch.full((32,), 7.9)
    assert quantize_mxfp4(high).scales.tolist() == [127]
    assert quantize_mxfp4(high).dequantize()[0] == 6.0
    zeros = quantize_mxfp4(torch.zeros(32))
    assert zeros.scales.tolist() == [0] and torch.equal(zeros.dequantize(), torch.zeros(32))


def test_nvfp4_block_scales_are_e4m3_of_amax_over_6():
    block = torch.full((16,), 1.3)
    nv = quantize_nvfp4(block, tensor_scale=False)
    # 1.3 / 6 = 0.2167 lies between the E4M3 values 0.203125 and 0.21875: it rounds to 0.21875
    assert nv.scales.float().tolist() == [0.21875]
    # 1.3 / 0.21875 = 5.94 -> 6 -> 6 * 0.21875
    assert nv.dequantize()[0] == pytest.approx(1.3125)


def test_nvfp4_tensor_scale_lets_the_largest_block_use_e4m3s_whole_range():
    values = torch.cat([torch.full((16,), 3.0), torch.full((16,), 0.001)])
    nv = quantize_nvfp4(values)
    assert nv.tensor_scale is not None
    assert nv.tensor_scale.item() == pytest.approx(3.0 / (6 * 448))
    assert nv.scales.float()[0].item() == 448.0  # the largest block: 3 / 6 / tensor scale
    out = nv.dequantize()
    assert out[0].item() == pytest.approx(3.0)
    assert out[16].item() == pytest.approx(0.001, rel=0.1)  # a small block keeps its precision


@pytest.mark.parametrize("recipe", ["mxfp4", "nvfp4"])
def test_a_block_with_nan_or_inf_is_nan_and_the_others_are_kept(recipe):
    values = torch.ones(2, 64)
    values[0, 3] = math.nan
    values[1, 40] = math.inf
    out = quantize_fp4(values, recipe).dequantize()
    block = 32 if recipe == "mxfp4" else 16
    assert out[0, :block].isnan().all() and out[1, 32 : 32 + block].isnan().all()
    kept = torch.ones_like(out, dtype=torch.bool)
    kept[0, :block] = False
    kept[1, 32 : 32 + block] = False
    assert torch.equal(out[kept], torch.ones(int(kept.sum())))


@pytest.mark.parametrize("recipe", ["mxfp4", "nvfp4"])
def test_blocks_stay_within_their_row(recipe):
    rows = torch.stack([torch.full((32,), 0.01), torch.full((32,), 100.0)])
    out = quantize_fp4(rows, recipe).dequantize()
    assert out[0].sub(0.01).abs().max() < 0.002 and out[1].sub(100.0).abs().max() < 20


@pytest.mark.parametrize("recipe", ["mxfp4", "nvfp4"])
def test_round_trip_error_is_within_half_a_step_of_each_blocks_grid(recipe):
    values = torch.randn(8, 128, generator=torch.Generator().manual_seed(0)) * 3
    fp4 = quantize_fp4(values, recipe)
    out = fp4.dequantize()
    block = 32 if recipe == "mxfp4" else 16
    scale = fp4.block_scales().repeat_interleave(block, dim=-1)
    step = torch.where(values.abs() / scale > 4, 2.0, 1.0) * scale  # E2M1's widest gaps
    saturated = values.abs() > 6 * scale
    assert ((out - values).abs() <= step / 2 + 1e-6)[~saturated].all()
    assert fp4.codes.shape == (8, 64) and fp4.shape == values.shape


@pytest.mark.parametrize("recipe", ["nvfp4", "mxfp4"])
def test_square_tiles_quantise_a_matrix_alike_along_both_dimensions(recipe):
    torch.manual_seed(0)
    block = 16 if recipe == "nvfp4" else 32
    weight = torch.randn(2 * block, 3 * block) * torch.logspace(-2, 2, 3 * block)
    square = quantize_fp4(weight, recipe, square=True)
    transposed = quantize_fp4(weight.t().contiguous(), recipe, square=True)
    assert torch.equal(square.dequantize().t(), transposed.dequantize())
    # one scale per tile: the tile's largest magnitude sets it for all of its rows
    tiles = square.block_scales().unflatten(0, (-1, block))
    assert torch.equal(tiles, tiles[:, :1].expand_as(tiles))
    assert not torch.equal(square.dequantize(), quantize_fp4(weight, recipe).dequantize())
    with pytest.raises(ValueError, match="rows are a multiple"):
        quantize_fp4(weight[:-1], recipe, square=True)


def test_a_row_that_is_not_whole_blocks_is_refused():
    with pytest.raises(ValueError, match="not a multiple of the 32-element blocks"):
        quantize_mxfp4(torch.ones(2, 48))
    with pytest.raises(ValueError, match="unknown FP4 recipe"):
        quantize_fp4(torch.ones(32), "fp4")


def _torchao_formats():
    try:  # torchao's prototype formats: the reference implementation, where it imports
        from torchao.prototype.mx_formats.mx_tensor import to_mx
        from torchao.prototype.mx_formats.nvfp4_tensor import (
            nvfp4_quantize,
            per_tensor_amax_to_scale,
        )
    except Exception as error:  # absent, or built for another torch
        pytest.skip(f"torchao's mx_formats do not import here ({error})")
    return to_mx, nvfp4_quantize, per_tensor_amax_to_scale


def test_the_codes_and_scales_are_torchaos_bit_for_bit():
    to_mx, nvfp4_quantize, per_tensor_amax_to_scale = _torchao_formats()
    generator = torch.Generator().manual_seed(0)
    magnitudes = torch.logspace(-3, 3, 16).unsqueeze(1)  # six decades, one per pair of rows
    values = (torch.randn(16, 256, generator=generator) * magnitudes).contiguous()
    scales, codes = to_mx(values, torch.float4_e2m1fn_x2, 32)
    mx = quantize_mxfp4(values)
    assert torch.equal(scales.view(torch.uint8).reshape(mx.scales.shape), mx.scales)
    assert torch.equal(codes.view(torch.uint8).reshape(mx.codes.shape), mx.codes)
    tensor_scale = per_tensor_amax_to_scale(values.abs().amax())
    scales, codes = nvfp4_quantize(values, 16, tensor_scale)
    nv = quantize_nvfp4(values)
    assert nv.tensor_scale is not None and nv.tensor_scale.item() == tensor_scale.item()
    assert torch.equal(
        scales.view(torch.uint8).reshape(nv.scales.shape), nv.scales.view(torch.uint8)
    )
    assert torch.equal(codes.view(torch.uint8).reshape(nv.codes.shape), nv.codes)
