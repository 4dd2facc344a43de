"""API keys: read from the environment only, and kept out of everything the pipeline records.

Config holds only the *name* of the environment variable (`api_key_env`). A service may quote the
key it rejected in an error body, and error bodies end up in teacher.jsonl, logs and exceptions, so
every client that holds a key passes such text through `redact` before keeping it.
"""

from __future__ import annotations

import os
import re

from .errors import QrewriteError

MARK = "[REDACTED]"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


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
