"""`kvbench serve --api-key`: every route but /health asks for the key as a bearer token (401 in
OpenAI's error shape without it), a bind other machines can reach is refused without a key
unless --no-auth, and the stress benchmark sends the key it is given, which no result holds.
On the tiny model."""
from __future__ import annotations

import json

import pytest

from tests.plugins.extras import require_extra

require_extra("serve")

import torch  # noqa: E402 - after the skip

from kvbench.benchmarks import measurement  # noqa: E402
from kvbench.benchmarks.measure import load_generator  # noqa: E402
from kvbench.benchmarks.measure.load_generator import Prompt  # noqa: E402
from kvbench.benchmarks.specs.server_target import parse_server  # noqa: E402
from kvbench.benchmarks.specs.stress import Stress, StressParams  # noqa: E402
from kvbench.config.fields import SettingError  # noqa: E402
from kvbench.methods import build_method, implementation  # noqa: E402
from kvbench.methods.settings.identity import Identity  # noqa: E402
from kvbench.models.session import TorchSession  # noqa: E402
from kvbench.serve.app import create_app  # noqa: E402
from kvbench.serve.auth import check_access  # noqa: E402
from kvbench.serve.engine import Engine  # noqa: E402
from tests.plugins.asgi import AppInThread  # noqa: E402
from tests.plugins.cli_support import invoke  # noqa: E402
from tests.plugins.model_runs import cpu_context  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

KEY = "kvb-test-4f1c9e"
COMPLETION = {"prompt": "The cache", "max_tokens": 2, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def engine(tiny_llama):
    engine = Engine(TorchSession(tiny_llama, torch.device("cpu")),
                    implementation(build_method("identity", {})))
    engine.start()
    yield engine
    engine.stop()


@pytest.fixture(scope="module")
def client(engine):
    """A test client of an app that asks for KEY."""
    from fastapi.testclient import TestClient

    app = create_app(engine, "tiny:llama", "identity", engine.session.loaded.max_context,
                     api_key=KEY)
    with TestClient(app) as client:
        yield client


def _is_openai_401(reply) -> bool:
    error = reply.json()["error"]
    return (reply.status_code == 401 and set(error) == {"message", "type", "param", "code"}
            and error["type"] == "invalid_request_error" and error["code"] == "invalid_api_key"
            and reply.headers["www-authenticate"] == "Bearer")


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"},
                                     {"Authorization": f"Basic {KEY}"},
                                     {"Authorization": f"Bearer {KEY}x"},
                                     {"Authorization": "Bearer"}],
                         ids=["missing", "wrong", "not-bearer", "longer", "empty"])
def test_every_route_but_health_refuses_a_missing_or_wrong_key(client, headers):
    for method, path in (("GET", "/v1/models"), ("GET", "/v1/models/tiny:llama"),
                         ("GET", "/metrics"), ("POST", "/v1/completions"),
                         ("POST", "/v1/chat/completions")):
        reply = client.request(method, path, headers=headers, json=COMPLETION)
        assert _is_openai_401(reply), (path, reply.status_code, reply.text)
    assert KEY not in json.dumps(reply.json())  # the answer never tells the key


def test_the_right_key_is_served_and_health_needs_none(client):
    right = {"Authorization": f"Bearer {KEY}"}
    assert client.get("/v1/models", headers=right).json()["data"][0]["id"] == "tiny:llama"
    assert client.get("/metrics", headers=right).status_code == 200
    reply = client.post("/v1/completions", headers=right, json=COMPLETION)
    assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 2
    lower = {"authorization": f"bearer {KEY}"}  # the scheme's case does not matter (RFC 7235)
    assert client.get("/v1/models", headers=lower).status_code == 200
    assert client.get("/health").json()["status"] == "ok"


def test_a_server_without_a_key_asks_for_none(engine):
    from fastapi.testclient import TestClient

    app = create_app(engine, "tiny:llama", "identity", engine.session.loaded.max_context)
    with TestClient(app) as open_client:
        assert open_client.get("/v1/models").status_code == 200


# ---- which binds need a key ------------------------------------------------------------------


def test_a_remote_bind_needs_a_key_or_no_auth():
    with pytest.raises(ValueError, match=r"--api-key KEY, or the environment variable "
                                         r"KVBENCH_API_KEY.*or add --no-auth"):
        check_access("0.0.0.0", True, None, False)
    check_access("0.0.0.0", True, KEY, False)
    check_access("0.0.0.0", True, None, True)
    check_access("127.0.0.1", False, None, False)  # loopback: a key is optional
    check_access("::1", False, KEY, False)
    with pytest.raises(ValueError, match="not a loopback address; add --allow-remote"):
        check_access("10.0.0.5", False, KEY, False)
    with pytest.raises(ValueError, match="contradict"):
        check_access("0.0.0.0", True, KEY, True)
    with pytest.raises(ValueError, match="is empty"):
        check_access("127.0.0.1", False, "  ", False)


