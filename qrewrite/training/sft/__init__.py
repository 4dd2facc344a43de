"""Supervised fine-tuning of the student: `targets` (what it learns per row, stage sft_targets), `train` (LoRA SFT
with ms-swift, its schedule in epochs, the best checkpoint by validation loss; stage sft)."""
