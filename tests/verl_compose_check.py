"""Compose verl's installed ``ppo_trainer.yaml`` with our overrides (CPU-only check).

Uses Hydra's compose API on the config dir of the *installed* verl package, so a
misspelled key (``actor_rollout_ref.actor.optim.lrr=1``) raises exactly as
``python -m verl.trainer.main_ppo`` would (Hydra: "Could not override ...
Key 'lrr' is not in struct").  Optionally also runs verl's own
``validate_config`` (batch-size divisibility, micro-batch settings, ...), which
is CPU-safe but instantiates ``HFModelConfig``: it reads ``config.json`` and the
tokenizer from ``actor_rollout_ref.model.path`` / ``critic.model.path`` (no
weights), so ``validate=True`` needs those dirs to exist.

Needs the verl env (``.venvs/verl``); verl/hydra are imported lazily so the
module can be imported elsewhere.

CLI:  PYTHONPATH=.:tests python tests/verl_compose_check.py key=value [key=value ...]
"""

from __future__ import annotations

import copy
import importlib.util
import os
import sys
from typing import Any, Sequence


class VerlConfigError(ValueError):
    """Raised when the overrides do not compose against verl's config."""


def verl_config_dir() -> str:
    """Absolute path of the installed verl package's ``trainer/config``."""
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("verl is not installed in this interpreter (use .venvs/verl)")
    return os.path.join(list(spec.submodule_search_locations)[0], "trainer", "config")


def compose_verl_config(
    overrides: Sequence[str],
    config_name: str = "ppo_trainer",
    validate: bool = False,
    resolve: bool = True,
) -> Any:
    """Compose ``config_name`` from the installed verl with ``overrides``.

    Returns the composed ``DictConfig`` (struct mode, as main_ppo sees it).
    Raises ``VerlConfigError`` on unknown keys / bad values; with
    ``validate=True`` also on verl's ``validate_config`` failures; with
    ``resolve=True`` every ``${...}`` interpolation is resolved once to catch
    broken references.
    """
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf import OmegaConf, open_dict
    from omegaconf.errors import OmegaConfBaseException

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=verl_config_dir(), version_base=None):
            cfg = compose(config_name=config_name, overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as e:
        raise VerlConfigError(f"{type(e).__name__}: {e}") from e
    finally:
        GlobalHydra.instance().clear()

    if resolve:
        try:
            OmegaConf.to_container(cfg, resolve=True)
        except OmegaConfBaseException as e:
            raise VerlConfigError(f"interpolation failed: {e}") from e

    if validate:
        from verl.trainer.ppo.utils import need_critic, need_reference_policy
        from verl.utils.config import validate_config

        vcfg = cfg
        if cfg.actor_rollout_ref.rollout.name == "vllm" and importlib.util.find_spec("vllm") is None:
            # validate_config's last step imports verl.workers.rollout.vllm_rollout
            # (needs vllm) only to check the LoRA rank against vLLM's MaxLoRARanks.
            # On CPU (no vllm) validate a copy under another rollout name and do
            # that check here with verl's own fallback bound (<= 512).
            vcfg = copy.deepcopy(cfg)
            with open_dict(vcfg):
                vcfg.actor_rollout_ref.rollout.name = "cpu-check-without-vllm"
            rank = int(cfg.actor_rollout_ref.model.get("lora_rank", 0) or 0)
            if rank > 512:
                raise VerlConfigError(f"lora_rank must be <= 512 for vLLM, got {rank}")
        try:
            validate_config(
                config=vcfg,
                use_reference_policy=need_reference_policy(vcfg),
                use_critic=need_critic(vcfg),
            )
        except (AssertionError, ValueError, HydraException, OSError) as e:
            # HydraException/OSError: HFModelConfig.__post_init__ loads the model's
            # config.json + tokenizer from model.path (no weights), so validate=True
            # needs a real (possibly tiny) model dir.
            raise VerlConfigError(f"verl validate_config: {type(e).__name__}: {e}") from e
    return cfg


def check_overrides(overrides: Sequence[str], validate: bool = True) -> None:
    """Raise ``VerlConfigError`` unless ``overrides`` compose (and validate)."""
    compose_verl_config(overrides, validate=validate)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        cfg = compose_verl_config(args, validate=True)
    except VerlConfigError as e:
        print(f"verl config INVALID: {e}", file=sys.stderr)
        return 1
    print(
        "verl config OK:",
        f"adv_estimator={cfg.algorithm.adv_estimator}",
        f"critic.enable={cfg.critic.enable}",
        f"rollout.n={cfg.actor_rollout_ref.rollout.n}",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
