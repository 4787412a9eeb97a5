"""The errors the server answers with, in OpenAI's shape: {"error": {"message", "type",
"param", "code"}}."""
from __future__ import annotations

from fastapi.responses import JSONResponse


class APIError(Exception):
    """An OpenAI-style error: `code` is a string or None, as OpenAI's (the status is the
    HTTP one)."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param
        self.code, self.headers = code, headers

    def response(self) -> JSONResponse:
        return JSONResponse({"error": {"message": self.message, "type": self.kind,
                                       "param": self.param, "code": self.code}},
                            status_code=self.status, headers=self.headers)
