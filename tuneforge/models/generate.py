"""Decoding for evaluation, the demo and `tuneforge generate`: greedy or sampled, many prompts
at once, with a key/value cache (prompts are prefilled as one packed batch)."""

from collections.abc import Iterator, Sequence

import torch

from tuneforge.models.decoder import Decoder
from tuneforge.models.sampling import next_tokens
from tuneforge.packed import PackedSequences


@torch.no_grad()
def generate(
    model: Decoder,
    prompts: list[list[int]],
    max_new_tokens: int,
    stop_ids: set[int],
    temperature: float = 0.0,
    generator: torch.Generator | Sequence[torch.Generator] | None = None,
    top_p: float = 1.0,
    top_k: int = 0,
    keep_stop: bool = False,
    copies: int = 1,
) -> list[list[int]]:
    """New tokens for each prompt, ending at (and excluding, unless `keep_stop`) the first stop
    token; greedy at temperature 0, else sampled (`sampling.next_token_probs`; a generator per
    reply, or one for all). With `copies`, each prompt is answered that many times (its replies
    one after another), the prompt prefilled once and its cache shared by its replies."""
    device = model.lm_head.weight.device
    lengths = [len(prompt) for prompt in prompts]
    cache = model.new_cache(len(prompts), max(lengths) + max_new_tokens)
    tokens = torch.tensor([t for prompt in prompts for t in prompt], device=device)
    packed = PackedSequences.from_lengths(lengths, device)
    hidden = model.hidden_states(tokens, packed, cache)
    last_hidden = hidden.index_select(0, packed.cu_seqlens[1:].long() - 1)
    if copies > 1:
        cache = cache.repeat_rows(copies)
        last_hidden = last_hidden.repeat_interleave(copies, dim=0)
    rows = len(prompts) * copies
    replies: list[list[int]] = [[] for _ in range(rows)]
    done = [False] * rows
    step_cu = torch.arange(rows + 1, dtype=torch.int32, device=device)
    for _ in range(max_new_tokens):
        logits = model.lm_head(last_hidden).float()
        next_ids = next_tokens(logits, temperature, generator, top_p, top_k)
        for row, token in enumerate(next_ids.tolist()):
            if not done[row]:
                done[row] = token in stop_ids
                if keep_stop or not done[row]:
                    replies[row].append(token)
        if all(done):
            break
        step = PackedSequences(step_cu, 1, cache.lengths.clone())
        last_hidden = model.hidden_states(next_ids, step, cache)
    return replies


@torch.no_grad()
def stream(
    model: Decoder,
    prompt: list[int],
    max_new_tokens: int,
    stop_ids: set[int],
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
    top_p: float = 1.0,
    top_k: int = 0,
) -> Iterator[int]:
    """One prompt's new tokens as they are decided (the tokens `generate` gives it), up to the
    first stop token: for showing a reply while it is written."""
    device = model.lm_head.weight.device
    cache = model.new_cache(1, len(prompt) + max_new_tokens)
    packed = PackedSequences.from_lengths([len(prompt)], device)
    hidden = model.hidden_states(torch.tensor(prompt, device=device), packed, cache)[-1:]
    step = torch.tensor([0, 1], dtype=torch.int32, device=device)
    for _ in range(max_new_tokens):
        token = next_tokens(model.lm_head(hidden).float(), temperature, generator, top_p, top_k)
        if int(token) in stop_ids:
            return
        yield int(token)
        hidden = model.hidden_states(token, PackedSequences(step, 1, cache.lengths.clone()), cache)
