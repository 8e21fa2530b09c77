"""From a request and a stored model to the prompt text the engine tokenizes, as Ollama builds it.

Which template a model uses, in Ollama's order of preference:
1. its TEMPLATE layer (Go template syntax), or the request's `template` on /api/generate;
2. else the GGUF's own `tokenizer.chat_template` (Jinja, sandboxed, rendered like transformers does);
3. else an Ollama library template chosen from the vocabulary/architecture (`fallback_template_for`).

Templates and GGUF facts are read once per model file and cached on the app (`PromptCache`), so a
request only renders. Rendering never touches torch.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

from blobs.model import StoredModel
from engine.contract.capabilities import embedding_normalizes, embedding_pooling, has_mtp_head
from engine.contract.gguf import GGUFFile
from modelfile.gotemplate import GoTemplate, TemplateError, parse_template
from server.text.harmony import harmony_function_names, is_gpt_oss, uses_harmony
from server.text.render import (
    InsertNotSupported,
    JinjaChatTemplate,
    Message,
    RenderedChat,
    Think,
    Tool,
    chat_window,
    fallback_template_for,
    render_chat_window,
    render_generate,
    window_images,
    supports_insert,
)
from engine.contract.special_tokens import FimTokens, find_fim_tokens
from server.text.template_errata import corrected_chat_template
from server.text.thinking import infer_thinking_tags, jinja_thinking_tags
from server.text.tool_calls import ToolCallFormat, format_for_go_template, format_for_jinja_template

__all__ = ["ModelPrompting", "PromptCache", "PromptError", "Message", "RenderedChat", "Think", "Tool", "InsertNotSupported"]


class PromptError(Exception):
    """A prompt that cannot be built; ``status`` is the HTTP status."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class GGUFPromptFacts:
    """What prompt building needs from the GGUF header."""

    architecture: str
    chat_template: str | None
    bos_token: str
    eos_token: str
    add_bos: bool
    token_strings: tuple[str, ...]
    has_mtp_head: bool  # NextN tensors: the target can draft for itself
    fim: FimTokens | None = None  # fill-in-the-middle markers of the vocabulary
    # An embedding model (the GGUF declares a pooling type): its pooling, and whether its own pipeline
    # L2-normalises (the legacy /api/embeddings returns raw vectors otherwise). None: a completion model.
    pooling: str | None = None
    normalize_embeddings: bool = True


def read_prompt_facts(path: Path) -> GGUFPromptFacts:
    with GGUFFile(path) as f:
        md = f.metadata
        tokens = md.get("tokenizer.ggml.tokens")
        tokens = tuple(str(t) for t in tokens) if tokens is not None else ()

        def token(key: str) -> str:
            i = md.get(key)
            if i is None:
                return ""
            i = int(i)
            return tokens[i] if 0 <= i < len(tokens) else ""

        model_kind = md.get("tokenizer.ggml.model", "")
        add_bos = md.get("tokenizer.ggml.add_bos_token")
        if add_bos is None:  # llama.cpp's default: SentencePiece vocabularies add BOS, BPE ones do not
            add_bos = model_kind == "llama"
        chat = md.get("tokenizer.chat_template")
        return GGUFPromptFacts(
            architecture=str(md.get("general.architecture", "")),
            chat_template=chat if isinstance(chat, str) and chat.strip() else None,
            bos_token=token("tokenizer.ggml.bos_token_id"),
            eos_token=token("tokenizer.ggml.eos_token_id"),
            add_bos=bool(add_bos),
            token_strings=tokens,
            has_mtp_head=has_mtp_head(f.tensors),
            fim=find_fim_tokens(tokens, md.get("tokenizer.ggml.token_type"), md),
            pooling=embedding_pooling(md),
            normalize_embeddings=embedding_normalizes(md),
        )


