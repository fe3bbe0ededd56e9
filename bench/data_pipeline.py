"""Benchmark: read, validate, render, tokenise and pack N synthetic records (CPU).

python bench/data_pipeline.py --records 1000000 --workers 8
"""

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

from transformers import AutoTokenizer

from tuneforge.assets import DEMO_TOKENIZER_DIR
from tuneforge.data.bin_packing import best_fit_decreasing, first_fit_decreasing
from tuneforge.data.chat import Rendering
from tuneforge.data.dataset import build_examples
from tuneforge.data.reading import read_conversations

WORDS = [
    "the",
    "model",
    "learns",
    "to",
    "sort",
    "reverse",
    "add",
    "count",
    "letters",
    "digits",
    "quickly",
    "and",
    "exactly",
]


def synthetic(count: int, file: Path) -> None:
    rng = random.Random(0)
    with file.open("w") as handle:
        for _ in range(count):
            question = " ".join(rng.choices(WORDS, k=max(1, int(rng.lognormvariate(2.5, 0.8)))))
            answer = " ".join(rng.choices(WORDS, k=max(1, int(rng.lognormvariate(3.0, 0.8)))))
            handle.write(json.dumps({"instruction": question, "output": answer}) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--budget", type=int, default=4096)
    parser.add_argument("--workers", type=int, default=0, help="tokenising processes (0: this one)")
    args = parser.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(DEMO_TOKENIZER_DIR)
    with tempfile.TemporaryDirectory() as tmp:
        file = Path(tmp) / "data.jsonl"
        synthetic(args.records, file)
        start = time.perf_counter()
        conversations, _ = read_conversations(file, "alpaca")
        read_s = time.perf_counter() - start
        start = time.perf_counter()
        examples, stats = build_examples(
            conversations, tokenizer, 2048, "drop", Rendering(), workers=args.workers
        )
        tokenize_s = time.perf_counter() - start
        lengths = [len(example.input_ids) for example in examples]
        timings = {}
        for packer in (first_fit_decreasing, best_fit_decreasing):
            start = time.perf_counter()
            bins = packer(lengths, args.budget)
            timings[packer.__name__] = (
                time.perf_counter() - start,
                sum(lengths) / (len(bins) * args.budget),
            )
    print(f"records {args.records:,}  tokens {stats.num_tokens:,}")
    print(f"read + validate   {read_s:8.1f} s  {args.records / read_s:10,.0f} records/s")
    print(
        f"render + tokenise {tokenize_s:8.1f} s  ({args.workers} workers)  {args.records / tokenize_s:10,.0f} records/s"
    )
    for name, (seconds, efficiency) in timings.items():
        print(f"{name:24s} {seconds:6.1f} s  efficiency {efficiency:.2%}")


if __name__ == "__main__":
    main()
