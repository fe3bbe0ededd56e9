"""`train.objective: reward`: a reward model trained on preference pairs (Bradley–Terry), as
the configuration declares it: the `reward:` section and its rules. The trained model scores a
conversation with a scalar head on its last token and is saved as a one-label
`...ForSequenceClassification` checkpoint, which GRPO can use as a reward."""

from pydantic import Field

from tuneforge.config.objectives.declaration import ObjectiveDeclaration
from tuneforge.config.rules import model_split_refused, rule
from tuneforge.config.sections.base import Section


class RewardSection(Section):
    center_rewards_coefficient: float | None = Field(None, ge=0)
    """Adds this times the mean of (r_chosen + r_rejected)² over the pairs to the loss, pulling
    the scores towards mean zero (Eisenstein et al. 2023; TRL's recommended value 0.01)."""


REWARD = ObjectiveDeclaration(
    name="reward",
    summary="a reward model on preference pairs (Bradley–Terry, a scalar head on the last "
    "token), saved as a sequence classifier, as the `reward` section says",
    data_format="pairs",
    settings="reward",
    loss_label=lambda _: "reward model loss per pair (−log σ(r_chosen − r_rejected − margin))",
    cross_entropy_metric=None,
    refuses_captured_step="a reward model's step is not captured",
    writes_replies=False,
)


@rule("train", "lora", "model", "precision", "parallel")
def reward_model_settings(train, lora, model, precision, parallel) -> list[tuple[str, str, str]]:
    if train.objective != REWARD.name:
        return []
    problems = model_split_refused(
        parallel, "a reward model's score head is not split across ranks yet"
    )
    if not lora.enabled:
        return problems
    folded = "its adapters are folded into the saved sequence classifier"
    refused = [
        ("lora.use_dora", lora.use_dora, "DoRA", "use plain LoRA (lora.use_dora: false)"),
        ("model.quantize", model.quantize, "a 4-bit base", "drop model.quantize"),
        (
            "precision.fp8_base_weights",
            precision.fp8_base_weights,
            "a base kept in FP8",
            "drop precision.fp8_base_weights",
        ),
        ("precision.fp4_param", precision.fp4_param, "a base kept in FP4", "drop it"),
    ]
    for field, value, what, fix in refused:
        if value:
            problems.append((field, f"a reward model's {folded}, which {what} cannot be", fix))
    return problems
