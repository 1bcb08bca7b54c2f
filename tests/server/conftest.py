"""The embedded Gemma 3 270M, loaded once for the scheduler's and the server's tests."""

from __future__ import annotations

import pytest
import torch

import constrain


@pytest.fixture(scope="session")
def llm():
    """The embedded model on one torch thread (two threads that wait for each other are slower on 2 cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield constrain.LLM()
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def server(llm):
    """The real server (uvicorn, FastAPI) in a thread of this process, on a free port of 127.0.0.1."""
    from constrain.server import BackgroundServer

    with BackgroundServer(llm) as running:
        yield running


@pytest.fixture(scope="session")
def client(server):
    """OpenAI's own client, pointed at the server (no retries: an error must show at once)."""
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=300)
