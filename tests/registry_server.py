"""A real OCI registry for the pull and push tests: Debian's ``docker-registry`` (distribution 2.8) started on a free
loopback port with a storage folder of its own; and ``CountingProxy``, a small HTTP proxy in front of it that counts
the blob bytes it serves, can cut a response after some bytes, slow them, and can ask for a bearer token first as
Ollama's registry does."""

from __future__ import annotations

import base64
import hashlib
import http.client
import http.server
import json
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest

from benchmarks.serving import free_port

REGISTRY = shutil.which("docker-registry")


def json_reply(handler: http.server.BaseHTTPRequestHandler, status: int, body: bytes,
               headers: dict[str, str] | None = None) -> None:
    """Answer a test server's request with a JSON body (none for a HEAD)."""
    handler.send_response(status)
    for k, v in (headers or {}).items():
        handler.send_header(k, v)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    if handler.command != "HEAD":
        handler.wfile.write(body)


class TokenIssuer:
    """Distribution's token authentication, the issuing side: an RSA key and its self-signed certificate made with
    ``openssl`` (the registry trusts the certificate's key, named by libtrust's key id), and a ``/token`` endpoint
    that grants what the ``scope`` asks, to anyone or, with ``user`` set, to that user's basic credentials only."""

    SERVICE = "tandem-test-registry"
    ISSUER = "tandem-test-issuer"

    def __init__(self, folder: Path, user: tuple[str, str] | None = None):
        folder.mkdir(parents=True, exist_ok=True)
        self.key, self.cert = folder / "token.key", folder / "token.crt"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(self.key),
                        "-out", str(self.cert), "-days", "2", "-subj", "/CN=tandem-test-issuer"], check=True,
                       capture_output=True)
        pub = subprocess.run(["openssl", "x509", "-in", str(self.cert), "-pubkey", "-noout"], check=True,
                             capture_output=True).stdout
        der = subprocess.run(["openssl", "pkey", "-pubin", "-outform", "DER"], input=pub, check=True,
                             capture_output=True).stdout
        b32 = base64.b32encode(hashlib.sha256(der).digest()[:30]).decode().rstrip("=")
        self.kid = ":".join(b32[i:i + 4] for i in range(0, len(b32), 4))
        self.user = user
        self.issued = 0
        issuer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
                if issuer.user is not None:
                    expected = "Basic " + base64.b64encode(":".join(issuer.user).encode()).decode()
                    if self.headers.get("Authorization") != expected:
                        return json_reply(self, 401, b"")
                body = json.dumps({"token": issuer.token(query.get("scope", []))}).encode()
                issuer.issued += 1
                json_reply(self, 200, body)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.realm = f"http://127.0.0.1:{self.server.server_address[1]}/token"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def token(self, scopes: list[str]) -> str:
        access = []
        for scope in " ".join(scopes).split():
            kind, name, actions = scope.split(":", 2) if scope.count(":") >= 2 else (scope, "", "")
            access.append({"type": kind, "name": name, "actions": [a for a in actions.split(",") if a]})
        now = int(time.time())
        header = {"typ": "JWT", "alg": "RS256", "kid": self.kid}
        claims = {"iss": self.ISSUER, "sub": "tester", "aud": self.SERVICE, "exp": now + 300, "nbf": now - 10,
                  "iat": now, "jti": os.urandom(8).hex(), "access": access}
        part = lambda obj: base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()  # noqa: E731
        signing_input = f"{part(header)}.{part(claims)}"
        signature = subprocess.run(["openssl", "dgst", "-sha256", "-sign", str(self.key)], input=signing_input.encode(),
                                   check=True, capture_output=True).stdout
        return signing_input + "." + base64.urlsafe_b64encode(signature).rstrip(b"=").decode()

    def auth_config(self) -> str:
        return (f"auth:\n  token:\n    realm: {self.realm}\n    service: {self.SERVICE}\n"
                f"    issuer: {self.ISSUER}\n    rootcertbundle: {self.cert}\n")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Registry:
    def __init__(self, folder: Path, port: int | None = None, issuer: TokenIssuer | None = None):
        folder.mkdir(parents=True, exist_ok=True)
        self.storage = folder / "storage"
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = folder / "config.yml"
        config.write_text(f"""version: 0.1
log:
  level: error
storage:
  filesystem:
    rootdirectory: {self.storage}
  delete:
    enabled: true
http:
  addr: 127.0.0.1:{self.port}
""" + (issuer.auth_config() if issuer else ""))
        self._log = open(folder / "registry.log", "wb")
        self.proc = subprocess.Popen([REGISTRY, "serve", str(config)], stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(self.url + "/v2/", timeout=2) as r:
                    if r.status == 200:
                        break
            except urllib.error.HTTPError as e:
                if e.code == 401:  # up, and asking for a token
                    break
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("docker-registry did not start: " + (folder / "registry.log").read_text()[-2000:])
            time.sleep(0.1)

    def blob_file(self, digest: str) -> Path:
        hexd = digest.split(":", 1)[1]
        return self.storage / "docker/registry/v2/blobs/sha256" / hexd[:2] / hexd / "data"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._log.close()


def registry_fixture(tmp_path: Path) -> Iterator[Registry]:
    """A test's own registry (``registry``, tests/conftest.py); skipped where docker-registry is not installed."""
    if REGISTRY is None:
        pytest.skip("docker-registry is not installed (scripts/install.sh installs Debian's package where apt is)")
    reg = Registry(tmp_path / "registry")
    try:
        yield reg
    finally:
        reg.stop()


class CountingProxy:
    """Forwards every request to ``upstream``; counts the bytes of blob bodies served; ``cut_after`` ends the
    connection of a blob response after that many bytes of it (once each time it is set); ``delay`` sleeps per
    64 KiB; with ``token`` set, answers a request without ``Authorization: Bearer <token>`` with 401 and a
    challenge whose realm (this proxy's /token) issues the token, or refuses it when ``issue`` is False."""

    def __init__(self, upstream: str):
        self.upstream = upstream.split("://", 1)[1]
        self.blob_bytes = 0
        self.cut_after: int | None = None
        self.delay = 0.0
        self.token: str | None = None
        self.issue = True
        self.tokens_issued = 0
        self.requests: list[tuple[str, str]] = []
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _any(self) -> None:
                proxy.requests.append((self.command, self.path))
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                if self.path.startswith("/token"):
                    if not proxy.issue:
                        return json_reply(self, 401, b'{"errors":[{"code":"UNAUTHORIZED","message":"no token for you"}]}')
                    proxy.tokens_issued += 1
                    return json_reply(self, 200, b'{"token":"%s"}' % proxy.token.encode())
                if proxy.token and self.headers.get("Authorization") != f"Bearer {proxy.token}":
                    realm = f"http://127.0.0.1:{proxy.port}/token"
                    return json_reply(self, 401, b'{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}',
                                       {"WWW-Authenticate": f'Bearer realm="{realm}",service="test",'
                                                            f'scope="repository:x:pull"'})
                conn = http.client.HTTPConnection(proxy.upstream, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "authorization")}
                conn.request(self.command, self.path, body=body, headers=headers)
                r = conn.getresponse()
                blob = "/blobs/sha256:" in self.path and self.command == "GET"
                self.send_response(r.status)
                for k, v in r.getheaders():
                    if k.lower() == "location" and v.startswith(f"http://{proxy.upstream}"):
                        v = f"http://127.0.0.1:{proxy.port}" + v[len(f"http://{proxy.upstream}"):]
                    if k.lower() not in ("transfer-encoding", "connection"):
                        self.send_header(k, v)
                self.end_headers()
                cut, sent = (proxy.cut_after if blob else None), 0
                while chunk := r.read(1 << 16):
                    if cut is not None and sent + len(chunk) > cut:
                        chunk = chunk[:cut - sent]
                    self.wfile.write(chunk)
                    sent += len(chunk)
                    if blob:
                        proxy.blob_bytes += len(chunk)
                        if proxy.delay:
                            time.sleep(proxy.delay)
                    if cut is not None and sent >= cut:
                        proxy.cut_after = None
                        self.close_connection = True
                        self.wfile.flush()
                        self.connection.shutdown(socket.SHUT_RDWR)
                        break
                conn.close()

            do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = _any

        class Server(http.server.ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address) -> None:
                pass  # a client closing its kept-alive connection is no news

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
