"""Gradient accumulation normalised by the supervised tokens of the whole step: the same
documents split over any number of micro-batches give the gradients of one big batch."""

import torch

from tests.helpers import save_tiny_model
from tuneforge.data.packing import collate, make_example
from tuneforge.models.hf.checkpoint import load_hf_model
from tuneforge.train.objectives.sft import NextTokenObjective
from tuneforge.train.step import backward_micro_batches


def documents():
    generator = torch.Generator().manual_seed(0)
    examples = []
    for length in (9, 30, 2, 17, 12, 25):
        ids = torch.randint(0, 128, (length,), generator=generator).tolist()
        mask = (torch.rand(length, generator=generator) > 0.3).tolist()
        examples.append(make_example(ids, mask))
    return examples


def gradients(model_dir, splits):
    objective = NextTokenObjective(load_hf_model(model_dir, "float32", "sdpa"))
    examples = documents()
    batches = [collate([examples[i] for i in split]) for split in splits]
    tokens = sum(batch.num_loss_tokens for batch in batches)
    loss = backward_micro_batches(objective, batches, 1 / tokens, 0.0).item() / tokens
    return loss, {n: p.grad.clone() for n, p in objective.named_parameters()}


def test_any_split_equals_one_big_batch(tmp_path):
    save_tiny_model(tmp_path, "qwen3_moe")
    loss, expected = gradients(tmp_path, [[0, 1, 2, 3, 4, 5]])
    for splits in ([[0, 1, 2], [3, 4, 5]], [[0], [1, 2, 3, 4], [5]]):
        split_loss, got = gradients(tmp_path, splits)
        assert abs(split_loss - loss) < 1e-6
        for name, grad in expected.items():
            torch.testing.assert_close(got[name], grad, rtol=1e-5, atol=1e-6, msg=name)
