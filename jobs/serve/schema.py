"""The request bodies of /v1/chat/completions and /v1/completions (OpenAI's parameter names, ranges
and defaults), checked by pydantic so every bad value is a 400 naming the parameter.

Parameters this server does not implement (penalties, logprobs, tools, echo, best_of > 1) are
refused by name rather than silently ignored; unknown extra fields are ignored, as OpenAI does."""
from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError, field_validator

from jobs.serve.errors import APIError, bad_parameter

MAX_N = 16
MAX_STOPS = 4   # as OpenAI
UNSUPPORTED = {"frequency_penalty": 0, "presence_penalty": 0, "logit_bias": None, "logprobs": None,
               "top_logprobs": None, "tools": None, "functions": None, "tool_choice": None,
               "suffix": None, "echo": False, "best_of": 1}


class StreamOptions(BaseModel):
    include_usage: StrictBool = False


class Sampled(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1)
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int = Field(1, ge=1, le=MAX_N)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None

    @field_validator("stop")
    @classmethod
    def _stops(cls, value):
        stops = [value] if isinstance(value, str) else list(value or [])
        if len(stops) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} stop sequences")
        if any(not s for s in stops):
            raise ValueError("a stop sequence must not be empty")
        return stops

    @property
    def stops(self) -> list[str]:
        return list(self.stop or [])


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None

    def as_template_message(self) -> dict:
        content = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content or [])
        return {"role": "system" if self.role == "developer" else self.role, "content": content}


class ChatRequest(Sampled):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)


class CompletionRequest(Sampled):
    prompt: str | list[str] | list[int] | list[list[int]]

    @field_validator("prompt")
    @classmethod
    def _prompts(cls, value):
        if isinstance(value, str) or (value and isinstance(value[0], int)):
            value = [value]
        if not value or any(len(p) == 0 for p in value):
            raise ValueError("the prompt must not be empty")
        return value


def parse(raw: bytes, model: type[Sampled]) -> Sampled:
    """The request body as `model`, or an APIError (400) saying what is wrong and where."""
    try:
        body = json.loads(raw or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise APIError(400, f"the request body is not valid JSON ({exc})", code="invalid_json") from None
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object", code="invalid_json")
    body = {key: value for key, value in body.items() if value is not None}   # null means "the default"
    for name, default in UNSUPPORTED.items():
        if name in body and body[name] != default and body[name] not in (False, [], {}):
            raise APIError(400, f"{name}: not supported by this server (leave it out)", param=name,
                           code="unsupported_parameter")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise bad_parameter(exc) from None
