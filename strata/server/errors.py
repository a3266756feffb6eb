"""Errors of the HTTP server in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.

An `APIError` carries the HTTP status and the body's fields; request parsing, admission control
and the engine thread raise or send it, and the app turns it into a JSON response (or, once a
stream has started, into one last `data:` event).

Must not parse requests or touch the engine: it only describes errors.
"""
from __future__ import annotations

from typing import Any

#: OpenAI's error type for each status the server answers with.
ERROR_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error",
               405: "invalid_request_error", 413: "invalid_request_error", 500: "server_error",
               503: "server_error"}


class APIError(Exception):
    """A request the server refuses or could not serve: status, message, the field at fault."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = type or ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def __repr__(self) -> str:
        return f"APIError({self.status}, {self.message!r}, param={self.param!r}, code={self.code!r})"


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


__all__ = ["APIError", "ERROR_TYPES", "bad_request"]
