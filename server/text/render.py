"""The prompt text for a request, built the way Ollama builds it.

- render_generate: /api/generate (routes.go GenerateHandler, then template.Execute).
- render_chat: /api/chat (server/prompt.go chatPrompt, then template.Execute), including legacy
  templates that know only .System/.Prompt/.Response.
- render_jinja_chat / JinjaChatTemplate: a GGUF's tokenizer.chat_template rendered as transformers'
  apply_chat_template does; used when the model has no TEMPLATE layer.
- FALLBACK_TEMPLATES / fallback_template_for: Ollama library templates for GGUFs with neither.

The templates see Go-shaped data (GoStruct fields named like Ollama's api types: .Role, .Content,
.ToolCalls, .Function.Name, ...), so real Ollama TEMPLATEs render byte-for-byte the same.
"""

from __future__ import annotations

import base64
import datetime
import json
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Union

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from modelfile.gotemplate import GoStruct, GoTemplate, StringerList, StringerMap, TemplateError

__all__ = [
    "DEFAULT_TEMPLATE",
    "FALLBACK_TEMPLATES",
    "InsertNotSupported",
    "JinjaChatTemplate",
    "Message",
    "Think",
    "Tool",
    "ToolCall",
    "fallback_template_for",
    "RenderedChat",
    "chat_window",
    "render_chat",
    "render_chat_window",
    "window_images",
    "render_generate",
    "render_jinja_chat",
    "supports_insert",
]

# The request's `think`: unset, a bool, or a level ("low" | "medium" | "high" | "max").
Think = Union[bool, str, None]
_THINK_LEVELS = frozenset({"low", "medium", "high", "max"})


class InsertNotSupported(TemplateError):
    """A suffix was given but the template has no .Suffix (Ollama: `"model" does not support insert`)."""


# ---------------------------------------------------------------------------------------------------
# Request types


@dataclass(frozen=True)
class ToolCall:
    """One function call made by the assistant (api.ToolCall)."""

    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)
    index: int = 0
    id: str = ""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ToolCall:
        fn = data.get("function") or {}
        args = fn.get("arguments") or {}
        if isinstance(args, str):  # OpenAI-style JSON-encoded arguments
            args = json.loads(args) if args.strip() else {}
        return cls(name=fn.get("name") or "", arguments=dict(args), index=int(fn.get("index") or 0), id=data.get("id") or "")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id} if self.id else {}
        out["function"] = {"index": self.index, "name": self.name, "arguments": dict(self.arguments)}
        return out


@dataclass(frozen=True)
class Tool:
    """A function the model may call (api.Tool with type "function")."""

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = field(default_factory=dict)
    type: str = "function"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Tool:
        fn = data.get("function") or {}
        return cls(
            name=fn.get("name") or "",
            description=fn.get("description") or "",
            parameters=fn.get("parameters") or {},
            type=data.get("type") or "function",
        )

    def to_dict(self) -> dict[str, Any]:
        """The request shape, which is also what HF chat templates expect in `tools`."""
        return {
            "type": self.type,
            "function": {"name": self.name, "description": self.description, "parameters": dict(self.parameters)},
        }


