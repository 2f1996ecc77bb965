"""The OpenAI-compatible HTTP API: /v1/completions, /v1/chat/completions, /v1/models, /health
and /metrics, with Server-Sent Events for streaming.

A streamed response sends one `data: {json}` event per text piece and ends with
`data: [DONE]`. Errors have OpenAI's shape, {"error": {"message", "type", "param", "code"}},
with a 4xx status for anything the client can fix.
"""

from __future__ import annotations

import asyncio
import json
import time
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from minisgl.message import ReplyMsg
from minisgl.server.args import ServerArgs
from minisgl.server.frontend import FrontendManager
from minisgl.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    SamplingFields,
    request_params,
)
from minisgl.utils import MinisglError


class ApiError(Exception):
    """An error answered in OpenAI's JSON shape."""

    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = (
            status,
            message,
            type_,
            param,
            code,
        )

    def response(self) -> JSONResponse:
        return JSONResponse(
            {
                "error": {
                    "message": self.message,
                    "type": self.type,
                    "param": self.param,
                    "code": self.code,
                }
            },
            status_code=self.status,
        )


class BodySizeLimit:
    """ASGI middleware: refuse (413) a body over `max_bytes` before anything reads it all."""

    def __init__(self, app: Callable, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await self.too_large().response()(scope, receive, send)
        received = 0

        async def counting_receive() -> dict:  # a chunked body has no content-length
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_bytes:
                raise self.too_large()
            return message

        await self.app(scope, counting_receive, send)

    def too_large(self) -> ApiError:
        return ApiError(
            413, f"request body is larger than {self.max_bytes} bytes", code="request_too_large"
        )


async def wait_for_disconnect(request: Request) -> None:
    """Return once the client has closed the connection (its body was read already, so the
    next ASGI message can only be the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def metrics_text(status: Any) -> str:
    """The scheduler's status in Prometheus' text format, one gauge or counter per line."""
    integrity = -1 if status.integrity_ok is None else int(status.integrity_ok)
    metrics = [
        ("running_requests", "gauge", "requests in the running (decode) set", status.running),
        ("waiting_requests", "gauge", "requests waiting to be admitted", status.waiting),
        ("kv_pages_used", "gauge", "KV pages held by requests", status.used_pages),
        ("kv_pages_free", "gauge", "KV pages free", status.free_pages),
        ("kv_pages_cached", "gauge", "KV pages held by the prefix cache", status.cached_pages),
        (
            "generated_tokens_total",
            "counter",
            "tokens generated since start",
            status.generated_tokens,
        ),
        (
            "integrity_ok",
            "gauge",
            "last idle integrity check: 1 passed, 0 failed, -1 not run",
            integrity,
        ),
    ]
    lines = []
    for name, kind, help_text, value in metrics:
        lines += [
            f"# HELP minisgl_{name} {help_text}",
            f"# TYPE minisgl_{name} {kind}",
            f"minisgl_{name} {value}",
        ]
    return "\n".join(lines) + "\n"


def choice(chat: bool, text: str, finish_reason: str | None, stream: bool) -> dict[str, Any]:
    """One entry of "choices": a completion's text, a chat message, or a chat delta."""
    if not chat:
        return {"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": None}
    key = "delta" if stream else "message"
    return {"index": 0, key: {"role": "assistant", "content": text}, "finish_reason": finish_reason}


def usage(reply: ReplyMsg) -> dict[str, int]:
    return {
        "prompt_tokens": reply.prompt_tokens,
        "completion_tokens": reply.completion_tokens,
        "total_tokens": reply.prompt_tokens + reply.completion_tokens,
    }


def sse_event(data: dict[str, Any] | str) -> str:
    """One Server-Sent Event: a `data:` line and a blank line."""
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"


async def stream_events(
    first: ReplyMsg,
    rest: AsyncIterator[ReplyMsg],
    chat: bool,
    header: dict[str, Any],
    include_usage: bool,
) -> AsyncIterator[str]:
    """The SSE events of a streamed response, from the request's replies.

    The first reply's chunk always, even without text: it comes with the first token, so the
    client learns when that was (its time to first token), as OpenAI's first chunk does. After
    it, one chunk per non-empty text piece, the finish_reason in the last chunk, then (if the
    client asked with stream_options.include_usage) a chunk with usage and no choices, then
    `[DONE]`. Every chunk carries the same id, object, created and model (`header`).
    """
    reply = first
    while True:
        if reply is first or reply.text or reply.finish_reason is not None:
            yield sse_event(
                {**header, "choices": [choice(chat, reply.text, reply.finish_reason, True)]}
            )
        if reply.finish_reason is not None:
            break
        reply = await anext(rest)
    if include_usage:
        yield sse_event({**header, "choices": [], "usage": usage(reply)})
    yield sse_event("[DONE]")


def create_app(args: ServerArgs, frontend: FrontendManager) -> FastAPI:
    """The FastAPI application of one server, talking to its processes through `frontend`."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        frontend.start()
        yield
        frontend.close()

    app = FastAPI(title="minisgl", lifespan=lifespan)
    app.add_middleware(BodySizeLimit, max_bytes=args.max_body_bytes)

    async def check_api_key(request: Request) -> None:
        """With --api-key, the request must carry `Authorization: Bearer <key>`."""
        if (
            args.api_key is not None
            and request.headers.get("authorization") != f"Bearer {args.api_key}"
        ):
            raise ApiError(
                401,
                "missing or wrong API key (Authorization: Bearer <key>)",
                code="invalid_api_key",
            )

    @app.exception_handler(ApiError)
    async def api_error(request: Request, error: ApiError) -> JSONResponse:
        return error.response()

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request: Request, error: RequestValidationError) -> JSONResponse:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"] if part != "body")
        message = (
            "the body is not valid JSON"
            if first["type"] == "json_invalid"
            else f"{where or 'body'}: {first['msg']}"
        )
        return ApiError(400, message, param=where or None).response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        return ApiError(error.status_code, str(error.detail), "invalid_request_error").response()

    async def next_reply(replies: AsyncIterator[ReplyMsg], gone: asyncio.Future) -> ReplyMsg:
        """The next reply; gives up if the client disconnects meanwhile (`gone`), and fails
        (500) if the listener that routes replies has died, rather than wait forever."""
        task = asyncio.ensure_future(anext(replies))
        done, _ = await asyncio.wait(
            {task, frontend.listener, gone}, return_when=asyncio.FIRST_COMPLETED
        )
        if task in done:
            return task.result()
        task.cancel()
        if frontend.listener in done:
            raise ApiError(
                500, f"the reply listener stopped: {frontend.listener!r}", type_="internal_error"
            )
        # Nobody will read this answer; 499 is the usual code for "client closed request".
        raise ApiError(499, "the client disconnected", code="client_closed_request")

    async def generate(
        body: SamplingFields, request: Request, chat: bool, **prompt: Any
    ) -> StreamingResponse | JSONResponse:
        """Run one request: check it, queue it, then answer whole or as a stream."""
        if body.model not in (args.model_name, args.model_path):
            raise ApiError(
                404,
                f"model {body.model!r} does not exist; this server serves {args.model_name!r}",
                param="model",
                code="model_not_found",
            )
        try:
            params = request_params(body)
        except MinisglError as error:
            raise ApiError(400, str(error)) from error
        uid = frontend.submit(params, stop=body.stop_strings(), **prompt)
        replies = frontend.replies(uid)
        header = {
            "id": f"{'chatcmpl' if chat else 'cmpl'}-{uid}",
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": args.model_name,
        }
        gone = asyncio.ensure_future(wait_for_disconnect(request))
        try:
            first = await next_reply(replies, gone)  # waits for prefill: a refusal is a 4xx
            if first.error is not None:
                raise ApiError(400, first.error)
            if body.stream:
                header["object"] = "chat.completion.chunk" if chat else "text_completion"

                async def events() -> AsyncIterator[str]:
                    try:
                        async for event in stream_events(
                            first, replies, chat, header, body.include_usage
                        ):
                            yield event
                    finally:  # a client that leaves mid-stream frees its pages at once
                        frontend.abort(uid)

                return StreamingResponse(events(), media_type="text/event-stream")
            text, reply = [first.text], first
            while reply.finish_reason is None:
                reply = await next_reply(replies, gone)
                text.append(reply.text)
            return JSONResponse(
                {
                    **header,
                    "usage": usage(reply),
                    "choices": [choice(chat, "".join(text), reply.finish_reason, False)],
                }
            )
        except BaseException:
            frontend.abort(uid)
            raise
        finally:  # a streaming response watches for the disconnect itself
            gone.cancel()

    auth = [Depends(check_api_key)]

    @app.post("/v1/completions", dependencies=auth)
    async def completions(body: CompletionRequest, request: Request):  # noqa: ANN202
        return await generate(body, request, chat=False, prompt=body.prompt)

    @app.post("/v1/chat/completions", dependencies=auth)
    async def chat_completions(body: ChatCompletionRequest, request: Request):  # noqa: ANN202
        return await generate(
            body, request, chat=True, messages=[m.model_dump() for m in body.messages]
        )

    @app.get("/v1/models", dependencies=auth)
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {"id": args.model_name, "object": "model", "created": 0, "owned_by": "minisgl"}
            ],
        }

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/metrics", dependencies=auth)
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(
            metrics_text(await frontend.status()), media_type="text/plain; version=0.0.4"
        )

    return app
