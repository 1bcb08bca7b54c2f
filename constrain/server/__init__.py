"""An OpenAI-compatible server for a :class:`constrain.LLM` (the ``[server]`` extra: FastAPI and uvicorn).

::

    app = constrain.server.create_app(llm)            # a FastAPI app: /v1/models, /v1/completions, /v1/chat/completions
    constrain.server.serve(llm, "127.0.0.1", 8000)     # or run it with uvicorn; `constrain serve` on the command line

``response_format`` (``json_object``, ``json_schema``) and ``tools`` are compiled to structures, so the answers
follow them exactly; concurrent requests share forward passes (:class:`~constrain.generation.batching.Scheduler`).
See docs/server.md.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from constrain import collector

__all__ = ["BackgroundServer", "create_app", "serve"]


def create_app(llm: Any, **options: Any) -> Any:
    """The FastAPI application serving ``llm``; see :func:`constrain.server.app.create_app` for the options."""
    from constrain.server.app import create_app as make

    return make(llm, **options)


def serve(llm: Any, host: str = "127.0.0.1", port: int = 8000, *, log_level: str = "info", **options: Any) -> None:
    """Serve ``llm`` with uvicorn until interrupted (``options`` go to :func:`create_app`). The process is the
    server's: what start-up made is frozen out of the collector's sight (:func:`constrain.collector.freeze`)."""
    uvicorn = _uvicorn()
    app = create_app(llm, **options)
    collector.freeze()
    uvicorn.run(app, host=host, port=port, log_level=log_level)


class BackgroundServer:
    """The server in a thread of this process, on a free port by default (tests, benchmarks, notebooks)::

    with BackgroundServer(llm) as server:
        client = openai.OpenAI(base_url=server.url, api_key="unused")
    """

    def __init__(self, llm: Any, host: str = "127.0.0.1", port: int = 0, *, log_level: str = "warning", **options):
        uvicorn = _uvicorn()
        self.app = create_app(llm, **options)
        config = uvicorn.Config(self.app, host=host, port=port, log_level=log_level, lifespan="on")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="constrain-server", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 60
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start on {host}:{port}")
            time.sleep(0.01)
        bound = self._server.servers[0].sockets[0].getsockname()
        self.host, self.port = bound[0], bound[1]
        #: The API's base URL, as OpenAI's client takes it (``.../v1``).
        self.url = f"http://{self.host}:{self.port}/v1"

    def stop(self, timeout: float = 30) -> None:
        self._server.should_exit = True
        self._thread.join(timeout)

    def __enter__(self) -> BackgroundServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _uvicorn() -> Any:
    from constrain.errors import MissingExtraError

    try:
        import uvicorn
    except ModuleNotFoundError as exc:
        raise MissingExtraError("uvicorn", "server", missing=exc.name, feature="constrain.server") from exc
    return uvicorn
