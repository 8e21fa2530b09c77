"""Drafting with a DeepSeek-V3 / GLM NextN multi-token-prediction head fed by the target's hidden states."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Sequence

import torch
from torch import Tensor

from engine.cache.kv import KVCache
from engine.ops.memory import model_bytes
from engine.speculative.drafter import (
    EMPTY,
    DraftContext,
    Drafter,
    Proposal,
    TargetOutput,
    confidence,
    draw,
    fit_vocab,
    stack,
)

_NEXTN = re.compile(r"^blk\.(\d+)\.nextn\.eh_proj\.weight$")


def find_nextn_block(tensor_names) -> int | None:
    """The block index N of a NextN head (``blk.N.nextn.eh_proj.weight``), or None."""
    for name in tensor_names:
        m = _NEXTN.match(name)
        if m:
            return int(m.group(1))
    return None


class MtpDrafter(Drafter):
    """A NextN multi-token-prediction head: one extra transformer block fed by the target.

    Entry j of its KV cache is the "pair" (h_j, t_{j+1}): the target's pre-norm hidden state at
    position j and the embedding of the token that followed, combined as
    ``eh_proj([enorm(embed(t_{j+1})), hnorm(h_j)])`` and run through the block at position j. The
    block's output g_j, through ``shared_head_norm`` and ``shared_head_head`` (or the target's own
    head when the GGUF shares it), predicts t_{j+2}.

    Invariant after every commit: pairs 0..len(tokens)-2 are cached (as many as the target's cache
    holds positions), and ``_last`` = g of the newest pair, which predicts the first draft. Deeper
    drafts chain on the head's own output: pair (g, d_i) at the next position predicts d_{i+1}.
    Those speculative pairs are dropped at commit (a truncation) and replaced by pairs built from
    the target's real hidden states, which arrive in ``commit(..., target)``.
    """

    kind = "mtp"
    needs_hidden = True

    def __init__(self, target, f, block: int, fmt: str, capacity: int):
        super().__init__()
        from engine.models.transformer import Block, RMSNorm
        from engine.ops.dequant import load_tensor
        from engine.ops.linear import Embedding, load_linear

        cfg = target.config
        # The head is one global-attention block; it owns its own single-layer cache.
        head_cfg = replace(cfg, local_layers=(), sliding_window=None)
        device, dtype = target.device, target.dtype
        p = f"blk.{block}.nextn."
        self.block = Block(f, head_cfg, block, fmt, device).to(device)
        self.block.attn.layer = 0  # its KV lives in layer 0 of our own cache, not the target's
        self.eh_proj = load_linear(f, p + "eh_proj.weight", fmt, device=device)
        self.enorm = RMSNorm(load_tensor(f, p + "enorm.weight"), cfg.rms_eps).to(device)
        self.hnorm = RMSNorm(load_tensor(f, p + "hnorm.weight"), cfg.rms_eps).to(device)
        self.head_norm = (RMSNorm(load_tensor(f, p + "shared_head_norm.weight"), cfg.rms_eps).to(device)
                          if p + "shared_head_norm.weight" in f.tensors else target.norm)
        self.head = (load_linear(f, p + "shared_head_head.weight", fmt, device=device)
                     if p + "shared_head_head.weight" in f.tensors else target.output)
        if p + "embed_tokens.weight" in f.tensors:
            self.embed, self.embed_scale = Embedding(f, p + "embed_tokens.weight", dtype, device=device), None
        else:
            self.embed, self.embed_scale = target.embed, cfg.embed_scale
        self.rope = target.rope_global
        self.block_ops = target.block_ops  # the target's fused ops (same device and dtype)
        self.cache = KVCache(1, cfg.n_head_kv, cfg.head_dim, capacity, v_head_dim=cfg.v_head_dim,
                             device=device, dtype=dtype)
        self.vocab_size = cfg.vocab_size
        self.device, self.dtype = device, dtype
        self.block_index = block
        # The head's own output projection and norm (a separate head file has them) use memory the
        # target's do not account for.
        self._own_head = [m for m in (self.head, self.head_norm) if m is not target.output and m is not target.norm]
        self._t0: int | None = None  # token 0 (pairs record t_{j+1}; h_j also depends on t_0)
        self._last: Tensor | None = None

    # -- state ---------------------------------------------------------------------------------
    def prefix_limit(self, tokens: Sequence[int]) -> int:
        """Pairs still valid for ``tokens``: pair j needs t_0..t_{j+1} unchanged."""
        if not tokens or self._t0 != tokens[0]:
            return 0
        return self.cache.common_prefix(list(tokens[1:]))

    def begin(self, tokens: Sequence[int]) -> None:
        super().begin(tokens)
        self.cache.truncate(self.prefix_limit(self.tokens))
        self._t0 = self.tokens[0] if self.tokens else None
        self._last = None  # the prefill's commit brings fresh hidden states

    def commit(self, tokens_committed: Sequence[int], n_total: int, target: TargetOutput | None = None) -> None:
        super().commit(tokens_committed, n_total, target)
        if target is None or target.hidden is None:
            raise RuntimeError("the MTP drafter needs the target's hidden states at every commit")
        start = target.start
        if start > self.cache.length:
            raise RuntimeError(f"MTP head holds {self.cache.length} positions but the target resumed at {start}")
        self.cache.truncate(start)  # drop this round's speculative pairs
        end = len(self.tokens) - 1  # pairs start..end-1: every position whose successor is committed
        if end > start:
            g = self._pairs(start, target.hidden[: end - start], self.tokens[start + 1:end + 1])
            self._last = g[-1]
        if self._t0 is None and self.tokens:
            self._t0 = self.tokens[0]

    def reset(self) -> None:
        super().reset()
        self.cache.reset()
        self._t0, self._last = None, None

    # -- compute -------------------------------------------------------------------------------
    @torch.no_grad()
    def _pairs(self, start: int, hidden: Tensor, next_tokens: Sequence[int], chunk: int = 512) -> Tensor:
        """Run the head over pairs at positions start.. (writes its KV cache); return g [n, D]."""
        from engine.models.transformer import _Step

        outs = []
        for i in range(0, len(next_tokens), chunk):
            toks = [int(t) for t in next_tokens[i:i + chunk]]
            h = hidden[i:i + chunk]
            n, pos = len(toks), start + i
            ids = torch.tensor(toks, dtype=torch.long, device=self.device)
            e = self.embed(ids).to(self.dtype)
            if self.embed_scale is not None:
                e = e * torch.tensor(self.embed_scale, dtype=self.dtype)
            x = self.eh_proj(torch.cat([self.enorm(e), self.hnorm(h.to(self.dtype))], dim=-1))
            cos_sin = self.rope.get(pos, n, self.device, self.dtype)
            mask = None
            if n > 1:
                q = torch.arange(pos, pos + n, device=self.device)[:, None]
                mask = torch.arange(0, pos + n, device=self.device)[None, :] <= q
            step = _Step(pos, n, {"global": cos_sin, "local": cos_sin}, {"global": mask, "local": mask},
                         {"global": 0, "local": 0}, self.block_ops)
            self.cache.check_room(n)
            x = self.block(x, self.cache, step, self.rope)
            self.cache.commit(toks)
            outs.append(x)
        return torch.cat(outs)

    def _logits(self, g: Tensor) -> Tensor:
        return self.head(self.head_norm(g.reshape(1, -1))).float()

    def propose(self, k: int, ctx: DraftContext) -> Proposal:
        k = min(k, self.cache.capacity - self.cache.length + 1)
        if k <= 0 or self._last is None:
            return EMPTY
        g = self._last
        drafts: list[int] = []
        qs: list[Tensor | None] = []
        confs: list[float] = []
        for i in range(k):
            row = fit_vocab(self._logits(g), self.vocab_size)
            conf = confidence(row)
            if conf < ctx.p_min:
                break
            token, q = draw(row, self.tokens + drafts, ctx)
            drafts.append(token)
            qs.append(q)
            confs.append(conf)
            if i + 1 < k:  # chain: the head's own output stands in for the target's hidden state
                g = self._pairs(self.cache.length, g.reshape(1, -1), [token])[-1]
        return Proposal(drafts, stack(qs), confs)

    def memory_bytes(self) -> int:
        own = model_bytes(self.block) + model_bytes(self.eh_proj) + model_bytes(self.enorm) + \
            model_bytes(self.hnorm) + sum(model_bytes(m) for m in self._own_head)
        return own + self.cache.nbytes()
