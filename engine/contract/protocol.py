"""The boundary between the server and the engine process: typed, picklable messages.

The server never touches torch: it sends a `LoadSpec` once, then `GenerateRequest`s, and reads back
`TokenChunk`s followed by one `GenerateResult` (or, to an embedding model, `EmbedRequest`s answered by one
`EmbedResult` each). Everything here is plain data so it crosses a
process pipe unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.contract.options import DEFAULT_DRAFT_VOCAB, Options
from engine.contract.speculation_stats import SpeculationStats
from engine.contract.llamacpp_launch import LlamaCppLaunch
from engine.contract.vllm_launch import VllmLaunch

#: Tokens of earlier outputs a loaded model keeps for the suffix drafter (engine.speculative.suffix_cache), unless
#: the server says otherwise (TANDEM_SUFFIX_TOKENS): about 160 bytes a token with its index, ~20 MiB
#: (tracemalloc over 131072 tokens of 327 outputs, 2026-12-06).
DEFAULT_SUFFIX_TOKENS = 131072

# Seconds an exiting engine may spend finishing a packed-weight cache write, beating meanwhile, before
# the server kills it (the 1.5B's 1 GB takes a few seconds).
EXIT_FINISH_CAP = 300.0


class EngineError(Exception):
    """A request the engine could not serve; ``status`` is the HTTP status the server answers with."""

    def __init__(self, message: str, status: int = 500):
        super().__init__(message)
        self.status = status


class EngineCrashedError(EngineError):
    """The engine process died (crash, out of memory, killed) while serving a request."""


class EngineUnresponsiveError(EngineCrashedError):
    """The engine process stopped answering (frozen, stopped, wedged): the client killed it, so the
    model's next request starts a fresh one, exactly as after a crash."""


class ContextLengthError(EngineError):
    """The prompt does not fit in num_ctx and shifting was not allowed."""

    def __init__(self, message: str):
        super().__init__(message, status=400)


@dataclass(frozen=True)
class LoadSpec:
    """What to load: a target GGUF, an optional draft GGUF, the target's LoRA adapters, and load-time options."""

    model_path: str
    draft_path: str | None = None
    # a vision projector GGUF (the model's projector layer): the llamacpp engine starts llama-server with --mmproj
    projector_path: str | None = None
    adapter_paths: tuple[str, ...] = ()  # LoRA adapter GGUFs applied to the target (never to the draft)
    num_ctx: int = 4096
    num_thread: int = 0  # 0 = the machine's cores
    device: str = "cpu"  # cpu | cuda[:N] | auto (CUDA when torch sees it); the server sends Options.device()
    weight_format: str = "auto"  # target weights: auto | f32 | bf16 | bf16-packed | int8 | int4 | auto-int4 | qdot
    draft_weight_format: str = "auto"
    # a draft model's output head keeps only this many tokens (engine.models.pruned_head); 0 = all
    draft_vocab: int = DEFAULT_DRAFT_VOCAB
    # where packed kernel layouts are cached (engine.ops.pack_cache), None = rebuilt at every load
    pack_dir: str | None = None
    # sequences served at once (one KV cache region each, engine.batching); 0 = as many as fit (up to 4)
    num_parallel: int = 1
    # tokens of earlier outputs the suffix drafter keeps (engine.speculative.suffix_cache); 0 = keeps none
    suffix_tokens: int = DEFAULT_SUFFIX_TOKENS
    # a directory the native engine's step loop traces its forwards into (engine.batching.step_trace); None = no trace
    step_trace_dir: str | None = None
    engine: str = "native"  # native | vllm | llamacpp (the model runs on a vLLM server or a llama-server)
    vllm: VllmLaunch | None = None  # with engine "vllm": what to start or attach to
    llamacpp: LlamaCppLaunch | None = None  # with engine "llamacpp": what to start or attach to


@dataclass(frozen=True)
class GenerateRequest:
    """One generation. ``prompt`` is the fully rendered prompt text (templates are applied by the server)."""

    prompt: str
    options: Options = field(default_factory=Options)  # merged: defaults <- model params <- request
    images: list[bytes] = field(default_factory=list)
    raw_tokens: list[int] | None = None  # Ollama's deprecated `context`: tokens prepended to the prompt
    add_bos: bool | None = None  # None: the tokenizer's add_bos_token setting
    logprobs: bool = False
    top_logprobs: int = 0
    shift: bool = True  # shift the context when num_ctx is exceeded (Ollama's default) instead of failing
    truncate: bool = True  # truncate a prompt longer than num_ctx (keeping num_keep + the end)
    format: Any = None  # Ollama's format: None / "" (free text), "json", or a JSON schema dict (engine.contract.json_grammar)
    # The model was asked to think: with a ``format``, its reasoning block (when the vocabulary has the tags)
    # is free text and the format holds from the block's end, as Ollama reasons first and formats after.
    think_first: bool = False


@dataclass(frozen=True)
class EmbedRequest:
    """Embed each of ``inputs`` (an encoder model: one pooled vector per input).

    ``truncate``: an input longer than the context loses its end (the special tokens kept); False makes it a
    ``ContextLengthError`` instead. ``num_ctx`` > 0 narrows the context the model was loaded with."""

    inputs: list[str]
    truncate: bool = True
    num_ctx: int = 0


@dataclass
class EmbedResult:
    """One pooled vector per input, in order, as the model computes it (not normalised: the server
    normalises as Ollama does), and the tokens each input was embedded from."""

    embeddings: list[list[float]]
    token_counts: list[int]
    duration_ns: int = 0

    @property
    def prompt_eval_count(self) -> int:
        return sum(self.token_counts)


@dataclass(frozen=True)
class TokenLogprob:
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[tuple[str, float, list[int]]] = field(default_factory=list)


@dataclass(frozen=True)
class TokenChunk:
    """Newly committed text (stop strings already removed) and the tokens that produced it."""

    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprob] | None = None


@dataclass
class GenerateResult:
    """The final message of a generation: why it stopped, counts and nanosecond durations."""

    done_reason: str  # stop | length
    prompt_eval_count: int  # cached + newly evaluated prompt tokens (Ollama's meaning)
    prompt_cached: int
    prompt_eval_duration_ns: int
    eval_count: int
    eval_duration_ns: int
    context: list[int]  # prompt + generated tokens (Ollama's `context`)
    speculation: SpeculationStats = field(default_factory=SpeculationStats)


@dataclass(frozen=True)
class ModelFacts:
    """What the server needs to know about a loaded model (for /api/ps and prompt rendering)."""

    architecture: str
    context_length: int  # the num_ctx the cache was built for
    vocab_size: int
    device: str
    weight_format: str
    draft_architecture: str | None
    draft_weight_format: str | None
    memory_bytes: int  # resident weights + caches
    bos_token: str
    eos_token: str
    add_bos: bool
    pooling: str | None = None  # an embedding model's pooling ("mean", "cls", "last"); None: a decoder
    num_parallel: int = 1  # sequences it serves at once (slots)
    embedding_length: int = 0
    backend: str = "native"  # native | vllm | llamacpp
    speculative_method: str | None = None  # vllm: vLLM's method (draft_model, mtp, eagle3, ngram), None: none
    endpoint: str | None = None  # vllm: the URL vLLM answers on
    attached: bool = False  # vllm: tandem attached to a running vLLM (TANDEM_VLLM_URL) rather than starting one
