"""Onboarding a tenant of one's own: `qrewrite tenant init NAME --excel F --kb F` reads the test set and the knowledge
base and proposes the tenant block of config.yaml (README "Your own tenant in five minutes").

* ``scaffold``: the proposals, each with its evidence: the sheet's column mapping (header names, else the
  cells), the KB's fields (key names, else value types), the language (the CJK share ingest checks), which teacher
  fits (the embedded ``resolve`` teacher scored in process on a seeded sample of rows with gold, beside the raw
  query and query + history), the tenant block as YAML, and appending it to the config file with its comments kept;
* ``cli``: the ``tenant`` subcommand and its ``init`` action (registered from qrewrite/cli.py).
"""
