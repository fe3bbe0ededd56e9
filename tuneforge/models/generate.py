"""Decoding for evaluation, the demo, GRPO's sampling and `tuneforge generate`: greedy or
sampled, many prompts at once, with a key/value cache (prompts are prefilled as one packed
batch; on a GPU each decode step is one CUDA graph's replay, `captured_decode.py`)."""

from collections.abc import Iterator, Sequence

import torch

from tuneforge.models.captured_decode import decode_step
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
    # the tokens stay on the device until the end: the host waits for it only every
    # STOP_CHECK_STEPS steps, to see whether every row has ended
    drawn = torch.empty(rows, max_new_tokens, dtype=torch.long, device=device)
    stops = torch.tensor(sorted(stop_ids), dtype=torch.long, device=device)
    ended = torch.zeros(rows, dtype=torch.bool, device=device)
    decode = decode_step(model, cache)
    check_every = 1 if device.type == "cpu" else STOP_CHECK_STEPS  # a CPU has nothing to overlap
    steps = 0
    logits = model.lm_head(last_hidden).float()
    for steps in range(1, max_new_tokens + 1):
        next_ids = next_tokens(logits, temperature, generator, top_p, top_k)
        drawn[:, steps - 1] = next_ids
        ended |= torch.isin(next_ids, stops)
        if steps == max_new_tokens or (steps % check_every == 0 and bool(ended.all())):
            break
        logits = decode(next_ids)
    return [replied(row, stop_ids, keep_stop) for row in drawn[:, :steps].tolist()]


STOP_CHECK_STEPS = 8
"""Decode steps between the host's looks at whether every row has ended, on an accelerator
(each look waits for it; a row that ended meanwhile decodes a few tokens more, dropped)."""


def replied(drawn: list[int], stop_ids: set[int], keep_stop: bool) -> list[int]:
    """A row's reply: its tokens up to its first stop token (with it, where `keep_stop`)."""
    for index, token in enumerate(drawn):
        if token in stop_ids:
            return drawn[: index + 1] if keep_stop else drawn[:index]
    return drawn


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
