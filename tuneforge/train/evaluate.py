"""Held-out loss and exact-match accuracy of greedy replies."""

import math
from dataclasses import dataclass, field

import torch

from tuneforge.data.chat import prompt_ids, stop_ids
from tuneforge.data.packing import PackedBatch
from tuneforge.data.records import Conversation
from tuneforge.models.decoder import Decoder
from tuneforge.models.generate import generate
from tuneforge.train.objectives.seam import Metric, loss_value, metric_values, objective_of


@dataclass
class EvalResult:
    loss: float
    num_tokens: int
    """Units the loss is averaged over: supervised tokens (SFT), pairs (preference training)."""
    metrics: dict[str, float] = field(default_factory=dict)
    """The objective's own metrics, averaged over the same units (e.g. `reward_accuracy`)."""
    shown: tuple[Metric, ...] = ()
    """How each of `metrics` is shown."""

    @property
    def perplexity(self) -> float:
        return math.exp(min(self.loss, 50.0))


@torch.no_grad()
def evaluate_loss(
    objective: torch.nn.Module, batches: list[PackedBatch], device: torch.device
) -> EvalResult:
    """Mean token loss over `batches`, run through the training objective (so that under DDP or
    FSDP every rank takes part)."""
    was_training = objective.training
    objective.eval()
    every = objective_of(objective).metrics
    names = tuple(metric.name for metric in every)
    total, token_total, count, token_count = 0.0, 0.0, 0, 0.0
    sums = dict.fromkeys(names, 0.0)
    for batch in batches:
        batch = batch.to(device)
        output = objective(batch)
        total += float(output.loss_sum)
        if output.token_loss_sum is not None:
            token_total += float(output.token_loss_sum)
        for name in names:
            sums[name] += float(output.metrics[name])
        count += objective_of(objective).units(batch)
        token_count += float(objective_of(objective).token_units(batch))
    objective.train(was_training)
    units = max(count, 1)
    values = metric_values(every, sums, units)
    averages = {
        metric.name: value
        for metric in every
        if metric.held_out and (value := values[metric.name]) is not None
    }
    shown = tuple(metric for metric in every if metric.name in averages)
    loss = loss_value(total, token_total, units, token_count)
    return EvalResult(loss, count, averages, shown)


@dataclass
class AccuracyResult:
    num_correct: int
    num_total: int
    examples: list[tuple[str, str, str]]
    """A few (prompt, expected, generated) triples."""

    @property
    def accuracy(self) -> float:
        return self.num_correct / max(self.num_total, 1)


@torch.no_grad()
def exact_match(
    model: Decoder,
    tokenizer,
    conversations: list[Conversation],
    max_new_tokens: int,
    batch_size: int = 64,
) -> AccuracyResult:
    """Answer each conversation's last user turn greedily; compare with its final assistant reply."""
    was_training = model.training
    model.eval()
    prompts: list[list[int]] = []
    shown_prompts: list[str] = []
    references: list[str] = []
    for conversation in conversations:
        if conversation.text is not None or conversation.is_prompt:
            continue  # raw text and a prompt alone have no reply to compare
        messages = conversation.messages
        last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
        prompts.append(prompt_ids(tokenizer, messages[:last]))
        references.append(messages[last]["content"].strip())
        asked = [m["content"] for m in messages[:last] if m["role"] == "user"]
        shown_prompts.append(asked[-1] if asked else "")
    stop = stop_ids(tokenizer)
    replies: list[str] = []
    for start in range(0, len(prompts), batch_size):
        for reply in generate(model, prompts[start : start + batch_size], max_new_tokens, stop):
            replies.append(tokenizer.decode(reply, skip_special_tokens=True).strip())
    model.train(was_training)
    answered = list(zip(shown_prompts, references, replies, strict=True))
    correct = sum(reply == reference for _, reference, reply in answered)
    return AccuracyResult(correct, len(references), answered[:5])
