"""Replies' log-probabilities from a packed batch against each document run alone through the
model with its full logits: the values and their gradients, chunked or not."""

import torch

from tests.helpers import tiny_decoder
from tuneforge.data.packing import IGNORE_INDEX
from tuneforge.packed import PackedSequences
from tuneforge.train.sequence_logps import document_sums, token_logps


def _documents():
    generator = torch.Generator().manual_seed(0)
    lengths = [7, 12, 5]
    tokens = [torch.randint(0, 64, (n,), generator=generator) for n in lengths]
    labels = []
    for document in tokens:
        label = torch.cat([document[1:], torch.tensor([IGNORE_INDEX])])
        label[: len(document) // 2] = IGNORE_INDEX  # the prompt is not supervised
        labels.append(label)
    return lengths, tokens, labels


def test_packed_reply_logps_are_those_of_each_document_alone():
    torch.manual_seed(0)
    model = tiny_decoder(tied=False)
    lengths, tokens, labels = _documents()
    packed = PackedSequences.from_lengths(lengths)
    hidden = model.hidden_states(torch.cat(tokens), packed)
    weight = model.lm_head.weight
    for chunk in (4, 1024):
        sums = document_sums(
            token_logps(hidden, weight, torch.cat(labels), chunk), packed.cu_seqlens
        )
        grads = torch.autograd.grad(sums.sum() + sums[1], [weight])
        alone = []
        for document, label in zip(tokens, labels, strict=True):
            logits = model(document[None])[0].float()
            logps = torch.log_softmax(logits, dim=-1)
            supervised = label != IGNORE_INDEX
            alone.append(logps[supervised].gather(1, label[supervised][:, None]).sum())
        expected = torch.stack(alone)
        expected_grads = torch.autograd.grad(expected.sum() + expected[1], [weight])
        assert torch.allclose(sums, expected, atol=1e-4)
        assert torch.allclose(grads[0], expected_grads[0], atol=1e-4)


def test_padding_after_the_last_document_is_left_out():
    values = torch.tensor([1.0, 2.0, 3.0, 4.0, 100.0])
    cu_seqlens = torch.tensor([0, 1, 4], dtype=torch.int32)
    assert document_sums(values, cu_seqlens).tolist() == [1.0, 9.0]
