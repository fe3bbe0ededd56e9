"""RMSNorm's own backward (Llama's and Gemma's) against the same expression left to autograd."""

import pytest
import torch

from tuneforge.models.norm import RMSNormFunction, reference_offset_rms_norm, reference_rms_norm


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("weight_trains", [True, False])
@pytest.mark.parametrize("offset", [False, True], ids=["llama", "gemma"])
def test_rms_norm_matches_autograd(dtype, weight_trains, offset):
    generator = torch.Generator().manual_seed(0)
    x = (3 * torch.randn(2, 40, 64, generator=generator)).to(dtype)
    weight = (1 + 0.1 * torch.randn(64, generator=generator)).to(dtype)
    grad = torch.randn(2, 40, 64, generator=generator).to(dtype)
    results = []
    reference = reference_offset_rms_norm if offset else reference_rms_norm
    for function in (RMSNormFunction.apply, reference):
        x_, w_ = x.clone().requires_grad_(), weight.clone().requires_grad_(weight_trains)
        y = function(x_, w_, 1e-5, offset) if function is not reference else function(x_, w_, 1e-5)
        y.backward(grad)
        results.append((y, x_.grad, w_.grad))
    (y, dx, dw), (ref_y, ref_dx, ref_dw) = results
    assert y.dtype == ref_y.dtype and dx.dtype == ref_dx.dtype
    torch.testing.assert_close(y, ref_y, rtol=0, atol=0)  # the forward is the same expression
    tolerance = (
        {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    )
    torch.testing.assert_close(dx, ref_dx, **tolerance)
    if weight_trains:
        torch.testing.assert_close(dw, ref_dw, **tolerance)
    else:
        assert dw is None and ref_dw is None
