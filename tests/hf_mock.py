"""A local stand-in for the Hugging Face Hub, for the pull and `FROM hf.co/...` tests (HF_ENDPOINT=mock.url)."""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

LFS_SUFFIXES = (".gguf", ".safetensors", ".bin")


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class HFMock:
    """Just enough of the Hugging Face Hub for huggingface_hub's `model_info` and `hf_hub_download`:
    `/api/models/{repo}` listing siblings (weights with their LFS sha256; small files, as on the Hub, without
    LFS), and `/{repo}/resolve/{rev}/{file}` answering HEAD and GET with ETag (the sha256 for LFS files, the
    git blob sha1 otherwise), X-Repo-Commit and Content-Length. ``requests`` records (method, path), ``authorization`` the token sent."""

    COMMIT = "0123456789abcdef0123456789abcdef01234567"

    def __init__(self, repos: dict[str, dict[str, bytes]]):
        self.repos = repos
        self.requests: list[tuple[str, str]] = []
        self.authorization: list[str | None] = []  # the Authorization header of each request
        mock = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, code: int, body: bytes, headers: dict[str, str], head: bool) -> None:
                self.send_response(code)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def _handle(self, head: bool) -> None:
                mock.requests.append((self.command, self.path))
                mock.authorization.append(self.headers.get("Authorization"))
                parts = self.path.split("?")[0].strip("/").split("/")
                if parts[:2] == ["api", "models"]:
                    repo = "/".join(parts[2:4])
                    if repo not in mock.repos:
                        return self._send(404, b'{"error":"Repository not found"}',
                                          {"Content-Type": "application/json", "X-Error-Code": "RepoNotFound"}, head)
                    siblings = []
                    for f, b in mock.repos[repo].items():
                        entry: dict[str, Any] = {"rfilename": f, "size": len(b), "blobId": git_blob_sha1(b)}
                        if f.endswith(LFS_SUFFIXES):
                            entry["lfs"] = {"sha256": hashlib.sha256(b).hexdigest(), "size": len(b), "pointerSize": 130}
                        siblings.append(entry)
                    body = json.dumps({"id": repo, "modelId": repo, "sha": mock.COMMIT, "private": False,
                                       "siblings": siblings, "tags": []}).encode()
                    return self._send(200, body, {"Content-Type": "application/json"}, head)
                if len(parts) >= 5 and parts[2] == "resolve":
                    name = "/".join(parts[4:])
                    data = mock.repos.get("/".join(parts[:2]), {}).get(name)
                    if data is None:
                        return self._send(404, b"Entry not found", {"X-Error-Code": "EntryNotFound"}, head)
                    headers = {"X-Repo-Commit": mock.COMMIT, "Content-Type": "application/octet-stream"}
                    if name.endswith(LFS_SUFFIXES):
                        sha = hashlib.sha256(data).hexdigest()
                        headers.update({"ETag": f'"{sha}"', "X-Linked-Etag": f'"{sha}"', "X-Linked-Size": str(len(data))})
                    else:
                        headers["ETag"] = f'"{git_blob_sha1(data)}"'
                    return self._send(200, data, headers, head)
                return self._send(404, b"not found", {}, head)

            def do_GET(self) -> None:
                self._handle(False)

            def do_HEAD(self) -> None:
                self._handle(True)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def downloads(self) -> list[str]:
        """The files fetched (GET on resolve), as `repo/file`."""
        out = []
        for method, path in self.requests:
            parts = path.split("?")[0].strip("/").split("/")
            if method == "GET" and len(parts) >= 5 and parts[2] == "resolve":
                out.append("/".join(parts[:2]) + "/" + "/".join(parts[4:]))
        return out

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
