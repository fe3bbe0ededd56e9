"""How the trained 16-bit weights keep their precision across updates: the one place the
optimizer, the parallel wrapping, the planner, the doctor and the log ask.

A bf16 weight has 8 significant bits: an AdamW update smaller than half its last place (about
0.2% of its value) rounds away, and so do an exp_avg_sq's decay and additions with beta2 = 0.999.
`master` keeps an fp32 copy of each such weight and fp32 AdamW states (bf16 compute, as DeepSpeed,
Megatron and torchtitan do); `compensated` keeps the weight in bf16 plus a bf16 remainder of what
rounding took off it (Kahan), so that weight + remainder is the accurate value, with fp32
states; `pure` keeps weights and states in the weights' dtype, as a plain optimizer over bf16
parameters does."""

import logging
from dataclasses import dataclass
from typing import Literal

import torch

Kind = Literal["master", "compensated", "pure", "full"]
"""`full`: the model is fp32 (LoRA adapters are fp32 in any model: only 16-bit weights that
train, those of full fine-tuning or `lora.modules_to_save`, are concerned)."""

log = logging.getLogger(__name__)

LOW_PRECISION = (torch.bfloat16, torch.float16)
DTYPE_NAMES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


@dataclass(frozen=True)
class TrainedWeights:
    kind: Kind
    dtype: str
    """The model's dtype (`model.dtype`): what the weights compute in and are saved in."""

    @classmethod
    def of(cls, master_weights: bool | str, dtype: str) -> "TrainedWeights":
        """From `precision.master_weights` and `model.dtype`."""
        if dtype == "float32":
            return cls("full", dtype)
        if master_weights == "compensated":
            return cls("compensated", dtype)
        return cls("master" if master_weights else "pure", dtype)

    @property
    def optimizer_update(self) -> Literal["master", "compensated"] | None:
        """What the optimizer keeps beside a 16-bit weight; None: a plain AdamW."""
        return self.kind if self.kind in ("master", "compensated") else None

    def fp32_shards(self, sharded: bool) -> bool:
        """Under FSDP2, master weights are the fp32 shards themselves (bf16 all-gathers and
        compute through `MixedPrecisionPolicy`, as torchtitan does)."""
        return sharded and self.kind == "master"

    def extra_bytes_per_param(self, param_bytes: int) -> float:
        """Optimizer bytes per trained parameter beside its weight and gradient."""
        if self.kind == "master":
            return 4 + 8  # fp32 master + fp32 m and v
        if self.kind == "compensated":
            return param_bytes + 8  # the remainder + fp32 m and v
        if self.kind == "full":
            return 8
        return 2 * param_bytes  # m and v in the weights' dtype

    def log(self, model: torch.nn.Module, sharded: bool) -> None:
        """Say in the training log what the run keeps of its trained 16-bit weights, if any."""
        trained = [p for p in model.parameters() if p.requires_grad]
        if any(p.dtype in LOW_PRECISION for p in trained):
            log.info("trained weights: %s", self.describe(sharded))

    def describe(self, sharded: bool = False) -> str:
        low = DTYPE_NAMES.get(self.dtype, self.dtype)
        if self.kind == "master" and sharded:
            return (
                f"fp32 master (the FSDP2 shards), {low} compute and all-gathers, fp32 gradient "
                "reduction, fp32 AdamW states"
            )
        if self.kind == "master":
            return f"fp32 master, {low} compute, fp32 AdamW states"
        if self.kind == "compensated":
            return f"{low} with compensated (Kahan) updates, {low} compute, fp32 AdamW states"
        if self.kind == "pure":
            return (
                f"{low}, no master copy ({low} AdamW states; updates below half a {low} step "
                "are lost: precision.master_weights: true keeps them)"
            )
        return "fp32, fp32 AdamW states"
