"""`tuneforge bench`: tuneforge's training step against the peers (HF transformers + PEFT, with
Liger kernels, Unsloth) on the same shapes and tokens per step, each run in its own process."""