@dataclass(frozen=True)
class Message:
    """One chat message (api.Message).  `images` are raw bytes or base64 strings; only their count matters here."""

    role: str
    content: str = ""
    images: Sequence[bytes | str] | None = None
    tool_calls: Sequence[ToolCall] | None = None
    tool_name: str | None = None
    thinking: str | None = None
    tool_call_id: str | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Message:
        calls = data.get("tool_calls")
        return cls(
            role=str(data.get("role") or "").lower(),  # Ollama lower-cases roles when decoding
            content=data.get("content") or "",
            images=list(data["images"]) if data.get("images") else None,
            tool_calls=[ToolCall.from_dict(c) for c in calls] if calls else None,
            tool_name=data.get("tool_name") or None,
            thinking=data.get("thinking") or None,
            tool_call_id=data.get("tool_call_id") or None,
        )

    def to_dict(self) -> dict[str, Any]:
        """api.Message's JSON: role and content always, the rest only when set (omitempty)."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.thinking:
            out["thinking"] = self.thinking
        if self.images:
            out["images"] = [base64.b64encode(i).decode() if isinstance(i, bytes) else i for i in self.images]
        if self.tool_calls:
            out["tool_calls"] = [c.to_dict() for c in self.tool_calls]
        if self.tool_name:
            out["tool_name"] = self.tool_name
        if self.tool_call_id:
            out["tool_call_id"] = self.tool_call_id
        return out


# ---------------------------------------------------------------------------------------------------
# Go-shaped views of the request types, as Ollama hands them to templates


def _property_json(prop: Mapping[str, Any]) -> dict[str, Any]:
    """api.ToolProperty as encoding/json writes it: known fields in struct order, empty ones omitted."""
    out: dict[str, Any] = {}
    if prop.get("anyOf"):
        out["anyOf"] = [_property_json(p) for p in prop["anyOf"]]
    kind = prop.get("type")
    if kind:
        # PropertyType is []string; it marshals a single type as a plain string.
        out["type"] = kind[0] if isinstance(kind, (list, tuple)) and len(kind) == 1 else kind
    if prop.get("items") is not None:
        out["items"] = prop["items"]
    if prop.get("description"):
        out["description"] = prop["description"]
    if prop.get("enum"):
        out["enum"] = list(prop["enum"])
    if prop.get("properties"):
        out["properties"] = {k: _property_json(v) for k, v in prop["properties"].items()}
    return out


def _parameters_json(params: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"type": params.get("type") or ""}
    if params.get("$defs"):
        out["$defs"] = params["$defs"]
    if params.get("items") is not None:
        out["items"] = params["items"]
    if params.get("required"):
        out["required"] = list(params["required"])
    props = params.get("properties")
    out["properties"] = None if props is None else {k: _property_json(v) for k, v in props.items()}
    return out


def _function_json(tool: Tool) -> dict[str, Any]:
    out: dict[str, Any] = {"name": tool.name}
    if tool.description:
        out["description"] = tool.description
    out["parameters"] = _parameters_json(tool.parameters)
    return out


def _property_view(prop: Mapping[str, Any]) -> GoStruct:
    kind = prop.get("type") or []
    return GoStruct(
        {
            "AnyOf": [_property_view(p) for p in prop.get("anyOf") or ()],
            "Type": StringerList([kind] if isinstance(kind, str) else kind),
            "Items": prop.get("items"),
            "Description": prop.get("description") or "",
            "Enum": list(prop.get("enum") or ()),
            "Properties": {k: _property_view(v) for k, v in (prop.get("properties") or {}).items()},
        },
        json_value=_property_json(prop),
        type_name="api.ToolProperty",
    )


def _tool_view(tool: Tool) -> GoStruct:
    params = tool.parameters
    params_view = GoStruct(
        {
            "Type": params.get("type") or "",
            "Defs": params.get("$defs"),
            "Items": params.get("items"),
            "Required": list(params.get("required") or ()),
            "Properties": {k: _property_view(v) for k, v in (params.get("properties") or {}).items()},
        },
        json_value=_parameters_json(params),
        stringer=True,
        type_name="api.ToolFunctionParameters",
    )
    function = GoStruct(
        {"Name": tool.name, "Description": tool.description, "Parameters": params_view},
        json_value=_function_json(tool),
        stringer=True,
        type_name="api.ToolFunction",
    )
    return GoStruct(
        {"Type": tool.type, "Items": None, "Function": function},
        json_value={"type": tool.type, "function": _function_json(tool)},
        stringer=True,
        type_name="api.Tool",
    )


def _tool_call_view(call: ToolCall) -> GoStruct:
    function = GoStruct(
        {"Index": call.index, "Name": call.name, "Arguments": StringerMap(call.arguments)},
        json_value=call.to_dict()["function"],
        type_name="api.ToolCallFunction",
    )
    return GoStruct({"ID": call.id, "Function": function}, json_value=call.to_dict(), type_name="api.ToolCall")


def _message_view(msg: Message) -> GoStruct:
    return GoStruct(
        {
            "Role": msg.role,
            "Content": msg.content,
            "Thinking": msg.thinking or "",
            "Images": list(msg.images or ()),
            "ToolCalls": [_tool_call_view(c) for c in msg.tool_calls or ()],
            "ToolName": msg.tool_name or "",
            "ToolCallID": msg.tool_call_id or "",
        },
        json_value=msg.to_dict(),
        type_name="api.Message",
    )


def _think_values(think: Think) -> dict[str, Any]:
    """.Think / .ThinkLevel / .IsThinkSet from the request's think (api.ThinkValue Bool() and String())."""
    if think is None:
        return {"Think": False, "ThinkLevel": "", "IsThinkSet": False}
    if isinstance(think, bool):
        # ThinkValue.String() reports a bare `true` as the default level.
        return {"Think": think, "ThinkLevel": "medium" if think else "", "IsThinkSet": True}
    level = str(think)
    return {"Think": level in _THINK_LEVELS, "ThinkLevel": level, "IsThinkSet": True}