@pytest.fixture
def served(monkeypatch):
    """What `kvbench serve` hands the server (nothing is loaded or bound)."""
    import kvbench.serve.server as server

    seen = {}
    monkeypatch.setattr(server, "serve", lambda *args, **kwargs: seen.update(kwargs, args=args))
    monkeypatch.delenv("KVBENCH_API_KEY", raising=False)
    return seen


def test_serve_refuses_a_remote_bind_without_a_key_before_loading(served):
    result = invoke("serve", "--host", "0.0.0.0", "--allow-remote")
    assert result.exit_code == 2 and "lets other machines reach the server" in result.output
    assert not served


def test_serve_binds_remotely_with_no_auth_or_a_key(served, monkeypatch):
    result = invoke("serve", "--host", "0.0.0.0", "--allow-remote", "--no-auth")
    assert result.exit_code == 0, result.output
    assert served["api_key"] is None
    result = invoke("serve", "--host", "0.0.0.0", "--allow-remote", "--api-key", KEY)
    assert result.exit_code == 0, result.output
    assert served["api_key"] == KEY
    monkeypatch.setenv("KVBENCH_API_KEY", "from-env")
    served.clear()
    result = invoke("serve", "--host", "0.0.0.0", "--allow-remote")
    assert result.exit_code == 0, result.output
    assert served["api_key"] == "from-env"
    assert KEY not in result.output and "from-env" not in result.output


def test_serve_defaults_to_the_auto_device_and_dtype(served):
    result = invoke("serve", "--model", "tiny:llama")
    assert result.exit_code == 0, result.output
    device = served["args"][5]  # serve(model, method, params, host, port, device, ...)
    assert (device, served["model_dtype"], served["api_key"]) == ("auto", "auto", None)


# ---- the client side: the stress benchmark sends the key -------------------------------------


def test_a_server_target_reads_its_key_from_the_environment_only(monkeypatch):
    monkeypatch.delenv("KVBENCH_API_KEY", raising=False)
    assert parse_server({"url": "http://127.0.0.1:8000"}).auth_headers() == {}
    monkeypatch.setenv("KVBENCH_API_KEY", KEY)
    assert parse_server("kvbench").auth_headers() == {"Authorization": f"Bearer {KEY}"}
    monkeypatch.setenv("OTHER_KEY", "other")
    named = parse_server({"url": "http://127.0.0.1:8000", "api_key_env": "OTHER_KEY"})
    assert named.auth_headers() == {"Authorization": "Bearer other"}
    for server, words in (({"api_key": KEY}, "api_key is not taken"),
                          ({"api_key_env": "NOT_SET_HERE"}, "NOT_SET_HERE is not set"),
                          ({"api_key_env": "a b"}, "must name an environment variable")):
        with pytest.raises(SettingError, match=words):
            StressParams(server={"url": "http://127.0.0.1:8000", **server})


def test_the_stress_benchmark_sends_the_key_and_records_none_of_it(engine, monkeypatch):
    app = create_app(engine, "tiny:llama", "identity", engine.session.loaded.max_context,
                     api_key=KEY)
    monkeypatch.setenv("STRESS_TEST_KEY", KEY)
    ctx = cpu_context("tiny:llama")
    with AppInThread(app) as server:
        params = StressParams(users=2, requests_per_user=1, prompts=2, prompt_tokens=8,
                              max_tokens=3,
                              server={"url": server.url, "api_key_env": "STRESS_TEST_KEY"})
        try:
            out = measurement(Stress).run(params, implementation(Identity()), ctx)
        finally:
            ctx.memo.close()
        body = {"prompt": "The cache", "max_tokens": 2, "temperature": 0, "stream": True}
        without = load_generator.run_level(server.url, "/v1/completions", [Prompt(0, "a", [5])],
                                           1, 1, lambda prompt: body, 30, 60)
    assert out.metrics["errors"].value == 0 and "warmup_error" not in out.info
    assert out.metrics["requests"].value == 2
    assert KEY not in json.dumps([out.info, out.comparable, params.server], default=str)
    assert without.records[0].status == 401 and "invalid_api_key" in without.records[0].error
