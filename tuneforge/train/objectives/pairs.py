"""Preference pairs in a packed batch (`data/pairs.py`: the chosen document, then the rejected
one): each reply's log-probability summed over its supervised tokens, with its token count, and
the reference a preference objective compares against."""

import copy
import logging
from abc import ABC, abstractmethod
from typing import Any, NamedTuple

import torch

from tuneforge.data.packing import IGNORE_INDEX, PackedBatch
from tuneforge.models.decoder import Decoder
from tuneforge.parallel.distributed import shard_frozen
from tuneforge.peft.apply import adapters_disabled
from tuneforge.train.objectives.seam import Metric
from tuneforge.train.sequence_logps import document_sums, token_logps

log = logging.getLogger(__name__)

REWARD_METRICS = (
    Metric("rewards_chosen"),
    Metric("rewards_rejected"),
    Metric("reward_margin"),
    Metric("reward_accuracy", percent=True, headline=True),
)


def reward_sums(chosen: torch.Tensor, rejected: torch.Tensor) -> dict[str, torch.Tensor]:
    """`REWARD_METRICS` summed over the pairs, from each pair's (detached) rewards."""
    return {
        "rewards_chosen": chosen.sum(),
        "rewards_rejected": rejected.sum(),
        "reward_margin": (chosen - rejected).sum(),
        "reward_accuracy": (chosen > rejected).float().sum(),
    }


class PairLogps(NamedTuple):
    """Per pair [P]: the replies' summed log-probabilities and their supervised token counts."""

    chosen: torch.Tensor
    rejected: torch.Tensor
    chosen_tokens: torch.Tensor
    rejected_tokens: torch.Tensor

    @property
    def chosen_mean(self) -> torch.Tensor:
        """Per pair: the chosen reply's mean log-probability per token, in fp32."""
        return self.chosen.float() / self.chosen_tokens.clamp(min=1)

    @property
    def rejected_mean(self) -> torch.Tensor:
        return self.rejected.float() / self.rejected_tokens.clamp(min=1)


def token_counts(batch: PackedBatch) -> torch.Tensor:
    """[documents]: each document's supervised tokens."""
    return document_sums((batch.labels != IGNORE_INDEX).float(), batch.packed.cu_seqlens)


def chosen_tokens(batch: PackedBatch) -> torch.Tensor:
    """0-d, on the batch's device: the supervised tokens of its chosen replies."""
    return token_counts(batch)[0::2].sum()


def as_pairs(per_document: torch.Tensor, counts: torch.Tensor) -> PairLogps:
    return PairLogps(per_document[0::2], per_document[1::2], counts[0::2], counts[1::2])


def document_logps(
    hidden: torch.Tensor, model: Decoder, batch: PackedBatch, chunk_tokens: int
) -> torch.Tensor:
    """[documents] fp32: each document's summed log-probability of its supervised tokens, from
    the model's last hidden states."""
    logps = token_logps(hidden, model.lm_head.weight, batch.labels, chunk_tokens)
    return document_sums(logps, batch.packed.cu_seqlens)


def pair_logps_of_hidden(
    hidden: torch.Tensor, model: Decoder, batch: PackedBatch, chunk_tokens: int
) -> PairLogps:
    """Each pair's replies' summed log-probabilities from the model's last hidden states."""
    return as_pairs(document_logps(hidden, model, batch, chunk_tokens), token_counts(batch))


def model_token_logps(
    model: Decoder, batch: PackedBatch, chunk_tokens: int, temperature: float = 1.0
) -> torch.Tensor:
    """[tokens] fp32: each supervised token's log-probability under `model` at `temperature`
    (0 elsewhere)."""
    hidden = model.hidden_states(batch.tokens, batch.packed)
    return token_logps(hidden, model.lm_head.weight, batch.labels, chunk_tokens, temperature)


def pair_logps(model: Decoder, batch: PackedBatch, chunk_tokens: int) -> PairLogps:
    hidden = model.hidden_states(batch.tokens, batch.packed)
    return pair_logps_of_hidden(hidden, model, batch, chunk_tokens)


class Reference(ABC):
    """The reference model's log-probabilities of a batch's replies, without gradients."""

    @abstractmethod
    def logps(self, batch: PackedBatch, chunk_tokens: int) -> PairLogps: ...

    def resume_state(self) -> dict[str, Any]:
        """What a resume needs to hold the same reference (JSON values)."""
        return {}


class AdaptersOffReference(Reference):
    """The policy itself with its adapters disabled: the base a fresh adapter starts from."""

    def __init__(self, model: Decoder) -> None:
        self.model = model

    @torch.no_grad()
    def logps(self, batch: PackedBatch, chunk_tokens: int) -> PairLogps:
        with adapters_disabled(self.model):
            return pair_logps(self.model, batch, chunk_tokens)

    @torch.no_grad()
    def token_logps(
        self, batch: PackedBatch, chunk_tokens: int, temperature: float = 1.0
    ) -> torch.Tensor:
        """[tokens]: each supervised token's log-probability at `temperature` (0 elsewhere)."""
        with adapters_disabled(self.model):
            return model_token_logps(self.model, batch, chunk_tokens, temperature)


class FrozenCopyReference(Reference):
    """A frozen copy of the model as it is now (full fine-tuning, or an adapter that continues
    an earlier one); sharded like the trained model under FSDP2."""

    def __init__(self, model: Decoder, sharded: bool = False) -> None:
        self.model = copy.deepcopy(model).requires_grad_(False).eval()
        if sharded:
            shard_frozen(self.model.layers, self.model.lm_head.weight.dtype)

    @torch.no_grad()
    def logps(self, batch: PackedBatch, chunk_tokens: int) -> PairLogps:
        return pair_logps(self.model, batch, chunk_tokens)

    @torch.no_grad()
    def token_logps(
        self, batch: PackedBatch, chunk_tokens: int, temperature: float = 1.0
    ) -> torch.Tensor:
        return model_token_logps(self.model, batch, chunk_tokens, temperature)


def starting_model(
    model: Decoder, kind: str, sharded: bool
) -> AdaptersOffReference | FrozenCopyReference:
    """The model as training started, held as `kind` says (`config/objectives/declaration.py`:
    `adapters_off` or `frozen_copy`)."""
    if kind == "adapters_off":
        return AdaptersOffReference(model)
    if sharded:
        log.info("reference: the frozen copy's blocks sharded across the ranks")
    return FrozenCopyReference(model, sharded)
