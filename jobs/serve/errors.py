"""Errors as the OpenAI API writes them: `{"error": {"message", "type", "param", "code"}}` with a 4xx
status for what the client sent, so the official clients raise their own typed errors
(BadRequestError, AuthenticationError, NotFoundError, RateLimitError) with our message. A failure
of ours is a 500 with a one-line message, never a traceback."""
from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException


class APIError(Exception):
    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def response(self) -> JSONResponse:
        return error_response(self.status, self.message, self.type, self.param, self.code)


def error_response(status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                   code: str | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": type, "param": param, "code": code}}
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(body, status_code=status, headers=headers)


def bad_parameter(exc: ValidationError) -> APIError:
    """The first problem pydantic found, naming the parameter (`messages.0.role`) and what it should be."""
    first = exc.errors()[0]
    param = ".".join(str(part) for part in first["loc"]) or None
    message = first["msg"]
    if first["type"] == "missing":
        message = "this parameter is required"
    elif first["type"] == "extra_forbidden":
        message = "this parameter is not supported by this server"
    return APIError(400, f"{param}: {message}" if param else message, param=param, code="invalid_value")


def install_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError):
        return exc.response()

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException):
        if exc.status_code == 404:
            return error_response(404, f"no route {request.method} {request.url.path} (see GET /v1/models, "
                                       "POST /v1/chat/completions, POST /v1/completions)", code="unknown_url")
        return error_response(exc.status_code, str(exc.detail))

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError):
        return error_response(400, str(exc.errors()[0].get("msg", "invalid request")))

    @app.exception_handler(Exception)
    async def _ours(_: Request, exc: Exception):
        return error_response(500, f"server error: {type(exc).__name__}: {exc}", type="server_error")
