"""Objectives, one module each (`sft`, `dpo`, `distill`, `orpo`, `grpo` with its rollouts,
rewards, advantages and loss): the loss, its metrics, the frozen models it holds and its resume
state. What each asks of the run is declared beside its
settings in `config/objectives/`; `registry.py` lists them."""
