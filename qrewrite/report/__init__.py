"""Self-contained offline HTML report over every tenant (qrewrite.report.build)."""
