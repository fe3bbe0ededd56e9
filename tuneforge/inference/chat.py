"""`tuneforge chat`: a conversation with a trained run in the terminal. Each turn renders the
whole conversation with the tokenizer's chat template and streams the reply as it is decoded;
`/reset` starts over, `/exit` (or end of input) leaves."""

from collections.abc import Callable, Iterable

import torch

from tuneforge.data.chat import prompt_ids, stop_ids
from tuneforge.models.decoder import Decoder
from tuneforge.models.generate import stream

COMMANDS = "/reset starts a new conversation, /exit leaves"


def chat(
    model: Decoder,
    tokenizer,
    lines: Iterable[str],
    show: Callable[[str], None],
    system: str | None = None,
    max_new_tokens: int = 256,
    sampling: dict | None = None,
) -> list[dict[str, str]]:
    """Answer each line of `lines` (user turns) in one conversation, passing the reply's text
    to `show` piece by piece as it is decoded; the conversation at the end."""
    sampling = dict(sampling or {})
    seed = sampling.pop("seed", 0)
    generator = torch.Generator(device=model.lm_head.weight.device).manual_seed(seed)
    stops = set(stop_ids(tokenizer))
    opening = [{"role": "system", "content": system}] if system else []
    messages = list(opening)
    for line in lines:
        text = line.strip()
        if text == "/exit":
            break
        if text == "/reset":
            messages = list(opening)
            show("(a new conversation)\n")
            continue
        if not text:
            continue
        messages.append({"role": "user", "content": text})
        ids = prompt_ids(tokenizer, messages)
        reply: list[int] = []
        shown = ""
        for token in stream(model, ids, max_new_tokens, stops, generator=generator, **sampling):
            reply.append(token)
            decoded = tokenizer.decode(reply, skip_special_tokens=True)
            if not decoded.endswith("\ufffd"):  # a character still being spelled out in bytes
                show(decoded[len(shown) :])
                shown = decoded
        final = tokenizer.decode(reply, skip_special_tokens=True)
        show(final[len(shown) :] + "\n")
        messages.append({"role": "assistant", "content": final})
    return messages
