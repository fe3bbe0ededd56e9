import torch

from tests.helpers import tiny_decoder as tiny
from tuneforge.execution.host_embedding import embedding_to_host


def test_an_embedding_on_the_host_gives_the_same_step_on_the_gpu():
    """The same logits and gradients from host token ids and a pinned host embedding, and the
    embedding's bytes off the GPU."""
    from tuneforge.packed import PackedSequences

    results = []
    for host in (False, True):
        torch.manual_seed(0)
        model = tiny(tied=False).cuda()
        model.embed.weight.requires_grad_(False)
        before = torch.cuda.memory_allocated()
        if host:
            embedding_to_host(model, 1)
        freed = before - torch.cuda.memory_allocated()
        tokens = torch.randint(0, 64, (40,), generator=torch.Generator().manual_seed(1))
        packed = PackedSequences.from_lengths([15, 25], "cuda")
        hidden = model.hidden_states(tokens if host else tokens.cuda(), packed)
        hidden.square().sum().backward()
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        results.append((hidden, grads, freed))
    (expected, expected_grads, _), (got, grads, freed) = results
    assert freed == 64 * 32 * 4
    torch.testing.assert_close(got, expected)
    for name in expected_grads:
        torch.testing.assert_close(grads[name], expected_grads[name], msg=name)
