"""The FastAPI application: the OpenAI routes, /health, /metrics, the API key, and every error in
OpenAI's JSON shape with its status (a body FastAPI cannot parse or validate is a 400)."""

import logging
import secrets
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.exceptions import HTTPException

from impnb.errors import ImpnbError, ParameterError, UnsupportedError
from impnb.server.engine_loop import EngineLoop
from impnb.server.generation import ApiError, Generation
from impnb.server.metrics import Metrics
from impnb.server.protocol import ChatCompletionRequest, CompletionRequest
from impnb.server.responses import error_body

log = logging.getLogger("impnb.server")


@dataclass
class ServerConfig:
    model_name: str  # the name clients send as "model"
    api_key: str | None = None  # clients must send "Authorization: Bearer KEY"
    max_waiting: int | None = None  # requests beyond max_num_seqs that queue; more get a 503 (None: all queue)


class Server:
    """The routes' shared state: the engine loop, the loaded LLM, the admission count."""

    def __init__(self, config: ServerConfig, loop: EngineLoop, metrics: Metrics):
        self.config, self.loop, self.metrics = config, loop, metrics
        self.model_name = config.model_name
        self.created = int(time.time())
        self.on_load_failed = None  # called once when the model fails to load

    @property
    def llm(self):
        if self.loop.state != "ready":
            raise ApiError(503, f"the model is {self.loop.state}" + (f": {self.loop.error}" if self.loop.error else ""))
        return self.loop.llm

    def admit(self, n: int) -> None:
        """ApiError 503 when n more requests would queue past max_waiting."""
        limit = self.config.max_waiting
        if limit is None:
            return
        room = self.loop.llm.engine.scheduler.config.max_num_seqs + limit - self.loop.n_active
        if n > room:
            raise ApiError(503, f"the server is overloaded ({self.loop.n_active} requests in progress); "
                           f"retry later", code="overloaded")


def build_app(server: Server) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app):
        server.loop.start()
        yield
        server.loop.stop(timeout=30)

    app = FastAPI(title="impnb", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.server = server
    _errors(app, server)

    async def check_key(request: Request) -> None:  # async: FastAPI runs a plain def in its thread pool
        key = server.config.api_key
        if key is None:
            return
        given = request.headers.get("authorization", "")
        if not secrets.compare_digest(given.encode(), f"Bearer {key}".encode()):
            raise ApiError(401, "Incorrect API key provided", code="invalid_api_key")

    def check_model(name: str | None) -> None:
        if name is not None and name != server.model_name:
            raise ApiError(404, f"The model `{name}` does not exist (this server has `{server.model_name}`)",
                           "model", "model_not_found")

    @app.get("/health")
    async def health():
        if server.loop.state != "ready":
            return JSONResponse({"status": server.loop.state}, status_code=503)
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(server.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models", dependencies=[Depends(check_key)])
    async def models():
        card = {"id": server.model_name, "object": "model", "created": server.created, "owned_by": "impnb"}
        if server.loop.state == "ready":
            card["max_model_len"] = server.loop.llm.engine.n_ctx
        return {"object": "list", "data": [card]}

    @app.post("/v1/completions", dependencies=[Depends(check_key)])
    async def completions(body: CompletionRequest, request: Request):
        check_model(body.model)
        return await Generation(server, body, chat=False).answer(request)

    @app.post("/v1/chat/completions", dependencies=[Depends(check_key)])
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        check_model(body.model)
        return await Generation(server, body, chat=True).answer(request)

    return app


def _errors(app: FastAPI, server: Server) -> None:
    def reply(status: int, message: str, param=None, code=None) -> JSONResponse:
        server.metrics.error(status)
        return JSONResponse(error_body(status, message, param, code), status_code=status)

    @app.exception_handler(ApiError)
    async def api_error(_, e: ApiError):
        return reply(e.status, e.message, e.param, e.code)

    @app.exception_handler(ImpnbError)
    async def impnb_error(_, e: ImpnbError):
        status = 400 if isinstance(e, (ParameterError, UnsupportedError)) else 500
        return reply(status, str(e))

    @app.exception_handler(RequestValidationError)
    async def invalid(_, e: RequestValidationError):
        errors = e.errors()
        if any(err.get("type") == "json_invalid" for err in errors):
            return reply(400, "the request body is not valid JSON", code="invalid_json")
        err = errors[0] if errors else {}
        loc = [str(x) for x in err.get("loc", ()) if x != "body"]
        param = ".".join(loc) or None
        return reply(400, f"{param or 'the body'}: {err.get('msg', 'invalid')}"
                     + (f" ({len(errors) - 1} more)" if len(errors) > 1 else ""), param)

    @app.exception_handler(HTTPException)
    async def http_error(_, e: HTTPException):
        return reply(e.status_code, str(e.detail))

    @app.exception_handler(Exception)
    async def unexpected(_, e: Exception):
        log.exception("an unexpected error answering a request")
        return reply(500, f"internal error: {type(e).__name__}")
