"""The embedded default teacher: referent resolution over the tenant's entity lexicon.

Not an LLM, and it says so in every row (provider ``resolve``, model ``kb-entity-resolver``). It
writes the question a person would write once they know what the user means:

* a product/course named loosely in the question (alias, typo, homophone: "藻由DHA", "小学澳数",
  "行测") is replaced by its KB name ("藻油DHA软胶囊", "小学奥数思维课", "公务员行测系统班");
* a question that names none ("那它孕妇能吃吗", "老师有多少年经验") gets the one the history names
  last, else the one in the profile: it replaces the pronoun ("它", "这个", "这门课" …), or leads the
  question when there is none;
* everything else (the aspect asked about, the wording) is the user's own, so intent is kept.

A question about no entity (shipping, invoices) stays as it is. Entities come from the KB titles
(``qrewrite.entities``). On a KB whose titles name no entities (no titles, or titles that share no
"entity + aspect" pattern) it could only hand every question back, so it refuses to start
(``ResolveTeacher.for_tenant``), saying to use ``teacher.provider: openai``; with entities that the
questions rarely need, the teacher stage warns when most questions come back unchanged.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from .. import entities as entities_module
from .. import referent as referent_module
from ..entities import EntityLexicon
from ..errors import QrewriteError
from ..referent import Resolver

# the resolver's code is part of the cache key: a changed resolver never serves stale cached rows
_CODE_HASH = hashlib.sha256(b"".join(Path(p).read_bytes() for p in (__file__, entities_module.__file__,
                                                                   referent_module.__file__))).hexdigest()[:16]


class ResolveTeacher(Resolver):
    provider = "resolve"
    model = "kb-entity-resolver"

    @classmethod
    def for_tenant(cls, tenant: dict) -> "ResolveTeacher":
        """The teacher over the tenant's KB; a QrewriteError before any rewrite when its titles name no entity.

        Without entities nothing tells it what a question refers to (the history and profile are matched
        against the entity names only), so every rewrite would be the question itself: training data that
        teaches the student to copy."""
        from ..kb import tenant_kb

        docs = tenant_kb(tenant)
        lexicon = EntityLexicon.from_docs(docs)
        if not lexicon.entities:
            titled = sum(1 for d in docs if d.title.strip())
            field = (tenant["kb"].get("fields") or {}).get("title", "title")
            why = ("none of them reads \"<entity><aspect>\" with one entity over several aspects" if titled else
                   "tenants[].kb.fields.title is null" if field is None else f"title field {field!r}")
            raise QrewriteError(
                f"teacher.provider resolve cannot rewrite for tenant {tenant['name']}: the KB titles name no "
                f"product or course ({titled} of {len(docs)} documents have a title; {why}), so every rewrite "
                f"would be the question itself",
                file=str(tenant["kb"]["path"]),
                hint="set a teacher that fits this tenant (tenants[].teacher): `teacher: {provider: openai}`, an "
                     "LLM through an API (teacher.openai: base_url / model / api_key_env; README \"Pointing at real "
                     "services\"), or `teacher: {provider: column}` with the sheet's people's rewrites "
                     "(tenants[].columns.rewrite); `qrewrite tenant init` measures which fit. If the KB holds "
                     "titles under another field name, map it with tenants[].kb.fields.title")
        return cls(lexicon)

    def __init__(self, lexicon: EntityLexicon, cfg: dict | None = None):
        super().__init__(lexicon)
        self.cfg = dict(cfg or {})

    @property
    def params(self) -> dict:
        # The code's hash is part of the cache key: a changed resolver never serves stale cached rows.
        return {"entities": len(self.lexicon.entities), "code": _CODE_HASH, **self.cfg}
