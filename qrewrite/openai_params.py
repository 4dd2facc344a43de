"""What a chat-completions request carries, per model family (teacher, OpenAI judge, `openai` eval candidate).

The public API refuses, with HTTP 400, `max_tokens` and any `temperature` but 1 for its reasoning models
(GPT-5 family, o-series), and each reasoning model accepts only some `reasoning_effort` values. Reasoning
tokens are hidden but spent inside the completion cap and billed as output, so a reasoning model gets
room for them on top of the reply's `max_tokens`. Other servers (DeepSeek, vLLM, `transformers serve`) get
the request they always got: `transformers serve` refuses `max_completion_tokens` and `reasoning_effort`.

| family            | models (auto)                           | token cap sent                               | temperature | reasoning_effort |
|-------------------|-----------------------------------------|----------------------------------------------|-------------|------------------|
| openai-reasoning  | gpt-5*, o1*, o3*, o4* (not gpt-5-chat*) | max_completion_tokens = max_tokens + reasoning_max_tokens | only 1 | sent   |
| openai-chat       | other gpt-*, chatgpt-*                  | max_completion_tokens = max_tokens           | sent        | refused          |
| deepseek-reasoner | deepseek-reasoner*                      | max_tokens = max_tokens + reasoning_max_tokens | refused (no effect) | refused |
| compatible        | anything else                           | max_tokens                                   | sent        | refused          |

`check_block` is what config validation runs: it knows which keys the user wrote, refuses a written value the
API would refuse and leaves out a default the family does not take; `request_params` builds the request.
The efforts each reasoning model accepts are OpenAI's documented values as of October 2025.
"""

from __future__ import annotations

import re

from .errors import QrewriteError

FAMILIES = ("openai-reasoning", "openai-chat", "deepseek-reasoner", "compatible")

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


def check_block(ocfg: dict, setting: str, written: set[str], source: str | None = None) -> dict:
    """`ocfg` (validated, defaults filled) for its family: a default the family does not take becomes null (not
    sent); a written value the API would refuse raises QrewriteError naming `setting.key`."""
    fam, model = family(ocfg), ocfg["model"]
    out = dict(ocfg)

    def _refuse(key: str, why: str, fix: str) -> QrewriteError:
        return QrewriteError(f"config key {setting}.{key}: {why}", file=source, hint=fix)

    reasoning = fam in ("openai-reasoning", "deepseek-reasoner")
    if reasoning and out.get("temperature") is not None:
        allowed = fam == "openai-reasoning" and out["temperature"] == 1
        if "temperature" in written and not allowed:
            why = (f"{model} accepts only the default temperature (1); the API answers HTTP 400 to "
                   f"{out['temperature']:g}" if fam == "openai-reasoning" else f"{model} ignores temperature")
            raise _refuse("temperature", why, f"delete {setting}.temperature (or set it to null)")
        if not allowed:
            out["temperature"] = None
    if out.get("reasoning_effort") is not None:
        if fam == "openai-reasoning":
            allowed = efforts(model)
            if out["reasoning_effort"] not in allowed:
                why = (f"{model} takes no reasoning_effort" if not allowed else
                       f"{model} does not accept reasoning_effort {out['reasoning_effort']!r} (it accepts "
                       f"{', '.join(allowed)})")
                fix = ("low" if "low" in allowed else allowed[0]) if allowed else "null"
                raise _refuse("reasoning_effort", why, f"set {setting}.reasoning_effort to {fix}")
        elif "reasoning_effort" in written:
            raise _refuse("reasoning_effort", f"{model} ({fam}) takes no reasoning_effort",
                          f"delete {setting}.reasoning_effort, or set {setting}.family: openai-reasoning "
                          "for a server whose model reasons and takes it (vLLM's gpt-oss)")
        else:
            out["reasoning_effort"] = None
    return out


def request_params(ocfg: dict, setting: str) -> dict:
    """The generation parameters of one request (everything but model and messages)."""
    fam = family(ocfg)
    # Validation already did this; a block that skipped it (schema defaults in a test) gets the same treatment.
    ocfg = check_block(ocfg, setting, written=set())
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
    if ocfg.get("temperature") is not None:
        params = {"temperature": ocfg["temperature"], **params}  # today's order: chat caches keep their keys
    if ocfg.get("reasoning_effort") is not None:
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
