"""GRPO's sampling on the bench's `llama3-8b-lora-grpo` shape, decoded step by step from Python
(`EagerDecode`) and by replaying a CUDA graph (`CapturedDecode`), beside the decode bound: 4
prompts of 128 tokens, 8 completions each, 256 new tokens (no stop token, so every row decodes
them all), LoRA r16 on every linear, random bf16 weights; the captured step also with compiled blocks. `python bench/decode_probe.py`."""

import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tuneforge.models.generate as generate_module
from tuneforge.execution.block_wrappers import BlockWrapping, wrap_blocks
from tuneforge.hardware.step_rates import MEMORY_GBPS
from tuneforge.models.api import load_model
from tuneforge.models.captured_decode import EagerDecode, decode_step
from tuneforge.peft.apply import apply_lora
from tuneforge.plan.sampling_time import sampling_bound_seconds

PROMPTS, PROMPT_TOKENS, GROUP, NEW = 4, 128, 8, 256


def timed(model, prompts, step, repeats: int = 3) -> float:
    generate_module.decode_step = step
    times = []
    for repeat in range(repeats + 1):  # the first is warm-up
        generator = torch.Generator("cuda").manual_seed(repeat)
        torch.cuda.synchronize()
        started = time.perf_counter()
        replies = generate_module.generate(model, prompts, NEW, set(), 1.0, generator, copies=GROUP)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
        assert all(len(r) == NEW for r in replies)
    return sum(times[1:]) / repeats


def main() -> None:
    model = load_model("llama-3-8b", dtype="bfloat16", device="cuda", seed=0)
    lora = {"target_modules": ["all-linear"], "rank": 16, "alpha": 32}
    apply_lora(model, lora, torch.Generator("cuda").manual_seed(1), torch.bfloat16)
    model.eval()
    generator = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, model.args.vocab_size, (PROMPTS, PROMPT_TOKENS), generator=generator)
    prompts = prompts.tolist()
    gpu = torch.cuda.get_device_name()
    bandwidth = next(v for k, v in MEMORY_GBPS.items() if k in gpu)
    bound = sampling_bound_seconds(model.args, [PROMPT_TOKENS] * PROMPTS, GROUP, NEW, 2, bandwidth)
    result = {"gpu": gpu, "bound_s": bound}
    with torch.no_grad():
        result["eager_s"] = timed(model, prompts, EagerDecode)
        result["captured_s"] = timed(model, prompts, decode_step)
        wrap_blocks(model, BlockWrapping(compile=True))
        result["captured_compiled_s"] = timed(model, prompts, decode_step)
    for name in ("eager_s", "captured_s", "captured_compiled_s"):
        result[name.replace("_s", "_ms_per_token")] = result[name] / NEW * 1e3
        result[name.replace("_s", "_over_bound")] = result[name] / bound
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
