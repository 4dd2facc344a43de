"""verl `external_lib` for the PPO critic: the value model loads with the attention its config names.

verl 0.9.1's ``verl.utils.model.load_valuehead_model`` hard-codes ``attn_implementation="flash_attention_2"``,
in its ``AutoModelForTokenClassification`` path and again in trl's value-head fallback, so
``critic.model.override_config.attn_implementation`` never reaches it: a worker without the flash-attn package
(no wheel on PyPI) cannot build a critic at all ("FlashAttention2 has been toggled on, but
... the package for FlashAttention2 doesn't seem to be installed").

verl imports the modules named in ``VERL_USE_EXTERNAL_MODULES`` whenever a process imports verl
(``verl/__init__.py``), and the critic's engine looks the loader up at call time (``from verl.utils.model import
load_valuehead_model`` inside ``_build_module``). So ``train.verl_env`` names this module there, and every verl
process, the Ray worker that builds the critic included, gets ``load_valuehead_model`` below in verl's place:
same two paths, the configured attention, flash-attn only where it is installed. (verl's per-model
``external_lib`` is not enough: it is imported where the config object is built, the TaskRunner, not in the worker.)
"""

from __future__ import annotations

from .overrides import have_flash_attn, pick_attention


def load_valuehead_model(local_path, torch_dtype, model_config, trust_remote_code):
    """verl's loader (token-classification head first, trl's value head for architectures without one), with
    ``attn_implementation`` from the config instead of a fixed flash_attention_2."""
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification
    from verl.utils import model as verl_model

    attn = pick_attention(getattr(model_config, "_attn_implementation", None), have_flash_attn())
    kwargs = dict(pretrained_model_name_or_path=local_path, torch_dtype=torch_dtype, config=model_config,
                  attn_implementation=attn, trust_remote_code=trust_remote_code)
    try:
        return AutoModelForTokenClassification.from_pretrained(**kwargs)
    except ValueError as e:  # "Unrecognized configuration class": no token-classification head for this model
        if not verl_model.is_trl_available():
            raise RuntimeError(f"model({local_path}) has no token-classification head and trl (its value-head "
                               "fallback) is not installed: pip install trl (pinned in envs/verl.txt)") from e
    try:
        from trl.experimental.ppo import AutoModelForCausalLMWithValueHead
    except ImportError:
        from trl import AutoModelForCausalLMWithValueHead
    vision = type(model_config) in verl_model.AutoModelForVision2Seq._model_mapping.keys()
    base = (verl_model.AutoModelForVision2Seq if vision else AutoModelForCausalLM).from_pretrained(**kwargs)
    if hasattr(model_config, "text_config"):  # vision-language models, as verl does
        base.config.hidden_size = model_config.text_config.hidden_size
    model = AutoModelForCausalLMWithValueHead.from_pretrained(base)
    verl_model.patch_valuehead_model(model)
    return model


def install() -> None:
    from verl.utils import model as verl_model

    verl_model.load_valuehead_model = load_valuehead_model


install()
