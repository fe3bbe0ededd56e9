"""Parameter-efficient fine-tuning: LoRA as a module swap, adapters in the PEFT layout."""
