"""The HTTP routes (FastAPI, as vLLM's and ms-swift's OpenAI servers): GET /v1/models, POST
/v1/chat/completions and POST /v1/completions, streamed as server-sent events (`data: {...}` then
`data: [DONE]`) or whole. Every /v1 route wants `Authorization: Bearer KEY` when the server has a key
(`--api-key`, or one of the page's keys: jobs/serve/keys.py).

A handler checks the request, turns it into rows (one per prompt and `n`), hands them to the
scheduler's thread and waits on an asyncio queue that the thread fills."""
from __future__ import annotations

import asyncio

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import StreamingResponse

from jobs.serve import prompts
from jobs.serve.errors import APIError, error_response, install_handlers
from jobs.serve.keys import Gate, KeyStore
from jobs.serve.responses import Answer, sse
from jobs.serve.rows import Row, Sampling
from jobs.serve.scheduler import Generation, QueueFull, Scheduler
from jobs.serve.schema import ChatRequest, CompletionRequest, Sampled, parse
from jobs.serve.served import Served, ServedModel


def create_app(served: Served, scheduler: Scheduler, api_key: str | None = None,
               keys: KeyStore | None = None) -> FastAPI:
    """`keys`: the page's key store (jobs/serve/keys.py), re-read when it changes; its keys work
    beside `api_key`."""
    app = FastAPI(title="Fusetune OpenAI-compatible API", docs_url=None, redoc_url=None, openapi_url=None)
    install_handlers(app)
    gate = Gate(api_key, keys)

    def check_key(request: Request) -> None:   # sync: FastAPI runs it on a thread (it may read a file)
        given = request.headers.get("authorization", "")
        token = given[7:].strip() if given[:7].lower() == "bearer " else ""
        if not gate.allows(token):
            what = "no API key was given" if not token else "the API key is not valid"
            raise APIError(401, f"{what}: send the server's key as 'Authorization: Bearer KEY'",
                           code="invalid_api_key")

    v1 = APIRouter(prefix="/v1", dependencies=[Depends(check_key)])

    @v1.get("/models")
    async def list_models():
        return {"object": "list", "data": [_model_card(m) for m in served.models.values()]}

    @v1.get("/models/{model_id:path}")
    async def one_model(model_id: str):
        return _model_card(_served_model(served, model_id))

    @v1.post("/chat/completions")
    async def chat(request: Request):
        body = parse(await request.body(), ChatRequest)
        model = _served_model(served, body.model)
        prompt = prompts.chat_prompt(body, model.tokenizer)
        limit = body.max_completion_tokens or body.max_tokens
        rows = _rows([prompt], body, limit, prompts.CHAT_MAX_TOKENS, served.context,
                     scheduler.max_batch_rows)
        return await _answer(scheduler, Answer("chat", model.id, len(rows), len(prompt)), body, model, rows)

    @v1.post("/completions")
    async def completions(request: Request):
        body = parse(await request.body(), CompletionRequest)
        model = _served_model(served, body.model)
        vocab = served.model.get_input_embeddings().weight.shape[0]
        ids = prompts.completion_prompts(body, model.tokenizer, vocab)
        rows = _rows(ids, body, body.max_tokens, prompts.COMPLETION_MAX_TOKENS, served.context,
                     scheduler.max_batch_rows)
        answer = Answer("completion", model.id, len(rows), sum(len(p) for p in ids))
        return await _answer(scheduler, answer, body, model, rows)

    @app.get("/health")
    async def health():
        return {"status": "ok", "batches": scheduler.batches, "joins": scheduler.joins, "reuses": scheduler.reuses,
                "steps": scheduler.steps}

    app.include_router(v1)
    return app


def _model_card(model: ServedModel) -> dict:
    return {"id": model.id, "object": "model", "created": 0, "owned_by": model.owned_by}


def _served_model(served: Served, model_id: str) -> ServedModel:
    if model_id not in served.models:
        raise APIError(404, f"model {model_id!r} is not served here; the models are: " +
                       ", ".join(served.models), param="model", code="model_not_found")
    return served.models[model_id]


def _rows(ids: list[list[int]], body: Sampled, limit: int | None, default: int, context: int,
          max_rows: int) -> list[Row]:
    """One row per prompt and answer (`n` per prompt, prompt 0's first), each with its own max_tokens."""
    if len(ids) * body.n > max_rows:
        raise APIError(400, f"{len(ids)} prompts x n={body.n} is more than the {max_rows} answers a "
                            "request may ask for", param="n", code="invalid_value")
    rows = []
    for prompt in ids:
        max_new = prompts.new_tokens(limit, default, len(prompt), context)
        rows += [Row(index=len(rows) + j, prompt=prompt, max_tokens=max_new, stop=body.stops) for j in range(body.n)]
    return rows


async def _answer(scheduler: Scheduler, answer: Answer, body: Sampled, model: ServedModel, rows: list[Row]):
    loop, inbox = asyncio.get_running_loop(), asyncio.Queue()

    def sink(events: list[tuple]) -> None:   # runs on the scheduler's thread
        try:
            loop.call_soon_threadsafe(inbox.put_nowait, events)
        except RuntimeError:
            pass   # the event loop is closed: the server is shutting down

    sampling = Sampling(temperature=body.temperature, top_p=body.top_p, stop=body.stops, seed=body.seed)
    generation = Generation(model.id, model.adapter, model.tokenizer, rows, sampling, sink)
    try:
        scheduler.submit(generation)
    except QueueFull as exc:
        raise APIError(429, f"the server is busy: {exc}", type="rate_limit_error", code="queue_full") from None
    if body.stream:
        usage = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(_stream(answer, generation, inbox, usage), media_type="text/event-stream")
    try:
        async for kind, event in _events(inbox):
            if kind == "error":
                return error_response(500, event, type="server_error")
            answer.add(*event)
    finally:
        generation.cancelled.set()   # a no-op once done; stops the rows of a client that went away
    return answer.body()


async def _events(inbox: asyncio.Queue):
    """("delta", (index, text, finish, tokens)) and ("error", message) until the request ends."""
    while True:
        for event in await inbox.get():
            if event[0] == "end":
                return
            yield (event[0], event[1]) if event[0] == "error" else ("delta", event[1:])


async def _stream(answer: Answer, generation: Generation, inbox: asyncio.Queue, usage: bool):
    try:
        if answer.kind == "chat":   # OpenAI's first chunk of each choice names the role
            for index in range(len(answer.texts)):
                yield answer.chunk(index, None, None, role=True)
        async for kind, event in _events(inbox):
            if kind == "error":
                yield sse({"error": {"message": event, "type": "server_error", "param": None, "code": None}})
                return
            answer.add(*event)
            index, text, finish, _ = event
            yield answer.chunk(index, text, finish)
        if usage:
            yield answer.usage_chunk()
        yield sse("[DONE]")
    finally:
        generation.cancelled.set()   # the client closed the stream: its rows stop taking batch slots
