"""A reward model as one of GRPO's reward functions (`{function: model, path: DIR}`): each
prompt with its completion, rendered as a training conversation is (the prompt as rendered for
the reply, the reply, then the chat template's end of turn), tokenised by the reward model's
own tokenizer and scored — the completions of a sampling packed into batches of documents, on
the policy's device, without gradients."""

from pathlib import Path

import torch

from tuneforge.data.chat import MARKER
from tuneforge.errors import TuneforgeError
from tuneforge.models.hf.checkpoint import load_hf_model
from tuneforge.models.score_head import score_head_of, sequence_scores
from tuneforge.packed import PackedSequences

TOKENS_PER_BATCH = 16384
"""Tokens scored in one forward (a batch holds whole documents, at least one)."""


def end_of_turn_text(tokenizer) -> str:
    """What the chat template writes after an assistant's reply that ends the conversation."""
    messages = [{"role": "user", "content": "?"}, {"role": "assistant", "content": MARKER}]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    return rendered[rendered.index(MARKER) + len(MARKER) :]


def token_batches(documents: list[list[int]], budget: int) -> list[list[list[int]]]:
    """`documents` in order, in runs of at most `budget` tokens (a longer one alone)."""
    batches: list[list[list[int]]] = [[]]
    size = 0
    for document in documents:
        if batches[-1] and size + len(document) > budget:
            batches.append([])
            size = 0
        batches[-1].append(document)
        size += len(document)
    return batches


class ModelReward:
    def __init__(self, directory: Path, device: torch.device, dtype: str) -> None:
        from transformers import AutoTokenizer

        model = load_hf_model(directory, dtype)
        if not model.args.tie_embeddings:  # a classifier saves no output layer: hold none
            model.lm_head.weight = torch.nn.Parameter(torch.empty(0, model.args.dim))
        self.model = model.to(device).eval().requires_grad_(False)
        head = score_head_of(self.model)
        assert head is not None  # the configuration's rules checked its config.json
        self.head = head
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
        except (OSError, ValueError) as error:
            raise TuneforgeError(
                f"{directory}: the reward model's tokenizer cannot be loaded ({error}); a "
                "train.objective: reward run saves it beside the weights"
            ) from None
        self.end_of_turn = end_of_turn_text(self.tokenizer)
        self.device = device

    @torch.no_grad()
    def __call__(self, prompts: list[str], completions: list[str], **_: object) -> list[float]:
        texts = [p + c + self.end_of_turn for p, c in zip(prompts, completions, strict=True)]
        documents = [self.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
        scores: list[float] = []
        for batch in token_batches(documents, TOKENS_PER_BATCH):
            tokens = torch.tensor([t for d in batch for t in d], device=self.device)
            packed = PackedSequences.from_lengths([len(d) for d in batch], self.device)
            hidden = self.model.hidden_states(tokens, packed)
            scores += sequence_scores(self.head, hidden, tokens, packed.cu_seqlens).tolist()
        return scores
