"""The gateway's keys: one per tenant, read from an environment variable (serve.api_key_env) when it starts.

A key is compared in constant time and never logged, answered or written anywhere; what the access log and the
errors name is the tenant, never the key.
"""

from __future__ import annotations

import hmac
import os
import re

from ..errors import QrewriteError


def key_env(pattern: str, tenant: str) -> str:
    """serve.api_key_env with {TENANT} → the tenant's name upper-cased, other characters as _ (QREWRITE_KEY_FIVEDOCTORS)."""
    return pattern.replace("{TENANT}", re.sub(r"[^A-Za-z0-9]", "_", tenant).upper())


class Keys:
    """tenant → key, from the environment; `tenant_of` finds whose key a request holds."""

    def __init__(self, pattern: str, tenants: list[str], environ=os.environ):
        self.by_tenant: dict[str, str] = {}
        missing = []
        for t in tenants:
            var = key_env(pattern, t)
            value = environ.get(var, "")
            if not value:
                missing.append(f"{t}: {var}")
            else:
                self.by_tenant[t] = value
        if missing:
            raise QrewriteError(f"no key for {len(missing)} served tenant(s) ({'; '.join(missing)})",
                                hint="export each variable with the tenant's key (e.g. `export "
                                     f"{key_env(pattern, tenants[0])}=$(openssl rand -hex 24)`), or serve only the "
                                     "tenants that have one (--tenant NAME)")
        values = list(self.by_tenant.values())
        if len(set(values)) != len(values):
            raise QrewriteError("two served tenants have the same key: a key must name one tenant",
                                hint="give each tenant's variable its own key")

    def tenant_of(self, presented: str | None) -> str | None:
        """The tenant whose key `presented` is, else None. Every key is compared, in constant time each."""
        found = None
        for tenant, key in self.by_tenant.items():
            if presented is not None and hmac.compare_digest(presented.encode(), key.encode()):
                found = tenant
        return found


def bearer(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, else None."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None