class ModelPrompting:
    """A model's compiled template and how to render generate/chat prompts with it."""

    def __init__(self, model: StoredModel):
        self.model = model
        assert model.model_path is not None
        self.facts = read_prompt_facts(model.model_path)
        self.go: GoTemplate | None = None
        self.jinja: JinjaChatTemplate | None = None
        # The template text /api/show reports (Ollama's selectedModelTemplate): the one in use.
        self.template_text = ""
        if model.template is not None:
            self.kind = "template"
            self.go = _parse(model.template)
            self.template_text = model.template
        elif self.facts.chat_template is not None:
            self.kind = "chat_template"
            source = corrected_chat_template(self.facts.chat_template)
            try:
                self.jinja = JinjaChatTemplate(source)
                self.template_text = source
            except TemplateError:
                self.jinja = None
        if self.go is None and self.jinja is None:
            self.kind = "fallback"
            self.template_text = fallback_template_for(self.facts.architecture, self.facts.token_strings)
            self.go = _parse(self.template_text)
        # What the template teaches the model, read once: how it writes tool calls (None: the template
        # has no tools) and the tags around its reasoning ("" when it has none).
        self.tool_format: ToolCallFormat | None = None
        if self.go is not None:
            if self.go.has_field("tools"):
                self.tool_format = format_for_go_template(self.go)
            self.thinking_tags = infer_thinking_tags(self.go)
        else:
            assert self.jinja is not None
            source = self.jinja.source
            if "tools" in source or "tool_call" in source:  # Ollama's chat-template check
                self.tool_format = format_for_jinja_template(source)
            self.thinking_tags = jinja_thinking_tags(source)
        # gpt-oss (Ollama: the model family; tandem also reads the GGUF's architecture) always thinks; with
        # a template that writes harmony's <|start|>/<|end|>, its output is parsed as harmony.
        families = (str(model.config.get("model_family") or ""), self.facts.architecture)
        self.gpt_oss = is_gpt_oss(*families)
        self.harmony = uses_harmony(self.template_text, *families)

    # -- capabilities ---------------------------------------------------------------------------
    @property
    def template_inserts(self) -> bool:
        """The model's Go template renders .Suffix (Ollama's only source of the insert capability)."""
        return self.go is not None and supports_insert(self.go)

    @property
    def supports_insert(self) -> bool:
        """`suffix` works: the template handles it, or the vocabulary has FIM markers (tandem's
        addition, so a GGUF whose Jinja template knows nothing of FIM can still fill in the middle)."""
        return self.template_inserts or self.facts.fim is not None

    @property
    def is_embedding(self) -> bool:
        """Ollama's rule: a GGUF with a pooling type embeds and does not complete."""
        return self.facts.pooling is not None

    @property
    def supports_tools(self) -> bool:
        return self.tool_format is not None

    @property
    def supports_vision(self) -> bool:
        """Ollama's rule: a model with a projector layer takes images."""
        return self.model.projector_path is not None

    @property
    def supports_thinking(self) -> bool:
        return all(self.thinking_tags) or self.gpt_oss

    def capabilities(self) -> list[str]:
        """Ollama's capability names this model has, in Ollama's order: ``embedding`` alone for a model
        whose GGUF has a pooling type (it does not complete), else ``completion`` and what the template
        and vocabulary support."""
        if self.is_embedding:
            return ["embedding"]
        caps = ["completion"]
        if self.supports_tools:
            caps.append("tools")
        if self.supports_insert:
            caps.append("insert")
        if self.supports_vision:
            caps.append("vision")
        if self.supports_thinking:
            caps.append("thinking")
        return caps

    # -- rendering ------------------------------------------------------------------------------
    def generate_prompt(self, *, prompt: str, system: str | None, suffix: str | None, template: str | None,
                        history: Sequence[Message] = (), think: Think = None,
                        images: Sequence[bytes] = ()) -> str:
        """/api/generate (not raw): the request's template overrides the model's; ``images`` are the prompt's."""
        think = self._template_think(think)
        go = _parse(template) if template else self.go
        try:
            if suffix and not (go is not None and supports_insert(go)):
                # No template that renders .Suffix (Ollama's way wins when there is one): the
                # vocabulary's FIM markers, laid out as llama.cpp's infill, with no chat template.
                if self.facts.fim is None:
                    raise InsertNotSupported("template does not support insert")
                return self.facts.fim.render(prompt, suffix)
            if go is not None:
                return render_generate(go, prompt=prompt, system=system, suffix=suffix or None, history=history,
                                       think=think, images=images)
            messages = ([Message("system", system)] if system else []) + list(history) + [
                Message("user", prompt, images=list(images) or None)]
            return self._jinja(chat_window(messages, 0), (), think)
        except InsertNotSupported:
            raise
        except TemplateError as e:
            raise PromptError(str(e), 500) from None

    def chat_prompt(self, messages: Sequence[Message], tools: Sequence[Tool] = (),
                    fits: Callable[[str], bool] | None = None, think: Think = None) -> str:
        """/api/chat: ``messages`` already include the model's SYSTEM and MESSAGE layers. With ``fits``
        the oldest messages are dropped until the prompt fits (system messages and the last kept)."""
        return self.chat_render(messages, tools, fits, think).text

    def chat_render(self, messages: Sequence[Message], tools: Sequence[Tool] = (),
                    fits: Callable[[str], bool] | None = None, think: Think = None) -> RenderedChat:
        """``chat_prompt`` with the images of the messages kept, in the order of their ``[img-N]`` tags."""
        think = self._template_think(think)
        if self.harmony and tools:  # Ollama renames tools for harmony into identifiers the model knows
            names = harmony_function_names(t.name for t in tools)
            tools = [replace(t, name=names[t.name]) for t in tools]
        try:
            if self.go is not None:
                full = render_chat_window(self.go, messages, tools, think)
                if fits is None or fits(full.text):
                    return full
                return render_chat_window(self.go, messages, tools, think, fits=fits)
            full_text = self._jinja(chat_window(messages, 0), tools, think)
            if fits is None or fits(full_text) or len(messages) <= 1:
                return RenderedChat(full_text, window_images(messages, 0))
            # Same rule as Ollama's chatPrompt: drop from the oldest; keep system messages and the last.
            start = len(messages) - 1
            best = self._jinja(chat_window(messages, start), tools, think)
            for i in range(len(messages) - 2, 0, -1):
                text = self._jinja(chat_window(messages, i), tools, think)
                if not fits(text):
                    break
                best, start = text, i
            return RenderedChat(best, window_images(messages, start))
        except TemplateError as e:
            raise PromptError(str(e), 500) from None

    def _template_think(self, think: Think) -> Think:
        """Harmony's reasoning effort knows low/medium/high: Ollama sends "max" as "high" to gpt-oss."""
        return "high" if self.harmony and think == "max" else think

    def _jinja(self, messages: Sequence[Message], tools: Sequence[Tool], think: Think = None) -> str:
        assert self.jinja is not None
        return self.jinja.render(messages, add_generation_prompt=True, bos_token=self.facts.bos_token,
                                 eos_token=self.facts.eos_token, tools=list(tools) or None, **_jinja_think(think))

    def add_bos_for(self, prompt: str) -> bool | None:
        """Whether the engine should add BOS: not when the template already wrote it (Jinja templates
        usually start with ``{{ bos_token }}``); otherwise the tokenizer's own setting."""
        bos = self.facts.bos_token
        if bos and prompt.startswith(bos):
            return False
        return None


