"""The training half: base model → training gate → SFT → merged SFT model → RL prompts → RL → merged RL model.

`cli` holds the handlers of the training stages (`cmd_base_model` … `cmd_rl`); each calls one job's code:

* `gate`: the training gate (stage training_gate), before SFT;
* `base_model/`: the base model folder from a GGUF (`convert`; `qwen_wheels`, the Qwen GGUF's pinned wheels);
* `swift/`: ms-swift's command lines (`commands`, pure), running them and reading what a run left (`runner`),
  and the LoRA merge (`merge`, stage merge_sft; the RL and judge runs merge with it too);
* `sft/`: what the student learns (`targets`, stage sft_targets) and the LoRA SFT run (`train`, stage sft);
* `rl/`: the RL prompts (`data`, stage rl_data), GRPO with ms-swift (`swift_grpo`), the RL-vs-SFT check
  (`guard`) and the reward curve's summary (`summary`); `rl/verl/`: the verl backend;
* `resume`: resuming a killed run from its last complete checkpoint (ms-swift's and verl's).
"""
