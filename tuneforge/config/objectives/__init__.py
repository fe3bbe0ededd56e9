"""What each objective asks of a run, one module each beside its settings (`sft`, `dpo`,
`distill`, `orpo`, `grpo`): its section, the data format it reads, the frozen models it holds, its
rules. `registry.py` lists them; their computation is in `train/objectives/`."""
