"""One error type the CLI turns into a clean message and exit code 2 (no traceback)."""

from __future__ import annotations


class QrewriteError(Exception):
    """A user-facing error: says what is wrong, where, and what to do."""

    def __init__(self, message: str, *, file: str | None = None, row: int | None = None,
                 column: str | None = None, hint: str | None = None):
        self.file, self.row, self.column, self.hint = file, row, column, hint
        where = []
        if file is not None:
            where.append(f"file {file}")
        if row is not None:
            where.append(f"row {row}")
        if column is not None:
            where.append(f"column {column!r}")
        text = f"{', '.join(where)}: {message}" if where else message
        if hint:
            text += f"\n  hint: {hint}"
        super().__init__(text)


class ServiceUnavailable(QrewriteError):
    """A remote service (teacher API, RAG service) stayed down after all retries."""


class ServiceRefused(QrewriteError):
    """A service answered every call so far with the same refusal (HTTP 400, a reply cut at the token cap):
    the request, i.e. a setting, is what is wrong, so more calls would fail the same way."""
