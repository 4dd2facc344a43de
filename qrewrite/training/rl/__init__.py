"""RL after SFT (stages rl_data, rl): `data` (the RL prompts in both layouts), `swift_grpo` (ms-swift GRPO, on CPU),
`verl/` (verl PPO/GRPO, on the cluster), `guard` (did RL harm its SFT parent?), `summary` (the reward curve's
summary). The reward itself is `qrewrite.reward`."""
