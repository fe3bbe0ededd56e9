"""A reward model's scalar head: one linear map of the final hidden state to a score, read at
each document's last token that is not the padding token — where transformers'
`...ForSequenceClassification` with one label reads it, so a checkpoint written in that layout
scores as here. The head sits on the decoder as `score` (its Hugging Face name)."""

from typing import Any

import torch
from torch import nn

from tuneforge.models.decoder import Decoder
from tuneforge.sequence_classifier import ARCHITECTURE_SUFFIX

SCORE_WEIGHT = "score.weight"
INITIALIZER_RANGE = 0.02
"""The standard deviation of a fresh head (transformers' default `initializer_range`)."""


class ScoreHead(nn.Linear):
    def __init__(self, dim: int, pad_token_id: int | None, dtype: torch.dtype) -> None:
        super().__init__(dim, 1, bias=False, dtype=dtype)
        self.pad_token_id = pad_token_id
        """The token a score is never read at (config.json's `pad_token_id`)."""


def score_head_of(model: nn.Module) -> ScoreHead | None:
    head = getattr(model, "score", None)
    return head if isinstance(head, ScoreHead) else None


def attach_score_head(
    model: Decoder, pad_token_id: int | None, generator: torch.Generator | None = None
) -> ScoreHead:
    """A fresh head on `model` (fp32, normal as transformers initialises one), or the one it
    has."""
    head = score_head_of(model)
    if head is None:
        device = model.embed.weight.device
        head = ScoreHead(model.args.dim, pad_token_id, torch.float32).to(device)
        with torch.no_grad():
            head.weight.normal_(0.0, INITIALIZER_RANGE, generator=generator)
        model.score = head
    return head


def last_scored_positions(tokens: torch.Tensor, cu_seqlens: torch.Tensor, pad: int | None):
    """[documents] index into `tokens` of each document's last token that is not `pad` (its
    first token where every one is)."""
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    document = torch.repeat_interleave(torch.arange(lengths.numel(), device=tokens.device), lengths)
    position = torch.arange(tokens.numel(), device=tokens.device)
    starts = cu_seqlens[:-1].long()
    if pad is not None:
        position = torch.where(tokens != pad, position, starts[document])
    return torch.full_like(starts, -1).scatter_reduce(0, document, position, "amax")


def sequence_scores(
    head: ScoreHead, hidden: torch.Tensor, tokens: torch.Tensor, cu_seqlens: torch.Tensor
) -> torch.Tensor:
    """fp32 [documents]: each document's score (`hidden`: the final normalised states [T, D])."""
    last = hidden.index_select(0, last_scored_positions(tokens, cu_seqlens, head.pad_token_id))
    return head(last.to(head.weight.dtype)).squeeze(-1).float()


def scorer_config(config: dict[str, Any], pad_token_id: int | None) -> dict[str, Any]:
    """`config` (a causal LM's config.json) as a one-label sequence classifier's."""
    architectures = [
        str(name).removesuffix("ForCausalLM") + ARCHITECTURE_SUFFIX
        for name in config.get("architectures", [])
    ]
    return config | {
        "architectures": architectures,
        "num_labels": 1,
        "id2label": {"0": "LABEL_0"},
        "label2id": {"LABEL_0": 0},
        "pad_token_id": pad_token_id,
    }
