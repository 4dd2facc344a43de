"""ms-swift for SFT, GRPO and the LoRA merge: `commands` builds the command lines (pure, testable without ms-swift),
`runner` runs one and reads what the run left (checkpoints, logs, TensorBoard events), `merge` folds a LoRA adapter
into its base model."""
