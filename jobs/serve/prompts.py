"""Prompt token ids for a request: chat messages through the model id's own tokenizer chat template
(the adapter's tokenizer, saved with the job), completion prompts as text or token ids; and how many
new tokens each may have within the model's context."""
from __future__ import annotations

from jobs.serve.errors import APIError
from jobs.serve.schema import ChatRequest, CompletionRequest

CHAT_MAX_TOKENS = 512          # when a chat request names no max_tokens (capped by the context left)
COMPLETION_MAX_TOKENS = 16     # OpenAI's default for /v1/completions


def chat_prompt(request: ChatRequest, tokenizer) -> list[int]:
    if not getattr(tokenizer, "chat_template", None):
        raise APIError(400, f"model {request.model!r} has no chat template: use /v1/completions",
                       param="model", code="no_chat_template")
    messages = [m.as_template_message() for m in request.messages]
    try:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    except Exception as exc:   # noqa: BLE001 - jinja's TemplateError and raise_exception() in a template
        raise APIError(400, f"messages: the chat template of {request.model!r} refused them: {exc}",
                       param="messages", code="invalid_value") from None
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def completion_prompts(request: CompletionRequest, tokenizer, vocab_size: int) -> list[list[int]]:
    prompts = []
    for prompt in request.prompt:
        if isinstance(prompt, str):
            prompts.append(tokenizer(prompt)["input_ids"])
            continue
        bad = [t for t in prompt if not 0 <= t < vocab_size]
        if bad:
            raise APIError(400, f"prompt: token id {bad[0]} is outside the vocabulary (0..{vocab_size - 1})",
                           param="prompt", code="invalid_value")
        prompts.append(list(prompt))
    return prompts


def new_tokens(requested: int | None, default: int, prompt_len: int, context: int) -> int:
    """max_tokens for one prompt; a 400 when the prompt (plus what was asked for) exceeds the context."""
    room = context - prompt_len
    if room < 1 or (requested is not None and requested > room):
        asked = f" plus max_tokens {requested}" if requested is not None else ""
        raise APIError(400, f"the prompt is {prompt_len} tokens{asked}, more than this model's context of "
                            f"{context} tokens: shorten the messages or lower max_tokens",
                       param="messages", code="context_length_exceeded")
    return requested if requested is not None else min(default, room)
