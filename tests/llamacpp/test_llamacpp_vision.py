"""Images through the llamacpp engine, against a real llama-server: a tiny random Qwen2-VL written by llama.cpp's own
converter (text GGUF, and its projector with ``--mmproj``), created through the ``ollama`` client with the projector as
a second file, answers one image through /api/generate ``images``, /api/chat, OpenAI ``image_url`` parts and an
Anthropic image block with the greedy text llama-server itself gives for the same prompt and image; the image reaches
the model (another image, another answer); the same weights without a projector refuse images with Ollama's error."""

from __future__ import annotations

import base64
import io
import subprocess
import time
from pathlib import Path

import anthropic
import httpx
import ollama
import openai
import pytest

from engine.contract.llamacpp_launch import find_llama_server
from server.settings import Settings
from tests.llamacpp_models import converter, write_vision_model
from tests.realmodels import smollm2_gguf
from tests.server_thread import ServerThread, free_port

pytestmark = pytest.mark.skipif(find_llama_server() is None or converter() is None,
                                reason="llama-server not installed (scripts/install_llama_server.sh)")

QUESTION = "What is in this picture?"
N = 10


def png(color: str) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (56, 56), color).save(out, "PNG")
    return out.getvalue()


RED, BLUE = png("red"), png("blue")


@pytest.fixture(scope="module")
def vision(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    smollm2 = smollm2_gguf()
    if smollm2 is None:
        pytest.skip("SmolLM2 GGUF package not installed (its tokenizer is the tiny model's)")
    return write_vision_model(tmp_path_factory.mktemp("vision"), smollm2)


@pytest.fixture(scope="module")
def srv(vision: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory):
    from blobs import BlobStore

    text, projector = vision
    store = BlobStore(tmp_path_factory.mktemp("store"))
    with ServerThread(store, Settings(num_thread=1, num_parallel=1)) as s:
        client = ollama.Client(host=s.url, timeout=300)
        files = {"qwen2vl.gguf": client.create_blob(text), "mmproj.gguf": client.create_blob(projector)}
        client.create(model="seeing", files=files, parameters={"temperature": 0})
        client.create(model="blind", files={"qwen2vl.gguf": files["qwen2vl.gguf"]}, parameters={"temperature": 0})
        yield s


@pytest.fixture(scope="module")
def direct(vision: tuple[Path, Path]):
    """llama-server started directly on the same two files: ``answer(prompt_with_[img-0], image)``."""
    text, projector = vision
    port = free_port()
    proc = subprocess.Popen([find_llama_server(), "-m", str(text), "--mmproj", str(projector), "--port", str(port),
                             "-c", "1024", "-np", "1", "-t", "1", "--no-webui"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120)
    deadline = time.monotonic() + 120
    while True:
        try:
            if http.get("/health").status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline and proc.poll() is None, "llama-server did not start"
        time.sleep(0.1)
    marker = http.get("/props").json()["media_marker"]

    def answer(prompt: str, image: bytes) -> str:
        body = {"prompt": {"prompt_string": prompt.replace("[img-0]", marker),
                           "multimodal_data": [base64.b64encode(image).decode()]},
                "n_predict": N, "temperature": 0}
        return http.post("/completion", json=body).json()["content"]

    yield answer
    http.close()
    proc.terminate()
    proc.wait(10)


def b64(image: bytes) -> str:
    return base64.b64encode(image).decode()


def test_a_projector_model_shows_vision_and_runs_on_llama_cpp(srv: ServerThread) -> None:
    shown = httpx.post(f"{srv.url}/api/show", json={"model": "seeing"}).json()
    assert "vision" in shown["capabilities"] and shown["projector_info"]["general.type"] == "mmproj"
    assert shown["engine"]["backend"] == "llamacpp"
    assert "vision" not in httpx.post(f"{srv.url}/api/show", json={"model": "blind"}).json()["capabilities"]


def test_an_image_through_api_generate_is_answered_as_llama_server_answers_it(srv: ServerThread, direct) -> None:
    client = ollama.Client(host=srv.url, timeout=120)
    raw = client.generate(model="seeing", prompt="Look: [img-0] and say", raw=True, images=[RED],
                          options={"num_predict": N})
    assert raw.response == direct("Look: [img-0] and say", RED) and raw.eval_count == N
    assert raw.prompt_eval_count > len("Look: and say".split())  # the image's tokens are counted
    # a raw prompt without a tag: the image goes first, as Ollama prefixes a message's images
    untagged = client.generate(model="seeing", prompt=" and say", raw=True, images=[BLUE], options={"num_predict": N})
    assert untagged.response == direct("[img-0] and say", BLUE)
    assert untagged.response != client.generate(model="seeing", prompt=" and say", raw=True, images=[RED],
                                                options={"num_predict": N}).response
    # with the model's template: the image is tagged into the user turn
    templated = client.generate(model="seeing", prompt=QUESTION, images=[RED], options={"num_predict": N})
    rendered = httpx.post(f"{srv.url}/api/generate", json={"model": "seeing", "prompt": QUESTION, "images": [b64(RED)],
                                                          "_debug_render_only": True}).json()["_debug_info"]
    assert rendered["image_count"] == 1 and "[img-0]" in rendered["rendered_template"]
    assert templated.response == direct(rendered["rendered_template"], RED)


def test_one_image_through_every_chat_api_gets_llama_servers_answer(srv: ServerThread, direct) -> None:
    rendered = httpx.post(f"{srv.url}/api/chat", json={
        "model": "seeing", "messages": [{"role": "user", "content": QUESTION, "images": [b64(RED)]}],
        "_debug_render_only": True}).json()["_debug_info"]["rendered_template"]
    expected = direct(rendered, RED)

    chat = ollama.Client(host=srv.url, timeout=120).chat(
        model="seeing", messages=[{"role": "user", "content": QUESTION, "images": [RED]}], options={"num_predict": N})
    assert chat.message.content == expected

    oai = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="x").chat.completions.create(
        model="seeing", max_tokens=N, temperature=0, messages=[{"role": "user", "content": [
            {"type": "text", "text": QUESTION},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64(RED)}"}}]}])
    assert oai.choices[0].message.content == expected

    msg = anthropic.Anthropic(base_url=srv.url, api_key="x").messages.create(
        model="seeing", max_tokens=N, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(RED)}},
            {"type": "text", "text": QUESTION}]}])
    assert msg.content[0].text == expected


def test_a_model_without_a_projector_refuses_images_as_ollama_does(srv: ServerThread) -> None:
    r = httpx.post(f"{srv.url}/api/chat", json={
        "model": "blind", "stream": False, "messages": [{"role": "user", "content": QUESTION, "images": [b64(RED)]}]})
    assert r.status_code == 400 and r.json() == {"error": '"blind" does not support vision'}
    r = httpx.post(f"{srv.url}/api/generate", json={"model": "blind", "prompt": "x", "images": [b64(RED)]})
    assert r.status_code == 400 and r.json() == {"error": '"blind" does not support vision'}
