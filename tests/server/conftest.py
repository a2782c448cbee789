"""pytest fixtures for the tritonserver integration suite.

Run: `source scripts/env.sh && python -m pytest tests/server -v -s`.
A missing server, backend library or ONNX Runtime FAILS the tests (never a silent skip).
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from tritonserver_harness import (  # noqa: E402
    HarnessError,
    ModelRepo,
    TritonServer,
    check_prerequisites,
    ensure_example_models,
)

__all__ = ["TritonServer", "ModelRepo"]


@pytest.fixture(scope="session")
def example_models():
    """Checks the server/backend exist and the example ONNX files are exported (fails otherwise)."""
    try:
        check_prerequisites()
        ensure_example_models(("resnet50", "bert_small", "identity"))
    except HarnessError as e:
        pytest.fail(str(e), pytrace=False)
    return os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "models")


@pytest.fixture
def make_repo(tmp_path_factory, example_models):
    """Factory: make_repo() -> a fresh ModelRepo under pytest's tmp dir."""

    def _make(name: str = "repo") -> ModelRepo:
        return ModelRepo(str(tmp_path_factory.mktemp(name)))

    return _make


@pytest.fixture
def start_server(tmp_path_factory, example_models):
    """Factory: start_server(repo_dir, *extra_args) -> a ready TritonServer, stopped at teardown."""
    servers = []

    def _start(repo_dir: str, *extra_args: str, **kw) -> TritonServer:
        log_dir = str(tmp_path_factory.mktemp("server-log"))
        srv = TritonServer(repo_dir, extra_args, log_dir=log_dir, **kw)
        servers.append(srv)
        return _start_or_fail(srv)

    yield _start
    for srv in servers:
        srv.stop()


def module_server(request, tmp_path_factory, repo: ModelRepo, *extra_args: str, **kw) -> TritonServer:
    """Start a server for a module-scoped fixture; stopped by the fixture's finalizer."""
    srv = TritonServer(repo.root, extra_args, log_dir=str(tmp_path_factory.mktemp("server-log")), **kw)
    request.addfinalizer(srv.stop)
    return _start_or_fail(srv)


def _start_or_fail(srv: TritonServer) -> TritonServer:
    """Starts the server; a failed start fails the test with the server's log."""
    try:
        srv.start()
    except HarnessError as e:
        pytest.fail(str(e), pytrace=False)
    print(f"\n[server] pid {srv.pid} http {srv.http_url} grpc {srv.grpc_url} log {srv.log_path}")
    return srv
