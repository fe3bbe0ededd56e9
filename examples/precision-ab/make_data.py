"""Long-tailed chat data for the precision A/B: conversations of the demo's tasks (reverse, sort,
add, max, min, last), each a log-normal number of turns (median 8, some over a hundred), so that
lengths run from a few dozen tokens to a few thousand as real chat data does.

    python examples/precision-ab/make_data.py        # writes examples/precision-ab/data/
"""

import json
import math
import random
from pathlib import Path

from tuneforge.assets.build_demo import TASKS

HERE = Path(__file__).parent
RECORDS = {"train.jsonl": 6000, "eval.jsonl": 200}
MEDIAN_TURNS, SIGMA, MAX_TURNS = 8, 1.0, 160


def conversation(rng: random.Random) -> dict:
    turns = min(MAX_TURNS, max(1, round(rng.lognormvariate(math.log(MEDIAN_TURNS), SIGMA))))
    messages = []
    for _ in range(turns):
        prompt, answer = rng.choice(TASKS)(rng)
        messages += [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]
    return {"messages": messages}


def main() -> None:
    out = HERE / "data"
    out.mkdir(exist_ok=True)
    for seed, (name, count) in enumerate(RECORDS.items()):
        rng = random.Random(seed)
        lines = [json.dumps(conversation(rng)) for _ in range(count)]
        (out / name).write_text("\n".join(lines) + "\n")
        print(f"written {out / name}: {count} conversations")


if __name__ == "__main__":
    main()