# ---------------------------------------------------------------------------------------------------
# Ollama's template.Execute


def supports_insert(template: GoTemplate) -> bool:
    """Ollama's "insert" capability: the template mentions .Suffix."""
    return template.has_field("suffix")


def _collate(messages: Sequence[Message]) -> tuple[str, list[Message]]:
    """All system contents joined, and the messages with consecutive same-role ones merged (not tool)."""
    system = "\n\n".join(m.content for m in messages if m.role == "system")
    collated: list[Message] = []
    for msg in messages:
        if collated and collated[-1].role == msg.role and msg.role != "tool":
            collated[-1] = replace(collated[-1], content=collated[-1].content + "\n\n" + msg.content)
        else:
            collated.append(msg)
    return system, collated


def _execute(
    template: GoTemplate,
    messages: Sequence[Message],
    tools: Sequence[Tool],
    think: Think,
    today: datetime.date | None,
) -> str:
    thinking = _think_values(think)
    system, collated = _collate(messages)
    if template.has_field("messages"):
        return template.execute(
            {
                "System": system,
                "Messages": [_message_view(m) for m in collated],
                "Tools": [_tool_view(t) for t in tools],
                "Response": "",
                **thinking,
            },
            today=today,
        )
    return _execute_legacy(template, collated, thinking, today)


def _execute_legacy(
    template: GoTemplate, messages: Sequence[Message], thinking: Mapping[str, Any], today: datetime.date | None
) -> str:
    """One render per (system, prompt, response) turn, concatenated; the last turn stops at .Response.

    Ollama's Parse appends `{{ .Response }}` to templates that mention neither .Messages nor .Response,
    so past assistant turns still appear; for the open turn it renders a copy of the template cut
    right after the .Response node, leaving the prompt where the model continues.
    """
    if not template.has_field("response"):
        template = template.with_appended_field("Response")
    parts: list[str] = []
    turn = {"System": "", "Prompt": "", "Response": ""}

    def flush() -> None:
        parts.append(template.execute({**turn, **thinking}, today=today))
        turn.update(System="", Prompt="", Response="")

    for msg in messages:
        if msg.role == "system":
            if turn["Prompt"] or turn["Response"]:
                flush()
            turn["System"] = msg.content
        elif msg.role == "user":
            if turn["Response"]:
                flush()
            turn["Prompt"] = msg.content
        elif msg.role == "assistant":
            turn["Response"] = msg.content
        # tool messages have no place in a legacy template; Ollama drops them too
    parts.append(template.truncated_after_field("Response").execute({**turn, **thinking}, today=today))
    return "".join(parts)


