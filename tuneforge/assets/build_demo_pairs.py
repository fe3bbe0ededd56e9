"""Generate the demo's preference pairs from its data: each reply as the chosen one, and the
same reply with one plausible mistake as the rejected one.

    python -m tuneforge.assets.build_demo_pairs

A mistake is what a half-trained model gets wrong on these tasks: two items of a list swapped,
another item of the prompt picked, a sum off by one."""

import json
import random
from pathlib import Path

from tuneforge.assets import DEMO_DATA_DIR

SEED = 4321
NUM_TRAIN = 3000


def mistake(prompt: str, reply: str, rng: random.Random) -> str:
    """`reply` with one error in it (never `reply` itself)."""
    task, _, question = prompt.partition(": ")
    items = reply.split()
    if task == "add":
        return str(int(reply) + rng.choice([-1, 1]) if int(reply) > 0 else 1)
    if len(items) > 1 and len(set(items)) > 1:
        while True:
            i, j = rng.sample(range(len(items)), 2)
            if items[i] != items[j]:
                items[i], items[j] = items[j], items[i]
                return " ".join(items)
    others = [item for item in question.split() if item != reply]
    if len(items) == 1 and others:
        return rng.choice(others)
    alphabet = "0123456789" if items[0].isdigit() else "abcdefghijklmnopqrstuvwxyz"
    items[rng.randrange(len(items))] = rng.choice([c for c in alphabet if c not in items])
    return " ".join(items)


def write_pairs(source: Path, target: Path, count: int | None, rng: random.Random) -> None:
    lines = source.read_text().splitlines()[:count]
    with target.open("w") as out:
        for line in lines:
            messages = json.loads(line)["messages"]
            prompt, reply = messages[0]["content"], messages[1]["content"]
            pair = {"prompt": prompt, "chosen": reply, "rejected": mistake(prompt, reply, rng)}
            out.write(json.dumps(pair) + "\n")


def main() -> None:
    rng = random.Random(SEED)
    write_pairs(DEMO_DATA_DIR / "train.jsonl", DEMO_DATA_DIR / "pairs_train.jsonl", NUM_TRAIN, rng)
    write_pairs(DEMO_DATA_DIR / "eval.jsonl", DEMO_DATA_DIR / "pairs_eval.jsonl", None, rng)


if __name__ == "__main__":
    main()
