"""What a chat-completions request carries, per model family (teacher, OpenAI judge, `openai` eval candidate).

The public API refuses, with HTTP 400, `max_tokens` and any `temperature` but 1 for its reasoning models
(GPT-5 family, o-series), and each reasoning model accepts only some `reasoning_effort` values. Reasoning
tokens are hidden but spent inside the completion cap and billed as output, so a reasoning model gets
room for them on top of the reply's `max_tokens`. Other servers (DeepSeek, vLLM, `transformers serve`) get
the request they always got: `transformers serve` refuses `max_completion_tokens` and `reasoning_effort`.

| family            | models (auto)                           | token cap sent                               | temperature | reasoning_effort |
|-------------------|-----------------------------------------|----------------------------------------------|-------------|------------------|
| openai-reasoning  | gpt-5*, o1*, o3*, o4* (not gpt-5-chat*) | max_completion_tokens = max_tokens + reasoning_max_tokens | only 1 | sent   |
| openai-chat       | other gpt-*, chatgpt-*                  | max_completion_tokens = max_tokens           | sent        | not sent         |
| deepseek-reasoner | deepseek-reasoner*                      | max_tokens = max_tokens + reasoning_max_tokens | not sent (no effect) | not sent |
| compatible        | anything else                           | max_tokens                                   | sent        | not sent         |

"Not sent" is the default left out; a value written other than the default is refused at validation.

`check_block` is what config validation runs: it refuses a value the API would refuse, naming the setting;
`request_params` builds the request, leaving out a default the family does not take.
The efforts each reasoning model accepts are OpenAI's documented values as of October 2025.
"""

from __future__ import annotations

import re

from .errors import QrewriteError

# (model-name pattern, efforts accepted), first match wins. () = the model takes no reasoning_effort at all.
REASONING_EFFORTS = (
    (r"gpt-5-pro", ("high",)),
    (r"gpt-5\.\d", ("none", "low", "medium", "high")),           # gpt-5.1 and later
    (r"gpt-5", ("minimal", "low", "medium", "high")),
    (r"o1-(mini|preview)", ()),
    (r"o\d", ("low", "medium", "high")),
)


def family(ocfg: dict) -> str:
    """`family` from the block, or (auto) from the model name. A provider prefix ("openai/gpt-5", a Hugging
    Face id) is a model served by something else, so it stays `compatible`."""
    if ocfg.get("family", "auto") != "auto":
        return ocfg["family"]
    model = str(ocfg["model"]).lower()
    if re.match(r"(gpt-5(?!-chat)|o[134])([-.]|$)", model):
        return "openai-reasoning"
    if re.match(r"(gpt-|chatgpt-)", model):
        return "openai-chat"
    if model.startswith("deepseek-reasoner"):
        return "deepseek-reasoner"
    return "compatible"


def efforts(model: str) -> tuple[str, ...]:
    for pattern, allowed in REASONING_EFFORTS:
        if re.match(pattern, model.lower()):
            return allowed
    return ("low", "medium", "high")


def check_block(ocfg: dict, setting: str, defaults: dict, source: str | None = None) -> None:
    """Refuse (QrewriteError naming `setting.key`) what the API would refuse for `ocfg`'s model. `defaults`: the
    block's schema defaults. A value left at its default is not "written": the default temperature (the chat
    models') and reasoning_effort (the reasoning models') are just not sent to a family that takes none, so the
    check gives the same answer before and after defaults are filled (Snakemake fills them first)."""
    fam, model = family(ocfg), ocfg["model"]
    written = {k for k in ("temperature", "reasoning_effort") if ocfg.get(k) != defaults.get(k)}

    def _refuse(key: str, why: str, fix: str) -> QrewriteError:
        return QrewriteError(f"config key {setting}.{key}: {why}", file=source, hint=fix)

    temperature = ocfg.get("temperature")
    if "temperature" in written and temperature is not None and fam in ("openai-reasoning", "deepseek-reasoner") \
            and not (fam == "openai-reasoning" and temperature == 1):
        why = (f"{model} accepts only the default temperature (1); the API answers HTTP 400 to {temperature:g}"
               if fam == "openai-reasoning" else f"{model} ignores temperature")
        raise _refuse("temperature", why, f"delete {setting}.temperature (it is not sent to {fam} models)")
    effort = ocfg.get("reasoning_effort")
    if effort is not None and fam == "openai-reasoning":
        allowed = efforts(model)
        if effort not in allowed:
            why = (f"{model} takes no reasoning_effort" if not allowed else
                   f"{model} does not accept reasoning_effort {effort!r} (it accepts {', '.join(allowed)})")
            fix = ("low" if "low" in allowed else allowed[0]) if allowed else "null"
            raise _refuse("reasoning_effort", why, f"set {setting}.reasoning_effort: {fix}")
    elif effort is not None and "reasoning_effort" in written:
        raise _refuse("reasoning_effort", f"{model} ({fam}) takes no reasoning_effort",
                      f"delete {setting}.reasoning_effort, or set {setting}.family: openai-reasoning for a "
                      "server whose model reasons and takes it (vLLM's gpt-oss)")


def request_params(ocfg: dict, setting: str) -> dict:
    """The generation parameters of one request (everything but model and messages)."""
    fam = family(ocfg)
    check_block(ocfg, setting, defaults=ocfg)  # what validation checked; also for a block that skipped it
    room = int(ocfg.get("reasoning_max_tokens") or 0)
    cap = int(ocfg["max_tokens"])
    if fam == "openai-reasoning":
        params = {"max_completion_tokens": cap + room}
    elif fam == "openai-chat":
        params = {"max_completion_tokens": cap}
    elif fam == "deepseek-reasoner":
        params = {"max_tokens": cap + room}
    else:
        params = {"max_tokens": cap}
    temperature = ocfg.get("temperature")
    if temperature is not None and (fam in ("openai-chat", "compatible") or
                                    (fam == "openai-reasoning" and temperature == 1)):
        params = {"temperature": temperature, **params}  # today's order: chat models' cache keys stay the same
    if fam == "openai-reasoning" and ocfg.get("reasoning_effort") is not None:
        params["reasoning_effort"] = ocfg["reasoning_effort"]
    return params


def cap_setting(ocfg: dict, setting: str) -> str:
    """The setting that raises the completion cap of `ocfg`'s family."""
    return f"{setting}.reasoning_max_tokens" if family(ocfg) in ("openai-reasoning", "deepseek-reasoner") \
        else f"{setting}.max_tokens"


# The request parameter the API names in a 400 → the setting that controls it (which name the token cap is sent
# under is the family's choice).
PARAM_SETTING = {"max_tokens": "family", "max_completion_tokens": "family", "temperature": "temperature",
                 "reasoning_effort": "reasoning_effort", "model": "model"}
