"""Generate the GRPO demo's prompts: fresh questions of the demo's tasks, none of them in the
demo's training or held-out data (the SFT model has not seen them, and reinforcement learning
has something to learn from them), each with its answer for the `exact_match` reward.

    python -m tuneforge.assets.build_demo_prompts
"""

import json
import random

from tuneforge.assets import DEMO_DATA_DIR
from tuneforge.assets.build_demo import TASKS, write_jsonl

SEED = 2468
NUM_PROMPTS = 4000


def fresh_records(seen: set[str], count: int, rng: random.Random) -> list[dict]:
    records: list[dict] = []
    while len(records) < count:
        prompt, answer = rng.choice(TASKS)(rng)
        if prompt not in seen:
            seen.add(prompt)
            records.append(
                {
                    "messages": [
                        {"role": "user", "content": prompt},
                        {"role": "assistant", "content": answer},
                    ]
                }
            )
    return records


def main() -> None:
    seen = set()
    for name in ("train.jsonl", "eval.jsonl"):
        for line in (DEMO_DATA_DIR / name).read_text().splitlines():
            seen.add(json.loads(line)["messages"][0]["content"])
    records = fresh_records(seen, NUM_PROMPTS, random.Random(SEED))
    write_jsonl(records, DEMO_DATA_DIR / "grpo_prompts.jsonl")


if __name__ == "__main__":
    main()
