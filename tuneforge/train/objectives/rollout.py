"""GRPO's rollouts: the prompts of a batch read from the loader (each document up to its last
reply, which is the record's reference answer), `num_generations` completions of each sampled
by the policy with the key/value cache, and the batch the policy trains on — each prompt with
each of its completions, the completion's tokens (its end-of-turn token included) supervised."""

import itertools
import time
from dataclasses import dataclass

import torch

from tuneforge.data.packing import IGNORE_INDEX, PackedBatch, collate, make_example
from tuneforge.models.decoder import Decoder
from tuneforge.models.generate import generate


@dataclass
class Prompts:
    ids: list[list[int]]
    answers: list[list[int] | None]
    """Each prompt's reference reply: the tokens its record's last reply was trained on (None
    for a record of a prompt alone)."""
    fields: list[dict[str, object]]
    """Each prompt's record fields beyond its messages (empty where none are kept)."""


def prompts_of(batch: PackedBatch) -> Prompts:
    """Each document of `batch` split before its last run of supervised tokens; a record's
    document without any (a prompt alone) whole."""
    tokens = batch.tokens.tolist()
    labels = batch.labels.tolist()
    cu = batch.packed.cu_seqlens.tolist()
    records = batch.record_fields or []
    prompts: list[list[int]] = []
    answers: list[list[int] | None] = []
    fields: list[dict[str, object]] = []
    for document, (start, end) in enumerate(itertools.pairwise(cu)):
        rows = [t for t in range(start, end) if labels[t] != IGNORE_INDEX]
        if not rows:
            if document < len(records):  # a prompt alone (else a fixed shape's padding)
                real = batch.row_lengths[document] if batch.row_lengths else end - start
                prompts.append(tokens[start : start + real])
                answers.append(None)
                fields.append(records[document])
            continue
        first = rows[-1]
        while first - 1 >= start and labels[first - 1] != IGNORE_INDEX:
            first -= 1
        prompts.append(tokens[start : first + 1])
        answers.append([labels[t] for t in range(first, rows[-1] + 1)])
        fields.append(records[document] if document < len(records) else {})
    return Prompts(prompts, answers, fields)


@dataclass
class Rollout:
    prompts: list[list[int]]
    """Each completion's prompt (a prompt once per completion of its group)."""
    completions: list[list[int]]
    """Sampled tokens, ending with the end-of-turn token where the completion reached it."""
    seconds: float
    """Wall time of the sampling."""


@torch.no_grad()
def sample(
    model: Decoder,
    prompts: list[list[int]],
    group: int,
    max_new_tokens: int,
    stop: set[int],
    generator: torch.Generator,
    temperature: float,
    top_p: float,
    top_k: int,
) -> Rollout:
    """`group` completions of each prompt, the model in evaluation mode (no dropout); each
    prompt is prefilled once."""
    repeated = [prompt for prompt in prompts for _ in range(group)]
    was_training = model.training
    model.eval()
    device = model.lm_head.weight.device
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    started = time.perf_counter()
    try:
        completions = generate(
            model, prompts, max_new_tokens, stop, temperature, generator, top_p, top_k, True, group
        )
    finally:
        model.train(was_training)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return Rollout(repeated, completions, time.perf_counter() - started)


def training_batch(rollout: Rollout) -> PackedBatch:
    """Each prompt followed by its completion, one document each, the completion's tokens
    supervised."""
    examples = [
        make_example(prompt + completion, [False] * len(prompt) + [True] * len(completion))
        for prompt, completion in zip(rollout.prompts, rollout.completions, strict=True)
    ]
    return collate(examples)