def render_generate(
    template: GoTemplate,
    *,
    prompt: str,
    system: str | None = None,
    suffix: str | None = None,
    response: str = "",
    think: Think = None,
    history: Sequence[Message] = (),
    images: Sequence[bytes | str] = (),
    today: datetime.date | None = None,
) -> str:
    """The /api/generate prompt (non-raw); `images` belong to the prompt's user message (tagged `[img-N]`).

    `system` is the effective system prompt (request's, else the model's SYSTEM); `history` is the
    model's MESSAGE layer (Ollama adds it when no `context` is sent); a non-empty `response` is an
    assistant prefill rendered after the prompt.  With both `prompt` and `suffix`, the template gets
    only .Prompt/.Suffix (fill-in-the-middle); a suffix needs a template that uses .Suffix.
    """
    if suffix and not supports_insert(template):
        raise InsertNotSupported("template does not support insert")
    if prompt and suffix:
        data = {"Prompt": prompt, "Suffix": suffix, "Response": "", **_think_values(think)}
        return template.execute(data, today=today)
    messages: list[Message] = [Message("system", system)] if system else []
    messages.extend(history)
    messages.append(Message("user", prompt, images=list(images) or None))
    if response:
        messages.append(Message("assistant", response))
    return _execute(template, _with_image_tags(messages), (), think, today)


def _with_image_tags(messages: Sequence[Message]) -> list[Message]:
    """Ollama numbers images across the conversation: each becomes `[img-N]`, replacing an `[img]`
    placeholder in the content when there is one, else prefixed to the content."""
    out: list[Message] = []
    next_id = 0
    for msg in messages:
        if not msg.images:
            out.append(msg)
            continue
        prefix, content = "", msg.content
        for _ in msg.images:
            tag = f"[img-{next_id}]"
            next_id += 1
            if "[img]" in content:
                content = content.replace("[img]", tag, 1)
            else:
                prefix += tag
        out.append(replace(msg, content=prefix + content))
    return out


def chat_window(messages: Sequence[Message], start: int) -> list[Message]:
    """The messages a prompt renders when the conversation is cut at ``start``: the system messages before the
    cut, then the rest with their images tagged (`[img-0]` is the first image after the cut)."""
    return [m for m in messages[:start] if m.role == "system"] + _with_image_tags(messages[start:])


def window_images(messages: Sequence[Message], start: int) -> list[bytes | str]:
    """The images of ``chat_window(messages, start)`` in the order of their tags."""
    return [image for m in messages[start:] for image in (m.images or ())]


@dataclass(frozen=True)
class RenderedChat:
    """A chat prompt and the images its `[img-N]` tags stand for (image N at index N)."""

    text: str
    images: list[bytes | str] = field(default_factory=list)


def render_chat_window(
    template: GoTemplate,
    messages: Sequence[Message],
    tools: Sequence[Tool] | None = None,
    think: Think = None,
    *,
    fits: Callable[[str], bool] | None = None,
    today: datetime.date | None = None,
) -> RenderedChat:
    """The /api/chat prompt, with the images of the messages it kept.

    `fits(prompt)` enables Ollama's truncation: the oldest messages are dropped until the rendered
    prompt fits (the last message is always kept, and system messages before the cut are kept).
    """
    msgs = list(messages)
    tool_list = list(tools or ())
    start = 0
    if fits is not None and msgs:
        start = len(msgs) - 1
        for i in range(len(msgs) - 2, -1, -1):
            if not fits(_execute(template, chat_window(msgs, i), tool_list, think, today)):
                break
            start = i
    return RenderedChat(_execute(template, chat_window(msgs, start), tool_list, think, today), window_images(msgs, start))


def render_chat(
    template: GoTemplate,
    messages: Sequence[Message],
    tools: Sequence[Tool] | None = None,
    think: Think = None,
    *,
    fits: Callable[[str], bool] | None = None,
    today: datetime.date | None = None,
) -> str:
    """The /api/chat prompt (`render_chat_window`'s text)."""
    return render_chat_window(template, messages, tools, think, fits=fits, today=today).text


