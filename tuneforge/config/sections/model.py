"""`model:` and `tokenizer:` which weights and which tokenizer."""

from typing import Literal

from pydantic import Field

from tuneforge.config.sections.base import ModelPath, Section


class ModelSection(Section):
    name: str | None = None
    """Catalog shape to build with random weights (e.g. `demo-tiny`, `llama-3-8b`); see `tuneforge
    models`."""
    path: ModelPath | None = None
    """Local Hugging Face model directory (config.json + *.safetensors) to fine-tune, or a hub id
    (`Qwen/Qwen3-8B`) resolved through the Hugging Face cache (downloaded there unless
    HF_HUB_OFFLINE is set); the run's config.yaml records the snapshot and its commit."""
    revision: str | None = None
    """With a hub id: the branch, tag or commit to use (default: main); the run records the commit
    it resolved to."""
    num_layers: int | None = Field(None, ge=1)
    """Keep only the first N decoder layers: a proxy of a real shape that fits a small machine."""
    dtype: Literal["float32", "bfloat16", "float16"] = "bfloat16"
    """Dtype of the base weights and of the computation."""
    attention: Literal["auto", "flash4", "varlen", "cudnn", "sdpa", "eager"] = "auto"
    """Attention backend; `auto` picks the fastest that works on the device and logs which one runs.
    `cudnn`: SDPA through cuDNN's fused kernels per document (CUDA, plain causal attention)."""
    init_std: float = Field(0.02, gt=0)
    """Standard deviation of the random initialisation used for catalog shapes."""
    quantize: Literal["nf4", "fp4"] | None = None
    """Hold the frozen linears of the decoder blocks in 4 bits (bitsandbytes' NF4 or FP4, blocks of
    64 with their absmax) and dequantise them into `dtype`, the compute dtype, at each product:
    QLoRA (needs LoRA; a teacher may be quantised too)."""
    double_quant: bool = True
    """With quantize: quantise the blocks' absmaxes again (8 bits, blocks of 256), QLoRA's double
    quantisation (~0.37 bits per weight less)."""

    @staticmethod
    def from_string(text: str) -> dict[str, str]:
        """A model given as one string (`distill.teacher: DIR`): its `path` (a directory, `./dir`,
        or a hub id `org/name`) or, without a slash, its catalog `name`."""
        is_path = "/" in text or text.startswith((".", "~"))
        return {"path": text} if is_path else {"name": text}


class TokenizerSection(Section):
    path: ModelPath | None = None
    """Local tokenizer directory in the HF layout, or a hub id resolved as model.path is; default:
    model.path."""
    revision: str | None = None
    """With a hub id: the branch, tag or commit to use; the run records the commit."""
    chat_template: str | None = None
    """Chat template instead of the tokenizer's own: chatml, llama3, alpaca, squad, or a Jinja
    template."""
