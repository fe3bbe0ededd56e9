"""`lora:` low-rank adapters, or full fine-tuning."""

from typing import Literal

from pydantic import Field

from tuneforge.config.sections.base import InputPath, Section

DEFAULT_LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class LoraSection(Section):
    enabled: bool = True
    """Train low-rank adapters (True) or all weights (False)."""
    rank: int = Field(16, ge=1)
    """Rank r of each adapter."""
    alpha: float = Field(32.0, gt=0)
    """Scaling numerator: the adapter output is multiplied by alpha / rank (alpha / sqrt(rank) with
    use_rslora)."""
    use_rslora: bool = False
    """Rank-stabilised scaling alpha / sqrt(rank)."""
    use_dora: bool = False
    """DoRA: each adapted weight as a trained magnitude times the direction of W + s·B·A (as PEFT's
    `use_dora`); dense linears only, on a base in the model's dtype."""
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    """Dropout in the adapter branch."""
    dropout_position: Literal["pre", "post"] = "pre"
    """Dropout on the adapter input (`pre`, as PEFT) or on its output (`post`)."""
    init: Literal["default", "kaiming", "xavier", "gaussian", "pissa", "olora"] = "kaiming"
    """How the adapters start: A kaiming-uniform (`default` or `kaiming`: PEFT's default),
    xavier-normal (Megatron's) or gaussian with std 1/rank, and B zero; or, as PEFT defines them,
    `pissa` (A, B from W's r principal singular values and vectors) or `olora` (from W's QR
    decomposition), s·B·A then taken out of the frozen base. Saved as the equivalent rank-2r LoRA on
    the original base."""
    target_modules: list[str] = Field(
        default_factory=lambda: list(DEFAULT_LORA_TARGETS), min_length=1
    )
    """What to adapt: HF leaf names (`q_proj` ... `down_proj`), Megatron names (`linear_qkv`,
    `linear_proj`, `linear_fc1`, `linear_fc2`), dotted suffixes (`self_attn.q_proj`), expert banks
    (`experts.gate_up_proj`, `experts.down_proj`), globs (`*.layers.1.*`), regexes (`re:...`), or
    `all-linear`. Left at its default, entries the model lacks (e.g. dense MLP names on an all-MoE
    model) are skipped."""
    exclude_modules: list[str] = []
    """Patterns (as in target_modules) of modules never to adapt."""
    rank_pattern: dict[str, int] = {}
    """Per-pattern rank: {pattern: rank}; the first matching pattern wins."""
    alpha_pattern: dict[str, float] = {}
    """Per-pattern alpha: {pattern: alpha}; the first matching pattern wins."""
    modules_to_save: list[str] = []
    """Modules trained in full and saved with the adapter, by HF name (e.g. embed_tokens, lm_head
    when tokens were added)."""
    share_expert_adapters: bool = False
    """One adapter shared by all experts of a bank instead of one per expert."""
    init_adapter: InputPath | None = None
    """A LoRA adapter directory (PEFT layout, e.g. an earlier run's `adapter/`) whose weights the
    adapters start from, to continue training it (SFT, or preference training after SFT); its shapes
    must match this section's."""
    compute_dtype: Literal["model", "float32"] = "model"
    """Precision of the adapter matmuls: the model's (bf16: the adapters' fp32 weights are cast for
    each matmul, no fp32 copy of the activations) or float32 (PEFT's default: the input is cast to
    fp32; slower, more memory)."""
