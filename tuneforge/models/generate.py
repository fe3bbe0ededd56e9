"""Decoding for evaluation and the demo: greedy or sampled, many prompts at once.

Prompts travel as one packed stream; each new token re-runs the stream (no KV cache),
which is simple and exact, and fast enough for short replies of small models.
"""

import torch

from tuneforge.models.decoder import Decoder
from tuneforge.models.packed import PackedSequences


@torch.no_grad()
def generate(
    model: Decoder,
    prompts: list[list[int]],
    max_new_tokens: int,
    stop_ids: set[int],
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
) -> list[list[int]]:
    """New tokens for each prompt, ending at (and excluding) the first stop token."""
    device = next(model.parameters()).device
    sequences = [list(prompt) for prompt in prompts]
    replies: list[list[int]] = [[] for _ in prompts]
    active = list(range(len(prompts)))
    for _ in range(max_new_tokens):
        if not active:
            break
        lengths = [len(sequences[i]) for i in active]
        tokens = torch.tensor([t for i in active for t in sequences[i]], device=device)
        packed = PackedSequences.from_lengths(lengths, device)
        hidden = model.hidden_states(tokens, packed)
        last = packed.cu_seqlens[1:].long() - 1
        logits = model.lm_head(hidden.index_select(0, last)).float()
        if temperature > 0:
            probs = torch.softmax(logits / temperature, dim=-1)
            next_ids = torch.multinomial(probs, 1, generator=generator).squeeze(-1).tolist()
        else:
            next_ids = logits.argmax(-1).tolist()
        still_active = []
        for i, token in zip(active, next_ids, strict=True):
            if token in stop_ids:
                continue
            sequences[i].append(token)
            replies[i].append(token)
            still_active.append(i)
        active = still_active
    return replies
