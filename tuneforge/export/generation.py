"""The ids generation stops at: the tokenizer's end-of-sequence token and the token its chat
template ends an assistant reply with, which are often different (`<|im_end|>` and
`<|endoftext|>`, `<|eot_id|>` and `<|end_of_text|>`); an export that knows only one of them
makes a model that never stops."""

import json
from pathlib import Path

MARKER = "tuneforge-reply-marker"


def end_of_turn_id(tokenizer) -> int | None:
    """The first special token the chat template puts after an assistant reply."""
    if not tokenizer.chat_template:
        return None
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": MARKER}]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    if MARKER not in text:
        return None
    after = text[text.rindex(MARKER) + len(MARKER) :]
    special = set(tokenizer.all_special_ids) | {
        index for index, token in tokenizer.added_tokens_decoder.items() if token.special
    }
    ids = tokenizer(after, add_special_tokens=False)["input_ids"]
    return next((index for index in ids if index in special), None)


def stop_ids(tokenizer, configured: int | list[int] | None = None) -> list[int]:
    ids = [configured] if isinstance(configured, int) else list(configured or [])
    for extra in (tokenizer.eos_token_id, end_of_turn_id(tokenizer)):
        if extra is not None and extra not in ids:
            ids.append(extra)
    return ids


def generation_config(base: Path, tokenizer, model_config: dict) -> dict:
    """The base's generation config with every stop id present, bos and pad filled in."""
    file = base / "generation_config.json"
    config = json.loads(file.read_text()) if file.is_file() else {}
    eos = stop_ids(tokenizer, config.get("eos_token_id", model_config.get("eos_token_id")))
    if eos:
        config["eos_token_id"] = eos[0] if len(eos) == 1 else eos
    for key, value in (
        ("bos_token_id", tokenizer.bos_token_id),
        ("pad_token_id", tokenizer.pad_token_id),
    ):
        if value is not None:
            config.setdefault(key, value)
    return config
