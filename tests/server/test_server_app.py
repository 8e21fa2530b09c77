"""The app itself over real HTTP (server/routes/app.py): the root and version routes, gin's plain 404/405, the
loopback Host check, CORS, and the JSON body errors every route shares.
"""

from __future__ import annotations


import httpx
import pytest

from server.cli.client import Client
from server.routes.models import OLLAMA_API_VERSION
from tests.server_thread import ServerThread, make_store


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory):
    with ServerThread(make_store(tmp_path_factory.mktemp("app"))) as server:
        yield server


@pytest.fixture
def http(srv: ServerThread):
    with httpx.Client(base_url=srv.url, timeout=120) as c:
        yield c


def test_root_routes_and_version(http: httpx.Client) -> None:
    r = http.get("/")
    assert r.status_code == 200 and r.text == "Ollama is running" and r.headers["x-tandem-version"]
    assert http.head("/").status_code == 200
    r = http.get("/api/nope")
    assert r.status_code == 404 and r.text == "404 page not found"
    r = http.get("/api/generate")
    assert r.status_code == 405 and r.text == "405 method not allowed"
    version = http.get("/api/version").json()
    # The Ollama API version mirrored (clients gate features on it), tandem's own beside it.
    assert version["version"] == OLLAMA_API_VERSION and tuple(map(int, version["version"].split("."))) >= (0, 33, 0)
    assert version["tandem_version"] == http.get("/").headers["x-tandem-version"]
    with Client(str(http.base_url)) as client:  # the CLI (tandem bench's report) reads the server's own version
        assert client.version() == version["tandem_version"]


def test_host_check_and_cors(http: httpx.Client) -> None:
    assert http.get("/", headers={"Host": "evil.example"}).status_code == 403
    assert http.get("/", headers={"Host": "api.localhost:11434"}).status_code == 200
    assert http.get("/", headers={"Host": "10.1.2.3"}).status_code == 200
    r = http.get("/api/version", headers={"Origin": "http://localhost:3000"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://localhost:3000"
    assert http.get("/api/version", headers={"Origin": "https://evil.example"}).status_code == 403
    r = http.options("/api/chat", headers={"Origin": "vscode-webview://abc", "Access-Control-Request-Method": "POST"})
    assert r.status_code == 204 and "POST" in r.headers["access-control-allow-methods"]


@pytest.mark.parametrize("method,path", [("POST", "/api/generate"), ("POST", "/api/chat"), ("POST", "/api/show"),
                                         ("POST", "/api/create"), ("POST", "/api/copy"), ("DELETE", "/api/delete"),
                                         ("POST", "/api/pull")])
def test_body_errors(http: httpx.Client, method: str, path: str) -> None:
    r = http.request(method, path)
    assert (r.status_code, r.json()) == (400, {"error": "missing request body"})
    r = http.request(method, path, content=b'{"model": "tiny",}')
    assert r.status_code == 400
    assert r.json()["error"] == "invalid character '}' looking for beginning of object key string"
    r = http.request(method, path, content=b'{"model": "tiny"')
    assert (r.status_code, r.json()["error"]) == (400, "unexpected EOF")
    r = http.request(method, path, content=b"[1, 2]")
    assert r.status_code == 400 and r.json()["error"].startswith("json: cannot unmarshal array into Go value of type")
