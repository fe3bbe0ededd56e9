"""TRL's DPOTrainer + PEFT on a DPO workload: the same pairs as tuneforge's side
(`batches.pair_token_ids`), given to TRL as text of a word tokenizer that maps each word to one
of those ids, and trained through `trainer.train()` as a user runs it; each step's time is taken
between the trainer's step callbacks on the GPU's clock."""

import itertools
import tempfile
import time

import torch

from tuneforge.bench.batches import pair_token_ids, synthetic_pair
from tuneforge.bench.ours import DISTINCT_BATCHES, step_flops, workload_config
from tuneforge.bench.peers import _device, _hf_config, _peft_targets, peer_result
from tuneforge.bench.timing import step_statistics
from tuneforge.bench.word_tokenizer import word_tokenizer
from tuneforge.bench.workloads import Variant, Workload
from tuneforge.models.catalog import catalog_shape
from tuneforge.parallel.distributed import Dist


def pair_records(vocab_size: int, tokens: int, count: int) -> list[dict]:
    """The pairs as TRL's prompt/chosen/rejected text (TRL appends the end-of-sequence token
    each reply ends with)."""

    def text(ids: list[int]) -> str:
        return "".join(f" t{i}" for i in ids)

    records = []
    for index in range(count):
        prompt, chosen, rejected = pair_token_ids(vocab_size, tokens, index % DISTINCT_BATCHES)
        records.append(
            {"prompt": text(prompt), "chosen": text(chosen[:-1]), "rejected": text(rejected[:-1])}
        )
    return records


def run_trl_dpo(workload: Workload, checkpointing: bool, warmup: int, steps: int) -> dict:
    steps = -(-steps // DISTINCT_BATCHES) * DISTINCT_BATCHES  # whole cycles of the pairs
    trainer = trl_trainer(workload, checkpointing, warmup + steps)
    vocab_size = trainer.model.config.vocab_size
    check_same_pairs(trainer.train_dataset, vocab_size, workload.tokens)
    timing = time_trainer_steps(trainer, warmup, steps)
    return dpo_result(workload, "trl", checkpointing, timing)


def trl_trainer(workload: Workload, checkpointing: bool, steps: int):
    """TRL's DPOTrainer for `steps` steps of one pair each, LoRA r16 α32 through PEFT, the
    reference being the base with the adapter off (TRL's choice for a PEFT model)."""
    from datasets import Dataset
    from peft import LoraConfig
    from trl import DPOConfig, DPOTrainer

    model, tokenizer, directory = peer_model(workload)
    vocab_size = model.config.vocab_size
    dataset = Dataset.from_list(pair_records(vocab_size, workload.tokens, steps))
    arguments = DPOConfig(
        output_dir=directory,
        per_device_train_batch_size=1,
        gradient_accumulation_steps=1,
        max_steps=steps,
        learning_rate=1e-4,
        beta=0.1,
        max_length=None,
        gradient_checkpointing=checkpointing,
        bf16=torch.cuda.is_available(),
        optim="adamw_torch_fused" if torch.cuda.is_available() else "adamw_torch",
        lr_scheduler_type="constant",
        logging_steps=10**6,
        save_strategy="no",
        report_to=[],
        dataloader_num_workers=0,
        seed=0,
    )
    lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, **_peft_targets(workload))
    return DPOTrainer(
        model=model,
        args=arguments,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=lora,
    )


def peer_model(workload: Workload):
    """The workload's shape in transformers with random bf16 weights, on the GPU, and the word
    tokenizer over its vocabulary (saved in a new directory, also the trainer's output)."""
    import transformers

    torch.manual_seed(0)
    config = _hf_config(workload)
    with torch.device(_device()):
        model = transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    directory = tempfile.mkdtemp()
    return model, word_tokenizer(config.vocab_size, directory), directory


def check_same_pairs(dataset, vocab_size: int, tokens: int) -> None:
    """TRL's tokenised pairs are tuneforge's, token for token (the ratio is on identical work)."""
    for index in range(DISTINCT_BATCHES):
        row = dataset[index]
        prompt, chosen, rejected = pair_token_ids(vocab_size, tokens, index)
        got = (row["prompt_ids"], row["chosen_ids"], row["rejected_ids"])
        if got != (prompt, chosen, rejected):
            raise RuntimeError(f"TRL tokenised pair {index} differently from tuneforge's")


def time_trainer_steps(trainer, warmup: int, steps: int) -> dict:
    """`trainer.train()` with its first `warmup` steps untimed: the mean and median step from
    one step's start to the next on the GPU's clock, and the timed steps' peak memory."""
    from transformers import TrainerCallback

    cuda = torch.cuda.is_available()
    marks: list = []

    def mark() -> None:
        if cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            marks.append(event)
        else:
            marks.append(time.perf_counter())

    class StepClock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == warmup and cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            if state.global_step >= warmup:
                mark()

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == warmup + steps:
                mark()

    trainer.add_callback(StepClock())
    trainer.train()
    if cuda:
        torch.cuda.synchronize()
        durations = [a.elapsed_time(b) / 1e3 for a, b in itertools.pairwise(marks)]
    else:
        durations = [b - a for a, b in itertools.pairwise(marks)]
    return step_statistics(durations) | {"steps": steps}


def dpo_result(workload: Workload, system: str, checkpointing: bool, timing: dict) -> dict:
    """A DPO peer's run in the bench's result fields: one pair of two documents a step."""
    args = catalog_shape(workload.shape).with_layers(workload.layers)
    pairs = [synthetic_pair(args.vocab_size, workload.tokens, i) for i in range(DISTINCT_BATCHES)]
    config = workload_config(workload, Variant.parse("eager"), Dist())
    flops = sum(step_flops(config, args, pair) for pair in pairs) / len(pairs)
    result = peer_result(workload, system, checkpointing, timing)
    return result | {"flops_per_step": flops, "documents_per_step": 2}
