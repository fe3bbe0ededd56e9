"""`train:` optimisation, memory techniques and the job's time limit."""

from typing import Literal

from pydantic import Field, field_validator

from tuneforge.config.durations import parse_duration
from tuneforge.config.objectives.registry import OBJECTIVE_HELP, ObjectiveName
from tuneforge.config.sections.base import Section


class TrainSection(Section):
    objective: ObjectiveName = Field("sft", description=OBJECTIVE_HELP)  # type: ignore[valid-type]
    max_steps: int | None = Field(None, ge=1)
    """Optimizer steps to run; set this or `epochs`."""
    epochs: float | None = Field(None, gt=0)
    """Passes over the training data; used when max_steps is not set."""
    tokens_per_micro_batch: int = Field(4096, ge=8)
    """Token budget of one packed micro-batch (its flat length); must be >= data.max_seq_len."""
    loss_chunk_tokens: int = Field(1024, ge=64)
    """Tokens per chunk of the loss: one chunk's logits exist at a time (tokens x vocabulary x 6
    bytes in a bf16 model)."""
    grad_accum_steps: int = Field(1, ge=1)
    """Micro-batches per optimizer step."""
    lr: float = Field(2e-4, gt=0)
    """Peak learning rate."""
    min_lr: float = Field(0.0, ge=0)
    """Learning rate at the end of the decay."""
    warmup_steps: int = Field(0, ge=0)
    """Linear warm-up steps from 0 to lr."""
    schedule: Literal["cosine", "linear", "constant"] = "cosine"
    """Decay after warm-up, from lr to min_lr."""
    weight_decay: float = Field(0.0, ge=0)
    """AdamW weight decay (never applied to norms and biases)."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    eps: float = Field(1e-8, gt=0)
    """AdamW epsilon."""
    clip_grad_norm: float | None = Field(1.0, gt=0)
    """Clip the global gradient norm to this value; null disables clipping."""
    seed: int = 0
    """Seed for weights, adapters, data order and dropout."""
    activation_checkpointing: Literal["none", "full", "selective"] = "none"
    """Recompute block activations in backward to save memory: every block (`full`) or every k-th
    (`selective`)."""
    checkpoint_every: int = Field(2, ge=1)
    """With activation_checkpointing: selective, recompute every k-th block."""
    offload_checkpoints: bool = False
    """With activation checkpointing, keep each checkpointed block's input in pinned host memory
    instead of on the GPU (one process; no MoE router aux loss)."""
    offload_activations: int = Field(0, ge=0)
    """Blocks, spread evenly, whose saved activations go to pinned host memory in the forward and
    come back for their backward, instead of staying on the GPU or being recomputed (one process).
    Each costs its activations' round trip over PCIe, overlapped with compute: with checkpointing,
    blocks save their recomputation for one block's activations more at the peak (they come back
    into two staging buffers, in turn)."""
    keep_activations: int = Field(0, ge=0)
    """With activation checkpointing: the last N of the blocks it would recompute keep their
    activations on the GPU instead (fills the memory checkpointing leaves; each such block saves one
    block's recomputation). `tuneforge plan` predicts the memory."""
    offload_embedding: bool = False
    """Keep the frozen input embedding in pinned host memory: each micro-batch's rows are gathered
    there and copied to the GPU ([tokens, dim] per micro-batch instead of [vocabulary, dim] on the
    GPU). Needs a frozen, untied embedding (a LoRA run) and one process."""
    compile: bool = False
    """Compile each block with torch.compile, and the loss's softmax and gradient per chunk."""
    compile_memory_budget: float = Field(1.0, gt=0, le=1)
    """With compile: the share of its activations each compiled block may keep for backward (torch's
    activation_memory_budget); below 1, cheap values (norm outputs, the SwiGLU product) are
    recomputed in backward instead."""
    cuda_graph: bool = False
    """Capture the whole optimizer step as one CUDA graph after two eager steps and replay it: the
    host queues one launch per step instead of thousands (for runs where Python cannot keep the GPU
    busy: small models, MoE). Batches are brought to a fixed shape (padded to
    tokens_per_micro_batch, document slots for the most documents seen), and the loss projects every
    row. One CUDA GPU, attention flash4 or varlen, nothing offloaded to host memory; memory stays
    reserved for the graph."""
    eval_steps: int | None = Field(None, ge=1)
    """The older name of `eval.every_steps`."""
    on_nonfinite: Literal["skip", "stop"] = "skip"
    """A step with NaN/Inf loss or gradients: skip its update (`skip`) or stop the run (`stop`)."""
    max_nonfinite_steps: int = Field(10, ge=1)
    """Stop anyway after this many non-finite steps in a row."""
    time_limit: str | None = None
    """Wall-clock budget of this job (`90m`, `4h`, `01:30:00`, `2-00:00:00`); under SLURM the job's
    end time is used when sooner. The run saves and exits before it."""

    @field_validator("time_limit", mode="before")
    @classmethod
    def _seconds_as_text(cls, value: object) -> object:
        # `time_limit: 600` (YAML) or `train.time_limit=600` reads as a number of seconds
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)
        return value

    @field_validator("time_limit")
    @classmethod
    def _parse_time_limit(cls, value: str | None) -> str | None:
        if value is not None:
            parse_duration(value)
        return value
