"""API keys: read from the environment only, and kept out of everything the pipeline records.

Config holds only the *name* of the environment variable (`api_key_env`). A service may quote the
key it rejected in an error body, and error bodies end up in teacher.jsonl, logs and exceptions, so
every client that holds a key passes such text through `redact` before keeping it. What the pipeline
records about a run (lineage.json) holds the config with values under secret-looking keys dropped
(`strip_secrets`), and is refused if it would contain the value of any secret-looking environment
variable (`assert_no_secrets`): a key that reached a record some other way.

Config is checked before anything else reads it (`check_config_secrets`, called by qrewrite.config.validate_config
and by rules/common.smk before snakemake.utils.validate, whose messages quote the offending value): every `*_env`
setting must name a variable, and no value may look like a credential (`looks_like_secret`). Errors name the
setting, never the value.
"""

from __future__ import annotations

import os
import re
from typing import Any

from .errors import QrewriteError

MARK = "[REDACTED]"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

# Keys whose values are never written. `*_env` keys hold an env var NAME (e.g. api_key_env) and are kept.
# `token` only as the last word of a key (access_token, hf_token): max_tokens / prompt_tokens are counts.
_SECRET_KEY = re.compile(r"(api[_-]?key|secret|password|passwd|(?:^|[_-])token$|credential|authorization|bearer)",
                         re.IGNORECASE)
_SECRET_ENV = re.compile(r"(KEY|SECRET|TOKEN|PASSWORD|PASSWD|CREDENTIAL|AUTH)", re.IGNORECASE)

# `*_env` settings whose value is a name pattern: {TENANT} is replaced by each tenant's name (QREWRITE_KEY_{TENANT}).
TEMPLATED_ENV_SETTINGS = frozenset({"serve.api_key_env"})
_ENV_TEMPLATE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\{TENANT\}[A-Za-z0-9_]*)?\Z")
# A well-formed "name" that is a pasted key all the same: 20+ letters and digits, lower case and a digit among them,
# no underscore (a 32-hex key; variable names are upper case words joined by _).
_KEY_LIKE_NAME = re.compile(r"(?=[A-Za-z0-9]*[a-z])(?=[A-Za-z0-9]*[0-9])[A-Za-z0-9]{20,}\Z")

# Values that look like a credential wherever they stand (a key, a token, a URL's password or key parameter):
# refused in config, masked in every dump of it. Each needs a long, digit-bearing run, so prose does not match.
_SECRET_VALUES = [
    # OpenAI / DeepSeek / Anthropic style keys: sk-..., sk-proj-..., sk-ant-...
    (re.compile(r"\bsk-(?=[A-Za-z0-9_-]*[0-9])[A-Za-z0-9_-]{16,}"), MARK),
    # GitHub, Hugging Face, Slack, AWS access key ids, Google API keys
    (re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,}|hf_[A-Za-z0-9]{30,}"
                r"|xox[abposr]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16}|AIza[0-9A-Za-z_-]{35})"), MARK),
    # an Authorization header value
    (re.compile(r"\b(Bearer|Basic)\s+(?=[A-Za-z0-9._~+/=-]*[0-9])[A-Za-z0-9._~+/=-]{16,}", re.IGNORECASE),
     r"\1 " + MARK),
    # a URL's user:password@
    (re.compile(r"(://[^/\s:@]+):[^/\s@]+@"), r"\1:" + MARK + "@"),
    # a URL's key parameter: ?api_key=..., &token=...
    (re.compile(r"([?&](?:api[_-]?key|apikey|access[_-]?token|token|secret|password|passwd)=)[^&#\s]+",
                re.IGNORECASE), r"\1" + MARK),
]


def looks_like_secret(text: str) -> bool:
    """Whether `text` holds something shaped like an API key, a token or a URL's credentials."""
    return isinstance(text, str) and any(rx.search(text) for rx, _ in _SECRET_VALUES)


def mask_secret_values(text: str) -> str:
    """`text` with every credential-shaped part (`looks_like_secret`) replaced by [REDACTED]."""
    for rx, repl in _SECRET_VALUES:
        text = rx.sub(repl, text)
    return text


def is_env_name(value: Any, template: bool = False) -> bool:
    """Whether `value` can be the NAME of an environment variable (with `template`, one with {TENANT} in it)
    and does not look like a pasted key."""
    return isinstance(value, str) and bool((_ENV_TEMPLATE if template else _ENV_NAME).match(value)) \
        and not _KEY_LIKE_NAME.match(value)


