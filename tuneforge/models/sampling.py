"""The next-token distribution a sampled reply draws from: logits divided by the temperature,
then only the `top_k` likeliest tokens kept, then only the smallest set of the likeliest whose
probabilities add up to `top_p` (nucleus sampling) — the order transformers applies them in."""

from collections.abc import Sequence

import torch


def next_token_probs(
    logits: torch.Tensor, temperature: float, top_p: float = 1.0, top_k: int = 0
) -> torch.Tensor:
    """[rows, vocab] probabilities (fp32) from `logits` [rows, vocab]; `temperature` > 0."""
    scores = logits.float() / temperature
    if 0 < top_k < scores.shape[-1]:
        kth = scores.topk(top_k, dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        ordered, order = scores.sort(dim=-1)  # ascending: the tail first
        tail = ordered.softmax(-1).cumsum(-1) <= 1 - top_p
        tail[:, -1] = False  # the likeliest token always stays
        scores = scores.masked_fill(tail.scatter(1, order, tail), float("-inf"))
    return scores.softmax(-1)


def next_tokens(
    logits: torch.Tensor,
    temperature: float,
    generator: torch.Generator | Sequence[torch.Generator] | None = None,
    top_p: float = 1.0,
    top_k: int = 0,
) -> torch.Tensor:
    """[rows] token ids from `logits` [rows, vocab]: the likeliest at temperature 0, else drawn
    from `next_token_probs` — with one generator per row when given a list of them, so that a
    row's draws do not depend on which rows share its batch."""
    if temperature > 0:
        probs = next_token_probs(logits, temperature, top_p, top_k)
        if isinstance(generator, Sequence):
            rows = [
                torch.multinomial(p[None], 1, generator=g)
                for p, g in zip(probs, generator, strict=True)
            ]
            return torch.cat(rows).squeeze(-1)
        return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return logits.argmax(-1)