def _jinja_think(think: Think) -> dict[str, object]:
    """The variables chat templates read for thinking, as llama.cpp sets them: `enable_thinking`, and
    `reasoning_effort` for a level (gpt-oss-style templates read it). Unset: the template's default."""
    if think is None:
        return {}
    if isinstance(think, bool):
        return {"enable_thinking": think}
    return {"enable_thinking": True, "reasoning_effort": "high" if think == "max" else think}


def _parse(text: str) -> GoTemplate:
    try:
        return parse_template(text)
    except TemplateError as e:
        raise PromptError(f"template error: {e}", 400) from None


def chat_messages(model: StoredModel, request_messages: Sequence[Message]) -> list[Message]:
    """Ollama's ChatHandler: the model's MESSAGE layers, then the request's; the model's SYSTEM first
    unless the request begins with its own system message."""
    msgs = [Message.from_dict(m) for m in model.messages] + list(request_messages)
    if model.system and not (request_messages and request_messages[0].role == "system"):
        msgs.insert(0, Message("system", model.system))
    return msgs


class PromptCache:
    """ModelPrompting per model (keyed by manifest digest, so a re-created model is re-read)."""

    def __init__(self, max_entries: int = 32):
        self._lock = threading.Lock()
        self._entries: dict[str, ModelPrompting] = {}
        self._max = max_entries

    def get(self, model: StoredModel) -> ModelPrompting:
        with self._lock:
            hit = self._entries.get(model.digest)
        if hit is not None:
            return hit
        built = ModelPrompting(model)
        with self._lock:
            if len(self._entries) >= self._max:
                self._entries.pop(next(iter(self._entries)))
            self._entries[model.digest] = built
        return built