# ---------------------------------------------------------------------------------------------------
# Jinja chat templates (HF tokenizer.chat_template)


class _GenerationTag(jinja2.ext.Extension):
    """transformers' {% generation %} ... {% endgeneration %}: marks assistant text; renders its body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render_body"), [], [], body).set_lineno(lineno)

    @staticmethod
    def _render_body(caller: Callable[[], str]) -> str:
        return caller()


def _tojson(value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False) -> str:
    # transformers overrides Jinja's tojson, which would HTML-escape and sort keys.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _hf_message(msg: Message) -> dict[str, Any]:
    """A message in the shape HF chat templates read."""
    out: dict[str, Any] = {"role": msg.role, "content": msg.content}
    if msg.tool_calls:
        out["tool_calls"] = [
            {**({"id": c.id} if c.id else {}), "type": "function", "function": {"name": c.name, "arguments": dict(c.arguments)}}
            for c in msg.tool_calls
        ]
    if msg.tool_name:
        out["name"] = msg.tool_name
    if msg.tool_call_id:
        out["tool_call_id"] = msg.tool_call_id
    if msg.thinking:
        out["reasoning_content"] = msg.thinking  # the key Qwen3/DeepSeek-style templates read
    return out


class JinjaChatTemplate:
    """A compiled HF chat template, in the environment transformers' apply_chat_template uses."""

    def __init__(self, source: str, *, now: Callable[[], datetime.datetime] | None = None):
        clock = now or datetime.datetime.now
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = lambda fmt: clock().strftime(fmt)
        self.source = source
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateSyntaxError as err:
            raise TemplateError(f"chat template: {err.message}", err.lineno) from None

    def render(
        self,
        messages: Sequence[Message],
        *,
        add_generation_prompt: bool = True,
        bos_token: str = "",
        eos_token: str = "",
        tools: Sequence[Tool] | None = None,
        **extra: Any,
    ) -> str:
        """Render; `extra` become template variables too (e.g. enable_thinking=False)."""
        try:
            return self._template.render(
                messages=[_hf_message(m) for m in messages],
                tools=[t.to_dict() for t in tools] if tools else None,
                add_generation_prompt=add_generation_prompt,
                bos_token=bos_token,
                eos_token=eos_token,
                **extra,
            )
        except jinja2.TemplateError as err:
            raise TemplateError(f"chat template: {err}") from err


