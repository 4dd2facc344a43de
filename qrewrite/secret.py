"""API keys: read from the environment only, and kept out of everything the pipeline records.

Config holds only the *name* of the environment variable (`api_key_env`). A service may quote the
key it rejected in an error body, and error bodies end up in teacher.jsonl, logs and exceptions, so
every client that holds a key passes such text through `redact` before keeping it. What the pipeline
records about a run (lineage.json) holds the config with values under secret-looking keys dropped
(`strip_secrets`), and is refused if it would contain the value of any secret-looking environment
variable (`assert_no_secrets`): a key that reached a record some other way.
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
    """Drop values under secret-looking keys (an `*_env` key names a variable and is kept)."""
    if isinstance(obj, dict):
        return {k: ("<removed>" if _SECRET_KEY.search(str(k)) and not str(k).endswith("_env") else strip_secrets(v))
                for k, v in obj.items()}
    if isinstance(obj, list):
        return [strip_secrets(v) for v in obj]
    return obj


def _secret_values() -> list[str]:
    return [v for k, v in os.environ.items() if _SECRET_ENV.search(k) and len(v) >= 8]


def assert_no_secrets(text: str, where: str) -> None:
    """Refuse to write `text` if it contains the value of a secret-looking environment variable."""
    for value in _secret_values():
        if value in text:
            raise QrewriteError(f"refusing to write {where}: it would contain the value of a secret environment "
                                "variable", hint="pass env var names in config, never their values")
