"""``Model``: the decoder-only transformer (embedding, blocks, final norm, output head) and its forward.

Built from a ``ModelConfig`` and layers that are already built (``engine.models.layers``): it knows no
file format; ``engine.models.loader`` builds one from a GGUF.

``Model.forward(tokens, cache)`` appends ``n`` positions to the KV cache, starting at ``cache.length``, with
causal masking inside the batch: prefill, single-token decode and speculative verification (width k+1)
are the same call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol, Sequence

import torch
from torch import nn

from engine.cache.kv import KVCache
from engine.cache.layered import LayeredKVCache
from engine.cache.recurrent import HybridCache
from engine.models.config import ModelConfig
from engine.models.fused_stack import FusedStack, build_fused_stack
from engine.models.layers import BatchStep, Block, ForwardStep, RMSNorm, RotaryEmbedding, Segment
from engine.models.per_layer import PerLayerInput
from engine.ops.linear import Linear

if TYPE_CHECKING:
    from engine.contract.gguf import GGUFFile

# Token ids [n] -> embedding rows [n, n_embd] (engine.ops.linear.Embedding reads them from a GGUF mapping).
TokenEmbedding = Callable[[torch.Tensor], torch.Tensor]


class BatchCall(Protocol):
    """One sequence's part of ``Model.forward_batch``: what it would pass to ``forward``."""

    tokens: Sequence[int]
    cache: KVCache
    logits_for: str
    return_hidden: bool


@dataclass
class SequenceRows:
    """A ``BatchCall`` and nothing more, for a caller that batches sequences itself (the step loop's calls carry
    more: ``engine.batching.policy.ForwardCall``)."""

    tokens: Sequence[int]
    cache: KVCache
    logits_for: str = "all"
    return_hidden: bool = False


@dataclass
class ForwardOutput:
    """``logits``: f32 [n or 1, vocab] (None with logits_for='none'); ``hidden``: post-final-norm hidden
    states [n, D]; ``prenorm_hidden``: the last layer's output before the final norm [n, D] (what an MTP
    head consumes). Hidden states cover all n positions whatever ``logits_for`` says."""

    logits: torch.Tensor | None
    hidden: torch.Tensor
    prenorm_hidden: torch.Tensor
    # the residual stream at the input of each of ``Model.capture_layers`` (layer n_layer: after the last one),
    # concatenated [n, len(capture_layers) * D]: what an EAGLE-3 head reads; None when none are captured
    captured: torch.Tensor | None = None


