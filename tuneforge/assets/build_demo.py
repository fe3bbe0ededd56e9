"""Generate the bundled demo data and train the demo tokenizer on it.

    python -m tuneforge.assets.build_demo

The tasks are deterministic (reverse, sort, add, max, min, last), so a tiny
randomly initialised model can learn them on a CPU in minutes and exact-match accuracy is
meaningful. The tokenizer is a byte-level BPE with a ChatML template, saved in the Hugging Face
layout so that `transformers.AutoTokenizer` loads it.
"""

import json
import random
from collections.abc import Callable
from pathlib import Path

from tuneforge.assets import DEMO_DATA_DIR, DEMO_TOKENIZER_DIR

SEED = 1234
NUM_TRAIN = 20000
NUM_EVAL = 300
VOCAB_SIZE = 512
LETTERS = "abcdefghijklmnopqrstuvwxyz"
DIGITS = "0123456789"
MIN_ITEMS, MAX_ITEMS = 2, 4

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
"""Llama 3's pre-tokenizer pattern, as its tokenizer.json has it: numbers in groups of up to
three digits, which the tiny model adds more easily than digit by digit."""


def _items(rng: random.Random, alphabet: str) -> list[str]:
    return [rng.choice(alphabet) for _ in range(rng.randint(MIN_ITEMS, MAX_ITEMS))]


def _reverse(rng: random.Random) -> tuple[str, str]:
    items = _items(rng, LETTERS)
    return "reverse: " + " ".join(items), " ".join(reversed(items))


def _sort(rng: random.Random) -> tuple[str, str]:
    items = _items(rng, DIGITS)
    return "sort: " + " ".join(items), " ".join(sorted(items))


def _add(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randint(0, 9), rng.randint(0, 9)
    return f"add: {a} + {b}", str(a + b)


def _max(rng: random.Random) -> tuple[str, str]:
    items = _items(rng, DIGITS)
    return "max: " + " ".join(items), max(items)


def _min(rng: random.Random) -> tuple[str, str]:
    items = _items(rng, DIGITS)
    return "min: " + " ".join(items), min(items)


def _last(rng: random.Random) -> tuple[str, str]:
    items = _items(rng, LETTERS)
    return "last: " + " ".join(items), items[-1]


TASKS: list[Callable[[random.Random], tuple[str, str]]] = [
    _reverse,
    _sort,
    _add,
    _max,
    _min,
    _last,
]


def make_records(seed: int = SEED) -> tuple[list[dict], list[dict]]:
    """Train and held-out records in OpenAI messages format; no held-out prompt is in train."""
    rng = random.Random(seed)
    seen: set[str] = set()
    evaluation: list[dict] = []
    while len(evaluation) < NUM_EVAL:
        prompt, answer = rng.choice(TASKS)(rng)
        if prompt not in seen:
            seen.add(prompt)
            evaluation.append(_record(prompt, answer))
    train: list[dict] = []
    while len(train) < NUM_TRAIN:
        prompt, answer = rng.choice(TASKS)(rng)
        if prompt not in seen:
            train.append(_record(prompt, answer))
    return train, evaluation


def _record(prompt: str, answer: str) -> dict:
    return {
        "messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]
    }


def write_jsonl(records: list[dict], file: Path) -> None:
    file.parent.mkdir(parents=True, exist_ok=True)
    with file.open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record) + "\n")


def train_tokenizer(records: list[dict], out_dir: Path) -> None:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(ignore_merges=True))
    # Trained on Llama 3's pieces with their spaces split off, so that no merge joins a space to
    # what follows: a letter is the same token in a prompt and in a reply, and copying tasks
    # become token copies, which a tiny model learns quickly.
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
            pre_tokenizers.Split(" ", behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = [message["content"] for record in records for message in record["messages"]]
    tokenizer.train_from_iterator([*texts, "user", "assistant", "system"], trainer)
    # Used with Llama 3's split (whole pieces before merges, as Llama 3's tokenizer), which
    # llama.cpp knows, so a GGUF file tokenises as training did; without a merge that joins a
    # space, " b" still becomes the tokens " " and "b".
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    fast.chat_template = CHATML_TEMPLATE
    fast.save_pretrained(str(out_dir))


def main() -> None:
    train, evaluation = make_records()
    write_jsonl(train, DEMO_DATA_DIR / "train.jsonl")
    write_jsonl(evaluation, DEMO_DATA_DIR / "eval.jsonl")
    train_tokenizer(train, DEMO_TOKENIZER_DIR)
    print(
        f"wrote {len(train)} train and {len(evaluation)} eval records, tokenizer in {DEMO_TOKENIZER_DIR}"
    )


if __name__ == "__main__":
    main()
