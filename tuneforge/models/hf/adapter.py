"""Name maps between our modules and a family's Hugging Face checkpoint layout."""

import functools
import re
from dataclasses import dataclass
from typing import Any

from tuneforge.models.args import ModelArgs

LLAMA_KEY_MAP = {
    "model.embed_tokens.weight": "embed.weight",
    "model.layers.{i}.self_attn.q_proj.weight": "layers.{i}.attn.q_proj.weight",
    "model.layers.{i}.self_attn.k_proj.weight": "layers.{i}.attn.k_proj.weight",
    "model.layers.{i}.self_attn.v_proj.weight": "layers.{i}.attn.v_proj.weight",
    "model.layers.{i}.self_attn.o_proj.weight": "layers.{i}.attn.o_proj.weight",
    "model.layers.{i}.mlp.gate_proj.weight": "layers.{i}.mlp.gate_proj.weight",
    "model.layers.{i}.mlp.up_proj.weight": "layers.{i}.mlp.up_proj.weight",
    "model.layers.{i}.mlp.down_proj.weight": "layers.{i}.mlp.down_proj.weight",
    "model.layers.{i}.input_layernorm.weight": "layers.{i}.attn_norm.weight",
    "model.layers.{i}.post_attention_layernorm.weight": "layers.{i}.mlp_norm.weight",
    "model.norm.weight": "norm.weight",
    "lm_head.weight": "lm_head.weight",
}


@functools.cache
def _compile(template: str) -> re.Pattern[str]:
    return re.compile("^" + re.escape(template).replace(r"\{i\}", r"(?P<i>\d+)") + "$")


@dataclass(frozen=True)
class StateDictAdapter:
    """Translates parameter names and `config.json` for one model family."""

    model_type: str
    key_map: dict[str, str]

    def from_hf(self, hf_name: str) -> str | None:
        return _translate(hf_name, self.key_map)

    def to_hf(self, name: str) -> str | None:
        return _translate(name, {ours: theirs for theirs, ours in self.key_map.items()})

    def module_to_hf(self, module_name: str) -> str:
        """HF name of one of our modules (e.g. `layers.0.attn.q_proj` -> `model.layers.0.self_attn.q_proj`)."""
        hf_name = self.to_hf(module_name + ".weight")
        if hf_name is None:
            raise KeyError(f"no Hugging Face name for module {module_name}")
        return hf_name.removesuffix(".weight")

    def args_from_config(self, config: dict[str, Any]) -> ModelArgs:
        num_heads = config["num_attention_heads"]
        return ModelArgs(
            vocab_size=config["vocab_size"],
            dim=config["hidden_size"],
            num_layers=config["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=config.get("num_key_value_heads") or num_heads,
            ffn_dim=config["intermediate_size"],
            head_dim=config.get("head_dim") or config["hidden_size"] // num_heads,
            norm_eps=config.get("rms_norm_eps", 1e-6),
            rope_theta=_rope_theta(config),
            tie_embeddings=bool(config.get("tie_word_embeddings", False)),
            max_position_embeddings=config.get("max_position_embeddings", 4096),
            family=self.model_type,
        )

    def config_from_args(self, args: ModelArgs, dtype: str) -> dict[str, Any]:
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": self.model_type,
            "vocab_size": args.vocab_size,
            "hidden_size": args.dim,
            "intermediate_size": args.ffn_dim,
            "num_hidden_layers": args.num_layers,
            "num_attention_heads": args.num_heads,
            "num_key_value_heads": args.num_kv_heads,
            "head_dim": args.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": args.norm_eps,
            "rope_theta": args.rope_theta,
            "rope_parameters": {"rope_type": "default", "rope_theta": args.rope_theta},
            "max_position_embeddings": args.max_position_embeddings,
            "tie_word_embeddings": args.tie_embeddings,
            "attention_bias": False,
            "mlp_bias": False,
            "torch_dtype": dtype,
        }


def _rope_theta(config: dict[str, Any]) -> float:
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    kind = rope.get("rope_type") or rope.get("type") or "default"
    if kind != "default":
        raise ValueError(f"rope scaling '{kind}' is not supported by this version of tuneforge")
    return float(config.get("rope_theta") or rope.get("rope_theta") or 10000.0)


def _translate(name: str, key_map: dict[str, str]) -> str | None:
    for source, target in key_map.items():
        match = _compile(source).match(name)
        if match:
            return target.replace("{i}", match.group("i")) if "{i}" in source else target
    return None


ADAPTERS = {"llama": StateDictAdapter("llama", LLAMA_KEY_MAP)}


def adapter_for(model_type: str) -> StateDictAdapter:
    try:
        return ADAPTERS[model_type]
    except KeyError:
        known = ", ".join(sorted(ADAPTERS))
        raise ValueError(
            f"model_type '{model_type}' is not supported; supported: {known}"
        ) from None