class Model(nn.Module):
    def __init__(self, config: ModelConfig, *, embed: TokenEmbedding, layers: Sequence[Block], norm: torch.Tensor,
                 output: Linear, fmt: str, dtype: torch.dtype, device: torch.device | str = "cpu",
                 rope_freqs: torch.Tensor | None = None, per_layer_input: PerLayerInput | None = None):
        """``layers``: one built block per layer, in order; ``norm``: the final RMSNorm's weight; ``output``:
        the lm head (the embedding table itself when tied); ``fmt``: the linears' weight format, reported
        as the model's; ``rope_freqs``: per-frequency RoPE divisors (llama 3.x; gemma4's global layers),
        if the model has them; ``per_layer_input``: gemma4 E models' per-layer embedding inputs."""
        super().__init__()
        if len(layers) != config.n_layer:
            raise ValueError(f"{len(layers)} layers for a config of {config.n_layer}")
        device = torch.device(device)
        self.config = cfg = config
        self.fmt = fmt
        self.dtype = dtype
        self.embed = embed
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(norm, cfg.rms_eps)
        self.output = output
        init_len = min(cfg.context_length, 4096)
        self.rope_global = RotaryEmbedding(cfg.rope_dim, cfg.rope_base, cfg.rope_style,
                                           position_scale=cfg.rope_scale_factor, freq_factors=rope_freqs,
                                           initial_length=init_len)
        # Sliding-window layers have their own base and no linear scaling (llama.cpp: freq_scale_swa = 1).
        if any(cfg.is_local(i) for i in range(cfg.n_layer)):
            self.rope_local = RotaryEmbedding(cfg.rope_dim_local or cfg.rope_dim, cfg.rope_base_local or cfg.rope_base,
                                              cfg.rope_style, freq_factors=rope_freqs if cfg.rope_freqs_local else None,
                                              initial_length=init_len)
        else:
            self.rope_local = self.rope_global
        self._ropes = {"global": self.rope_global, "local": self.rope_local}
        self._embed_scale = cfg.embed_scale
        self.per_layer_input = per_layer_input
        self.block_ops = _block_ops_for(device, dtype)
        # The blocks as one native call (engine.models.fused_stack), built on first use: False = not yet.
        self._fused_stack: FusedStack | None | bool = False
        # Layers at whose input ``forward`` records the residual stream (``ForwardOutput.captured``): set once at
        # load by a drafter that reads them (an EAGLE-3 head); the native stack then runs as one call per stretch
        # of layers between them.
        self.capture_layers: tuple[int, ...] = ()
        self._fused_stretches: list[tuple[int, FusedStack]] | None | bool = False
        # Set by engine.models.loader: the file the weights came from, kept open while the model lives
        # (the embedding reads its rows from the mapping), and its path.
        self.gguf: GGUFFile | None = None
        self.source_path: str | None = None

    def use_block_ops(self, enabled: bool) -> None:
        """Switch the fused block ops and the native block stack on (when this device and dtype can use
        them) or off: off, every block runs its PyTorch ops from Python."""
        self.block_ops = _block_ops_for(self.device, self.dtype) if enabled else None
        self._fused_stack = self._fused_stretches = False if enabled else None

    def use_fused_stack(self, enabled: bool) -> None:
        """Switch the native block stack alone on or off (the fused block ops stay as they are)."""
        self._fused_stack = self._fused_stretches = False if enabled and self.block_ops is not None else None

    def capture_at(self, layers: Sequence[int]) -> None:
        """Record the residual stream at the input of ``layers`` (0 .. n_layer; n_layer is the last layer's
        output) in every forward that returns hidden states."""
        bad = [i for i in layers if not 0 <= i <= self.config.n_layer]
        if bad:
            raise ValueError(f"layer {bad[0]} is not one of the model's {self.config.n_layer} (0 .. n_layer)")
        self.capture_layers = tuple(int(i) for i in layers)
        if self._fused_stretches is not None:
            self._fused_stretches = False

    def _stretches(self) -> list[tuple[int, FusedStack]] | None:
        """The native stack as one call per stretch of layers between captured ones: (first layer, stack)."""
        if self._fused_stretches is False:
            self._fused_stretches = None
            if self.fused_stack() is not None:
                from engine.ops.kernels import decoder_stack_class

                cuts = sorted({0, self.config.n_layer, *self.capture_layers})
                stacks = [(a, build_fused_stack(self.config, list(self.layers)[a:b], decoder_stack_class(),
                                                first_layer=a)) for a, b in zip(cuts, cuts[1:]) if b > a]
                if all(stack is not None for _, stack in stacks):
                    self._fused_stretches = stacks
        return self._fused_stretches

    def _through_blocks(self, x: torch.Tensor, fused: Callable[[FusedStack, torch.Tensor], torch.Tensor] | None,
                        layer: Callable[[nn.Module, torch.Tensor], torch.Tensor],
                        capture: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x through every block (natively when ``fused`` is given and the blocks allow), and the captured
        residual stream when ``capture``."""
        wanted = self.capture_layers if capture else ()
        if not wanted:
            stack = self.fused_stack() if fused is not None else None
            if stack is not None:
                return fused(stack, x), None
            for block in self.layers:
                x = layer(block, x)
            return x, None
        seen: dict[int, torch.Tensor] = {}
        stretches = self._stretches() if fused is not None else None
        if stretches is not None:
            for first, stack in stretches:
                seen[first] = x
                x = fused(stack, x)
        else:
            for i, block in enumerate(self.layers):
                seen[i] = x
                x = layer(block, x)
        seen[self.config.n_layer] = x
        return x, torch.cat([seen[i] for i in wanted], dim=-1)

    def fused_stack(self) -> FusedStack | None:
        """The native stack over this model's blocks, if they are a shape it runs and it is switched on."""
        if self._fused_stack is False:
            native = None
            if self.block_ops is not None:
                from engine.ops.kernels import decoder_stack_class

                native = decoder_stack_class()
            self._fused_stack = build_fused_stack(self.config, list(self.layers), native)
        return self._fused_stack

    @property
    def device(self) -> torch.device:
        return self.norm.weight.device

    def close(self) -> None:
        """Release the GGUF mapping (the model cannot run afterwards: embeddings read from it)."""
        if self.gguf is not None:
            self.gguf.close()

    def new_cache(self, capacity: int | None = None) -> KVCache:
        """An empty KV cache on the model's device in its compute dtype (capacity defaults to the context)."""
        cls = HybridCache if self.config.recurrent is not None else KVCache if self.config.uniform_kv \
            else LayeredKVCache
        return cls.new(self.config, capacity or self.config.context_length, self.device, self.dtype)

    def _masks(self, start: int, n: int, device: torch.device) -> tuple[dict, dict]:
        cfg = self.config
        end = start + n
        key_start = {"global": 0, "local": 0}
        masks: dict = {"global": None, "local": None}
        if cfg.sliding_window:
            key_start["local"] = max(0, start - cfg.sliding_window + 1)
        if n == 1:  # a single query sees every key it is handed (the window is applied by key_start)
            return masks, key_start
        q = torch.arange(start, end, device=device)[:, None]
        masks["global"] = torch.arange(0, end, device=device)[None, :] <= q
        if cfg.sliding_window:
            kpos = torch.arange(key_start["local"], end, device=device)[None, :]
            masks["local"] = (kpos <= q) & (kpos > q - cfg.sliding_window)
        else:
            masks["local"] = masks["global"]
        return masks, key_start

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor | Sequence[int], cache: KVCache, *, logits_for: str = "all",
                return_hidden: bool = False) -> torch.Tensor | ForwardOutput | None:
        """Append ``tokens`` (n ids) at positions ``cache.length ..`` and return f32 logits.

        ``logits_for``: 'all' -> [n, vocab]; 'last' -> [1, vocab] (prefill); 'none' -> no lm_head.
        ``return_hidden``: return a ``ForwardOutput`` with the hidden states as well.
        Raises ``ContextOverflowError`` (before touching the cache) if the positions do not fit.
        """
        device = self.device
        if isinstance(tokens, torch.Tensor):
            ids = tokens.to(device=device, dtype=torch.long).reshape(-1)
            token_list = ids.tolist()
        else:
            token_list = [int(t) for t in tokens]
            ids = torch.tensor(token_list, dtype=torch.long, device=device)
        n = len(token_list)
        if n == 0:
            raise ValueError("forward needs at least one token")
        if logits_for not in ("all", "last", "none"):
            raise ValueError(f"logits_for must be 'all', 'last' or 'none', not {logits_for!r}")
        cache.check_room(n)
        start = cache.length
        step = self._step(start, n, logits_for)
        rope = step.rope

        x = self._embed(ids)
        if self.per_layer_input is not None:
            step.per_layer = self.per_layer_input(ids, x)
        native = type(cache) is KVCache and step.per_layer is None  # the same blocks, one native call
        x, captured = self._through_blocks(
            x, (lambda stack, h: stack.forward(h, cache, start, rope["global"])) if native else None,
            lambda layer, h: layer(h, cache, step, self._ropes[layer.attn.kind]), return_hidden)
        cache.commit(token_list)

        hidden = self.norm(x, self.block_ops)
        logits = None
        if logits_for != "none":
            logits = self._logits(hidden[-1:] if logits_for == "last" else hidden)
        if return_hidden:
            return ForwardOutput(logits, hidden, x, captured)
        return logits

    def _step(self, start: int, n: int, logits_for: str) -> ForwardStep:
        """The per-forward state of ``n`` positions from ``start`` (masks, RoPE tables, window starts)."""
        device = self.device
        masks, key_start = self._masks(start, n, device)
        rope = {"global": self.rope_global.get(start, n, device, self.dtype)}
        rope["local"] = rope["global"] if self.rope_local is self.rope_global else \
            self.rope_local.get(start, n, device, self.dtype)
        return ForwardStep(start, n, rope, masks, key_start, self.block_ops, rollback=logits_for == "all")

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Embedding rows of ``ids`` in the compute dtype, scaled where the model scales them (gemma)."""
        x = self.embed(ids).to(self.dtype)
        if self._embed_scale is not None:
            x = x * torch.tensor(self._embed_scale, dtype=self.dtype)
        return x

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.output(hidden).float()
        if self.config.final_softcap:
            c = self.config.final_softcap
            logits = torch.tanh(logits / c) * c
        return logits

    @staticmethod
    def _native_batch(calls: Sequence["BatchCall"], segments: Sequence[Segment]
                      ) -> Callable[[FusedStack, torch.Tensor], torch.Tensor]:
        """The native stack's call over every segment of a batch (one call per stack)."""
        caches, starts = [c.cache for c in calls], [seg.step.start for seg in segments]
        lengths = [seg.step.n for seg in segments]
        cos_sin = (torch.cat([seg.step.rope["global"][0] for seg in segments]),
                   torch.cat([seg.step.rope["global"][1] for seg in segments]))
        return lambda stack, h: stack.forward_batch(h, caches, starts, lengths, cos_sin)

    @property
    def batches(self) -> bool:
        """Whether ``forward_batch`` runs several sequences in one forward (every layer an attention block;
        a hybrid recurrent model's layers keep one sequence's state and run one sequence at a time)."""
        return self.config.recurrent is None and all(type(layer) is Block for layer in self.layers)

    @torch.no_grad()
    def forward_batch(self, calls: Sequence["BatchCall"]) -> list:
        """Each call's ``forward`` (its tokens appended to its own cache), computed as ONE forward over all of
        their rows: the linears and the output head run once over the rows, each sequence's attention over
        its own cache (ragged lengths and positions). Returns one result per call, what ``forward`` returns
        for it. A model that cannot batch (``batches``) runs the calls one after another."""
        if len(calls) == 1 or not self.batches:
            return [self.forward(c.tokens, c.cache, logits_for=c.logits_for, return_hidden=c.return_hidden)
                    for c in calls]
        segments, ids, row = [], [], 0
        for c in calls:
            n = len(c.tokens)
            if n == 0:
                raise ValueError("forward needs at least one token")
            c.cache.check_room(n)
            segments.append(Segment(slice(row, row + n), c.cache, self._step(c.cache.length, n, c.logits_for)))
            ids.extend(int(t) for t in c.tokens)
            row += n
        ids_t = torch.tensor(ids, dtype=torch.long, device=self.device)
        x = self._embed(ids_t)
        native = self.per_layer_input is None and all(type(c.cache) is KVCache for c in calls)
        batch = BatchStep(segments, self.block_ops,
                          self.per_layer_input(ids_t, x) if self.per_layer_input is not None else None)
        fused = self._native_batch(calls, segments) if native else None
        x, captured = self._through_blocks(x, fused, lambda layer, h: layer(h, None, batch, self._ropes[layer.attn.kind]),
                                           any(c.return_hidden for c in calls))
        for c in calls:
            c.cache.commit([int(t) for t in c.tokens])
        hidden = self.norm(x, self.block_ops)
        # the rows whose logits are wanted, through the head in one matmul
        wanted = [list(range(seg.rows.start, seg.rows.stop)) if c.logits_for == "all"
                  else [seg.rows.stop - 1] if c.logits_for == "last" else [] for c, seg in zip(calls, segments)]
        flat = [r for rows in wanted for r in rows]
        logits = self._logits(hidden[flat]) if flat else None
        out, at = [], 0
        for c, seg, rows in zip(calls, segments, wanted):
            lg = logits[at:at + len(rows)] if rows else None
            at += len(rows)
            out.append(ForwardOutput(lg, hidden[seg.rows], x[seg.rows],
                                     captured[seg.rows] if captured is not None else None) if c.return_hidden else lg)
        return out


def _block_ops_for(device: torch.device, dtype: torch.dtype):
    """engine.ops.kernels' fused block ops where they apply (f32 on the CPU) and were built, else None."""
    if device.type != "cpu" or dtype != torch.float32:
        return None
    from engine.ops.kernels import load_block_ops

    return load_block_ops()
