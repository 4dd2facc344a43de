"""Onboarding a tenant of one's own: `qrewrite tenant init NAME --excel F --kb F` reads the test set and the knowledge
base and proposes the tenant block of config.yaml (README "Your own tenant in five minutes").

* ``scaffold``: the proposals, each with its evidence, put together (``propose``), each from its own module:
  ``columns`` the sheet's column mapping (header names matched in ``names``, else the cells), ``kb_fields`` the KB's
  fields (key names, else value types), ``rows`` the rows (ingest's row builder) and the language (the CJK share
  ingest checks), ``teachers`` which teacher fits (the embedded ``resolve`` teacher scored in process on a seeded
  sample of rows with gold, beside the raw query and query + history), ``block`` the tenant block as YAML,
  ``config_file`` appending it to the config file with its comments kept, ``report`` the printed report,
  ``inputs`` the files read;
* ``cli``: the ``tenant`` subcommand and its ``init`` action (registered from qrewrite/cli.py).
"""
