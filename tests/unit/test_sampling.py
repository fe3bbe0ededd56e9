"""The distribution sampled replies draw from, against transformers' own logits warpers
(temperature, then top-k, then top-p)."""

import pytest
import torch
from transformers import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from tuneforge.models.sampling import next_token_probs


@pytest.mark.parametrize(
    ("temperature", "top_p", "top_k"),
    [(1.0, 1.0, 0), (0.7, 0.9, 0), (1.3, 1.0, 5), (0.8, 0.5, 20), (1.0, 0.05, 0)],
)
def test_next_token_probs_match_transformers_warpers(temperature, top_p, top_k):
    logits = torch.randn(6, 97, generator=torch.Generator().manual_seed(0)) * 3
    warpers = [TemperatureLogitsWarper(temperature)]
    if top_k:
        warpers.append(TopKLogitsWarper(top_k))
    if top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p))
    expected = LogitsProcessorList(warpers)(None, logits.clone()).softmax(-1)
    got = next_token_probs(logits, temperature, top_p, top_k)
    torch.testing.assert_close(got, expected)
    kept = (got > 0).sum(-1)
    if top_k:
        assert (kept <= top_k).all()
    if top_p == 0.05:
        assert (kept >= 1).all() and (kept < 97).all()  # the likeliest token always stays
