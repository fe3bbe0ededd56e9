"""TRL's GRPOTrainer + PEFT on a GRPO workload: the prompts tuneforge's side reads
(`batches.prompt_token_ids`), as text of the word tokenizer that maps each word to one of those
ids, each answered `generations` times with exactly `completion_tokens` tokens (TRL's own
generation through transformers, `min_new_tokens` holding the end-of-sequence token off, as
tuneforge's side runs without a stop token), rewarded by the same function
(`bench/grpo_reward.py`), trained through `trainer.train()`. The sampling is timed apart by
wrapping the model's `generate`."""

import time

import torch

from tuneforge.bench.batches import prompt_token_ids
from tuneforge.bench.grpo_reward import even_share
from tuneforge.bench.ours import DISTINCT_BATCHES, grpo_step_work, phases
from tuneforge.bench.peers import _peft_targets, peer_result
from tuneforge.bench.peers_trl import peer_model, time_trainer_steps
from tuneforge.bench.workloads import Workload
from tuneforge.models.catalog import catalog_shape


def prompt_records(workload: Workload, vocab_size: int, steps: int) -> list[dict]:
    """Each step's prompts in the order tuneforge's side cycles through them."""
    records = []
    for step in range(steps):
        first = (step % DISTINCT_BATCHES) * 100
        for index in range(first, first + workload.prompts):
            ids = prompt_token_ids(vocab_size, workload.tokens, index)
            records.append({"prompt": " ".join(f"t{i}" for i in ids)})
    return records


class TimedGenerate:
    """The model's `generate`, each call's time on the GPU's clock kept."""

    def __init__(self, generate) -> None:
        self.generate = generate
        self.seconds: list[float] = []

    def __call__(self, *args, **kwargs):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        started = time.perf_counter()
        out = self.generate(*args, **kwargs)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.seconds.append(time.perf_counter() - started)
        return out


def run_trl_grpo(workload: Workload, checkpointing: bool, warmup: int, steps: int) -> dict:
    steps = -(-steps // DISTINCT_BATCHES) * DISTINCT_BATCHES  # whole cycles of the prompts
    trainer = trl_grpo_trainer(workload, checkpointing, warmup + steps)
    timed = TimedGenerate(trainer.model.generate)
    trainer.model.generate = timed
    timing = time_trainer_steps(trainer, warmup, steps)
    result = peer_result(workload, "trl", checkpointing, timing)
    args = catalog_shape(workload.shape).with_layers(workload.layers)
    sampling = phases(workload, timed.seconds[-steps:], result["ms_per_step"] / 1e3)
    return result | sampling | grpo_step_work(workload, args)


def trl_grpo_trainer(workload: Workload, checkpointing: bool, steps: int):
    from datasets import Dataset
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    model, tokenizer, directory = peer_model(workload)
    dataset = Dataset.from_list(prompt_records(workload, model.config.vocab_size, steps))
    completions = workload.completion_tokens
    arguments = GRPOConfig(
        output_dir=directory,
        per_device_train_batch_size=workload.prompts * workload.generations,
        gradient_accumulation_steps=1,
        num_generations=workload.generations,
        max_completion_length=completions,
        generation_kwargs={"min_new_tokens": completions},
        temperature=1.0,
        beta=0.0,
        loss_type="grpo",
        scale_rewards="group",
        num_iterations=1,
        max_steps=steps,
        learning_rate=1e-4,
        lr_scheduler_type="constant",
        gradient_checkpointing=checkpointing,
        bf16=torch.cuda.is_available(),
        optim="adamw_torch_fused" if torch.cuda.is_available() else "adamw_torch",
        logging_steps=10**6,
        save_strategy="no",
        report_to=[],
        dataloader_num_workers=0,
        shuffle_dataset=False,
        disable_dropout=True,
        log_completions=False,
        seed=0,
    )
    lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, **_peft_targets(workload))
    return GRPOTrainer(
        model=model,
        reward_funcs=[even_share],
        args=arguments,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=lora,
    )
