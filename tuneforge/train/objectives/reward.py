"""A reward model as an objective (Bradley–Terry on preference pairs, as TRL's `RewardTrainer`
computes it): each conversation's score is the scalar head's value at its last token that is
not padding, and a pair's loss is −log σ(r_chosen − r_rejected − margin), plus
c·(r_chosen + r_rejected)² with `center_rewards_coefficient` c; summed over the pairs (the step
divides by its pairs). No output layer runs: the head reads the final hidden states."""

import torch
import torch.nn.functional as F

from tuneforge.config.objectives.reward import REWARD
from tuneforge.data.packing import PackedBatch
from tuneforge.data.pairs import MARGIN
from tuneforge.models.decoder import Decoder
from tuneforge.models.score_head import attach_score_head, score_head_of, sequence_scores
from tuneforge.train.objectives.component import ObjectiveComponent, ObjectiveSetup
from tuneforge.train.objectives.pairs import REWARD_METRICS, reward_sums
from tuneforge.train.objectives.seam import Objective, ObjectiveOutput, hidden_states_and_aux


def reward_model_loss(
    chosen: torch.Tensor,
    rejected: torch.Tensor,
    margin: torch.Tensor | None = None,
    center_coefficient: float | None = None,
) -> torch.Tensor:
    """Per pair [P], fp32: the Bradley–Terry loss, with the margin and the centring term."""
    difference = chosen - rejected
    if margin is not None:
        difference = difference - margin
    loss = -F.logsigmoid(difference)
    if center_coefficient is not None:
        loss = loss + center_coefficient * (chosen + rejected) ** 2
    return loss


def pair_margins(batch: PackedBatch, device: torch.device) -> torch.Tensor | None:
    """[P] each pair's margin (0 where its record has none); None where no record has one."""
    if batch.record_fields is None:
        return None
    values = [fields.get(MARGIN) for fields in batch.record_fields[0::2]]
    if all(value is None for value in values):
        return None
    margins = [0.0 if value is None else float(value) for value in values]  # type: ignore[arg-type]
    return torch.tensor(margins, dtype=torch.float32).to(device, non_blocking=True)


class RewardModelObjective(Objective):
    metrics = REWARD_METRICS

    def __init__(self, model: Decoder, center_coefficient: float | None) -> None:
        super().__init__(model)  # the head is the model's (`model.score`), saved with it
        self.center_coefficient = center_coefficient

    def units(self, batch: PackedBatch) -> int:
        return batch.num_documents // 2

    def forward(self, batch: PackedBatch) -> ObjectiveOutput:
        hidden, aux = hidden_states_and_aux(self.model, batch)
        head = score_head_of(self.model)
        assert head is not None
        scores = sequence_scores(head, hidden, batch.tokens, batch.packed.cu_seqlens)
        chosen, rejected = scores[0::2], scores[1::2]
        margin = pair_margins(batch, scores.device)
        loss = reward_model_loss(chosen, rejected, margin, self.center_coefficient)
        return ObjectiveOutput(loss.sum(), aux, reward_sums(chosen.detach(), rejected.detach()))


def build(setup: ObjectiveSetup) -> RewardModelObjective:
    """The objective, with a score head on the model: the checkpoint's own (a reward model
    trained further), else a fresh one seeded by the run's seed. The head is trained in fp32."""
    config, model = setup.config, setup.model
    pad = None if setup.tokenizer is None else scoring_pad_id(setup.tokenizer)
    generator = torch.Generator(device=setup.device).manual_seed(config.train.seed + 2)
    head = attach_score_head(model, pad, generator)
    head.float().requires_grad_(True)
    return RewardModelObjective(model, config.reward.center_rewards_coefficient)


def scoring_pad_id(tokenizer) -> int | None:
    """The token a score is not read at: the tokenizer's padding token, else its end of
    sequence (as TRL's RewardTrainer sets a model's `pad_token_id`)."""
    pad = tokenizer.pad_token_id
    return tokenizer.eos_token_id if pad is None else pad


COMPONENT = ObjectiveComponent(REWARD, build)
