"""`tuneforge chat`: a conversation with a trained run in the terminal. Each turn renders the
whole conversation with the tokenizer's chat template and streams the reply as it is decoded;
`/reset` starts over, `/exit` (or end of input) leaves."""

from collections.abc import Callable, Iterable

import torch

from tuneforge.data.chat import prompt_ids, stop_ids
from tuneforge.models.decoder import Decoder
from tuneforge.models.generate import stream

COMMANDS = "/reset starts a new conversation, /exit leaves"
NAMES = ("/reset", "/exit")


def chat(
    model: Decoder,
    tokenizer,
    lines: Iterable[str],
    show: Callable[[str], None],
    system: str | None = None,
    max_new_tokens: int = 256,
    sampling: dict | None = None,
    reply_prefix: str = "",
) -> list[dict[str, str]]:
    """Answer each line of `lines` (user turns) in one conversation, passing the reply's text
    to `show` piece by piece as it is decoded, after `reply_prefix`; the conversation at the
    end. Empty lines are skipped; an unknown /command, and a turn the model's context cannot
    hold with its reply, are answered with a note instead of by the model."""
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
        if text.startswith("/") and text.split()[0] not in NAMES and " " not in text.split()[0][1:]:
            show(f"(unknown command {text.split()[0]}: {COMMANDS})\n")
            continue
        ids = prompt_ids(tokenizer, [*messages, {"role": "user", "content": text}])
        context = model.args.max_position_embeddings
        if len(ids) + max_new_tokens > context:
            show(
                f"(the conversation would be {len(ids)} tokens and its reply up to "
                f"{max_new_tokens} more, beyond the model's context of {context}: /reset starts "
                "over, or send a shorter message)\n"
            )
            continue
        messages.append({"role": "user", "content": text})
        show(reply_prefix)
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