def render_jinja_chat(
    chat_template: str,
    messages: Sequence[Message],
    *,
    add_generation_prompt: bool = True,
    bos_token: str = "",
    eos_token: str = "",
    tools: Sequence[Tool] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> str:
    """Compile and render a chat template once (keep a JinjaChatTemplate to render repeatedly)."""
    return JinjaChatTemplate(chat_template).render(
        messages,
        add_generation_prompt=add_generation_prompt,
        bos_token=bos_token,
        eos_token=eos_token,
        tools=tools,
        **dict(extra or {}),
    )


# ---------------------------------------------------------------------------------------------------
# Fallback templates: Ollama's library templates, for GGUFs without TEMPLATE or chat_template

# Ollama's template when nothing is known: the prompt as is.
DEFAULT_TEMPLATE = "{{ .Prompt }}"

_CHATML = """{{- if .Messages }}
{{- if or .System .Tools }}<|im_start|>system
{{- if .System }}
{{ .System }}
{{- end }}
{{- if .Tools }}

# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{{- range .Tools }}
{"type": "function", "function": {{ .Function }}}
{{- end }}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call>
{{- end }}<|im_end|>
{{ end }}
{{- range $i, $_ := .Messages }}
{{- $last := eq (len (slice $.Messages $i)) 1 -}}
{{- if eq .Role "user" }}<|im_start|>user
{{ .Content }}<|im_end|>
{{ else if eq .Role "assistant" }}<|im_start|>assistant
{{ if .Content }}{{ .Content }}
{{- else if .ToolCalls }}<tool_call>
{{ range .ToolCalls }}{"name": "{{ .Function.Name }}", "arguments": {{ .Function.Arguments }}}
{{ end }}</tool_call>
{{- end }}{{ if not $last }}<|im_end|>
{{ end }}
{{- else if eq .Role "tool" }}<|im_start|>user
<tool_response>
{{ .Content }}
</tool_response><|im_end|>
{{ end }}
{{- if and (ne .Role "assistant") $last }}<|im_start|>assistant
{{ end }}
{{- end }}
{{- else }}
{{- if .System }}<|im_start|>system
{{ .System }}<|im_end|>
{{ end }}{{ if .Prompt }}<|im_start|>user
{{ .Prompt }}<|im_end|>
{{ end }}<|im_start|>assistant
{{ end }}{{ .Response }}{{ if .Response }}<|im_end|>{{ end }}"""

_GEMMA = """{{- range $i, $_ := .Messages }}
{{- $last := eq (len (slice $.Messages $i)) 1 }}
{{- if or (eq .Role "user") (eq .Role "system") }}<start_of_turn>user
{{ .Content }}<end_of_turn>
{{ if $last }}<start_of_turn>model
{{ end }}
{{- else if eq .Role "assistant" }}<start_of_turn>model
{{ .Content }}{{ if not $last }}<end_of_turn>
{{ end }}
{{- end }}
{{- end }}"""

# Gemma 4's turn format without tools or thinking: a system turn, assistant turns as "model", and the
# generation prompt followed by an empty thought channel (Gemma 4's own template, thinking off).
_GEMMA4 = """{{- range $i, $_ := .Messages }}
{{- $last := eq (len (slice $.Messages $i)) 1 }}
{{- if eq .Role "assistant" }}<|turn>model
{{ .Content }}{{ if not $last }}<turn|>
{{ end }}
{{- else }}<|turn>{{ .Role }}
{{ .Content }}<turn|>
{{ if $last }}<|turn>model
<|channel>thought
<channel|>{{ end }}
{{- end }}
{{- end }}"""

_LLAMA3 = """{{ if .System }}<|start_header_id|>system<|end_header_id|>

{{ .System }}<|eot_id|>{{ end }}{{ if .Prompt }}<|start_header_id|>user<|end_header_id|>

{{ .Prompt }}<|eot_id|>{{ end }}<|start_header_id|>assistant<|end_header_id|>

{{ .Response }}<|eot_id|>"""

# chatml: Ollama's qwen2.5 template (tools included); gemma: gemma3's; gemma4: its turn format; llama3: llama3's.
FALLBACK_TEMPLATES: Mapping[str, str] = {"chatml": _CHATML, "gemma": _GEMMA, "gemma4": _GEMMA4, "llama3": _LLAMA3}


def fallback_template_for(architecture: str, token_strings: Collection[str]) -> str:
    """The fallback TEMPLATE text for a GGUF without one.

    The vocabulary decides first (a model trained on a chat format has its special tokens, whatever
    its architecture: SmolLM2 is "llama" with ChatML tokens); the architecture decides otherwise.
    """
    tokens = set(token_strings)
    arch = architecture.lower()
    if {"<|turn>", "<turn|>"} <= tokens:
        return FALLBACK_TEMPLATES["gemma4"]
    if {"<start_of_turn>", "<end_of_turn>"} <= tokens:
        return FALLBACK_TEMPLATES["gemma"]
    if {"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"} <= tokens:
        return FALLBACK_TEMPLATES["llama3"]
    if {"<|im_start|>", "<|im_end|>"} <= tokens:
        return FALLBACK_TEMPLATES["chatml"]
    if arch.startswith("gemma4"):
        return FALLBACK_TEMPLATES["gemma4"]
    if arch.startswith("gemma"):
        return FALLBACK_TEMPLATES["gemma"]
    if arch.startswith("qwen"):
        return FALLBACK_TEMPLATES["chatml"]
    return DEFAULT_TEMPLATE