def _name_not_key(setting: str, source: str | None = None) -> QrewriteError:
    """The error for a `*_env` setting that holds something other than a variable's name (never quoted)."""
    return QrewriteError(f"config key {setting} must be the NAME of an environment variable (letters, digits, _), "
                         "not the key itself; its value is not shown", file=source,
                         hint=f"export the key in a variable (export MY_KEY=...) and put the variable's name there "
                              f"({setting}: MY_KEY); remove the key from the config file")


def _walk(obj: Any, path: str = ""):
    """(dotted key path, key, value) of every mapping entry in `obj`, lists indexed (eval.candidates.0.openai)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            where = f"{path}.{k}" if path else str(k)
            yield where, k, v
            yield from _walk(v, where)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _walk(v, f"{path}.{i}" if path else str(i))


def check_config_secrets(cfg: Any, source: str | None = None) -> None:
    """Refuse a config holding a key: every `*_env` setting, wherever it is (teacher.openai.api_key_env,
    eval.candidates.N.openai.api_key_env, serve.api_key_env, ...), must name an environment variable (null: none);
    no other key or value may look like a credential. Runs before the schema, whose messages quote values."""
    for where, key, value in _walk(cfg):
        parent = where.rsplit(".", 1)[0] if "." in where else "(top level)"
        if looks_like_secret(str(key)):
            raise QrewriteError(f"a key under config key {parent} looks like an API key or credential; it is not "
                                "shown", file=source, hint="remove it from the config file; keys go in environment "
                                                           "variables, named by the *_env settings")
        if str(key).endswith("_env"):
            if value is not None and not is_env_name(value, template=where in TEMPLATED_ENV_SETTINGS):
                raise _name_not_key(where, source)
        elif isinstance(value, str) and looks_like_secret(value):
            raise QrewriteError(f"config key {where} holds what looks like an API key, a token or a URL's "
                                "credentials; its value is not shown", file=source,
                                hint="remove it from the config file: export the key in an environment variable "
                                     "and name the variable in the block's api_key_env setting")


def from_env(var: str, setting: str, needed_because: str, hint: str) -> str:
    """The secret in environment variable `var`, named by config key `setting`.

    A value that cannot be a variable name is most likely the key pasted into config by mistake: the
    error says so without repeating it (error messages end up in logs).
    """
    if not isinstance(var, str) or not _ENV_NAME.match(var):
        raise QrewriteError(f"{setting} must be the NAME of an environment variable (letters, digits, _), "
                            "not the key itself; its value is not shown",
                            hint=f"export MY_KEY=... and set {setting}: MY_KEY; remove the key from config")
    value = os.environ.get(var)
    if not value:
        raise QrewriteError(f"environment variable {var} is not set ({needed_because})", hint=hint)
    return value


def redact(text: str, secret: str | None) -> str:
    """`text` with every occurrence of `secret` blanked out; redact before truncating, so no fragment survives."""
    return text.replace(secret, MARK) if secret else text


def strip_secrets(obj: Any) -> Any:
    """Drop values under secret-looking keys (an `*_env` key names a variable and is kept). A validated config
    holds no credential-shaped value (`check_config_secrets`); one that reached a record some other way (a rule's
    params) is left for `assert_no_secrets` to refuse, not masked."""
    if isinstance(obj, dict):
        return {k: ("<removed>" if _SECRET_KEY.search(str(k)) and not str(k).endswith("_env") else strip_secrets(v))
                for k, v in obj.items()}
    if isinstance(obj, list):
        return [strip_secrets(v) for v in obj]
    return obj


def redact_values(obj: Any) -> Any:
    """`obj` with the credential-shaped part of every string value replaced by [REDACTED] (`mask_secret_values`);
    keys and everything else as they are: the config dumps (`qrewrite config`, results/.config.resolved.yaml). A
    config that passed `check_config_secrets` comes back unchanged."""
    if isinstance(obj, dict):
        return {k: redact_values(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [redact_values(v) for v in obj]
    return mask_secret_values(obj) if isinstance(obj, str) else obj


def redact_env_values(text: str) -> str:
    """`text` with the value of every secret-looking environment variable (8 characters or more) replaced by
    [REDACTED]: for what is printed, where a key could only have come from the environment."""
    for value in sorted(_secret_values(), key=len, reverse=True):
        text = text.replace(value, MARK)
    return text


def _secret_values() -> list[str]:
    return [v for k, v in os.environ.items() if _SECRET_ENV.search(k) and len(v) >= 8]


def assert_no_secrets(text: str, where: str) -> None:
    """Refuse to write `text` if it contains the value of a secret-looking environment variable."""
    for value in _secret_values():
        if value in text:
            raise QrewriteError(f"refusing to write {where}: it would contain the value of a secret environment "
                                "variable", hint="pass env var names in config, never their values")
