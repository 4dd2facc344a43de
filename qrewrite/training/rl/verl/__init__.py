"""The verl backend of the rl stage: `train` (run `verl.trainer.main_ppo`, then one HF folder), `overrides` (our
config as verl's Hydra overrides, pure), `dataset` (the RL prompts as verl's parquet), `critic` (the critic's loader
every verl process imports)."""
