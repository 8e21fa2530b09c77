"""Token sampling: Ollama options -> filtered, renormalised distributions -> seeded draws.

Torch, no model code (a greedy row's argmax is one native pass where the kernels are built:
``engine/ops/kernels/logits.cpp``). One call processes ``n`` rows of logits at once so that a speculative
verification batch (``[t_last, d_1..d_k]`` -> ``p_1..p_{k+1}``) is filtered in one go.

Pipeline, in this order (docs/speculation.md, "Sampling pipeline"):

1. penalties  (repeat / presence / frequency over the last ``repeat_last_n`` tokens; row ``i`` of a
   verification batch sees ``history + inflight[:i]``, i.e. drafts in flight count as history)
2. top-k      (``top_k <= 0`` or ``>= vocab`` disables it; ties at the boundary -> lowest token ids)
3. temperature + softmax over the surviving candidates
4. typical-p  (only if ``typical_p < 1``; llama.cpp places it next to top-p, so do we: just before it)
5. top-p      (smallest prefix of the probability-sorted candidates whose sum is >= top_p; >= 1 token)
6. min-p      (drop ``p < min_p * p_max``; ``p_max`` is the post-temperature maximum)
7. renormalise
8. categorical draw by inverse CDF with one uniform from the request's generator per row.

Temperature <= 0 or ``top_k == 1`` is a point mass on the argmax of the penalised logits (ties ->
lowest token id), with no filtering at all.

Randomness contract (shared with ``engine.speculative.acceptance``)
-------------------------------------------------------
* The request generator is a CPU ``torch.Generator`` (``make_generator``). Every random decision
  draws float64 uniforms from it via ``draw_uniforms`` -- never ``torch.multinomial``, whose
  generator consumption is an implementation detail. Drawing ``n`` uniforms at once or one at a
  time yields the same numbers, so only the *count* matters.
* ``Distribution.sample`` consumes exactly one uniform per row, point masses included.
* A draw maps a uniform ``u`` to a token by inverse CDF over the nonzero probabilities in
  increasing token id (``sample_from_probs``). ``Distribution.sample`` and the acceptance rules use
  that same function, so a speculation round with depth 0 is bit-identical to a plain decode step.
* Reproducibility: the same seed, options, prompt and engine (bit-identical logits) reproduce the
  same output. At temperature 0 the output does not depend on the generator at all, so it is the
  same with or without speculation under a lossless rule. At temperature > 0, speculation (any
  depth > 0) consumes uniforms differently from plain decoding (see ``engine.speculative.acceptance``), so the
  sampled text differs from a non-speculative run with the same seed -- only its *distribution* is
  the same (strict / match rules). A speculative run is reproducible only if the depth sequence is
  (a fixed schedule; an adaptive one depends on wall-clock timings) and the drafter samples from
  its own generator (``make_generator(seed, stream=1)``). Batched and single-token forwards may
  differ in the last bits of the logits, which can flip near-ties even at temperature 0.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from functools import cache, cached_property
from typing import Sequence

import torch
from torch import Tensor

from engine.contract.options import Options

__all__ = [
    "SamplingOptions",
    "Distribution",
    "make_generator",
    "derive_seed",
    "draw_uniforms",
    "sample_from_probs",
    "apply_penalties",
    "argmax_lowest_id",
    "process",
]

_MASK64 = (1 << 64) - 1


# ----------------------------------------------------------------------------------------------
# Options
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SamplingOptions:
    """Sampler settings under Ollama's option names (defaults as given in the tandem brief)."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.9
    min_p: float = 0.0
    typical_p: float = 1.0
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # Already resolved by from_options: -1 became num_ctx. 0 disables the penalties. A raw negative
    # value reaching the pipeline means "the whole history".
    repeat_last_n: int = 64
    seed: int = -1

    @classmethod
    def from_options(cls, options: Options, num_ctx: int | None = None) -> "SamplingOptions":
        """The sampler's share of a request's options (same names, already typed and validated).

        ``repeat_last_n = -1`` means the context size: ``num_ctx`` (the context the request
        actually gets) if given, else ``options.num_ctx``.
        """
        values = {f.name: getattr(options, f.name) for f in fields(cls)}
        if values["repeat_last_n"] < 0:
            values["repeat_last_n"] = num_ctx if num_ctx is not None else options.num_ctx
        return cls(**values)

    @property
    def greedy(self) -> bool:
        """Point mass on the argmax: temperature 0 (Ollama/llama.cpp meaning) or top_k == 1."""
        return self.temperature <= 0.0 or self.top_k == 1

    @property
    def penalties_active(self) -> bool:
        return self.repeat_last_n != 0 and (
            self.repeat_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
        )


# ----------------------------------------------------------------------------------------------
# Randomness
# ----------------------------------------------------------------------------------------------


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def derive_seed(seed: int, stream: int) -> int:
    """An independent 64-bit seed for sub-stream ``stream`` of ``seed`` (stream 0 is ``seed``).

    The drafter must not share the target's generator, or its draws would shift the target's
    uniforms; stream 1 is the conventional drafter stream.
    """
    if stream == 0:
        return seed & _MASK64
    return _splitmix64((seed & _MASK64) ^ _splitmix64(stream & _MASK64))


def make_generator(seed: int, *, stream: int = 0) -> torch.Generator:
    """A CPU generator for one request. ``seed < 0`` (Ollama's -1) -> a fresh random seed.

    CPU on purpose: uniforms are tiny, and a CPU stream is identical whatever device the model runs
    on, so a seed means the same thing on CPU and GPU.
    """
    if seed < 0:
        seed = int.from_bytes(os.urandom(8), "little")
    gen = torch.Generator(device="cpu")
    gen.manual_seed(derive_seed(seed, stream))
    return gen


def draw_uniforms(generator: torch.Generator, n: int) -> list[float]:
    """``n`` float64 uniforms in [0, 1). The only way the engine consumes a generator."""
    if n <= 0:
        return []
    return torch.rand(n, generator=generator, dtype=torch.float64, device=generator.device).tolist()


def sample_from_probs(probs: Tensor, u: float, ids: Tensor | None = None) -> int:
    """Inverse-CDF draw from a probability row (need not be normalised) with uniform ``u``.

    The CDF runs over the *nonzero* entries in increasing token id (``ids[j]`` is the token of
    ``probs[j]``; default ``arange``), accumulated in float64 on the CPU. A dense row and a sparse
    row with the same nonzero (id, value) pairs therefore give the same token for the same ``u``.
    Tokens with probability 0 can never be drawn.
    """
    probs = probs.reshape(-1)
    mask = probs > 0
    nz = torch.nonzero(mask).reshape(-1)
    if nz.numel() == 0:
        raise ValueError("cannot sample from an all-zero probability row")
    weights = probs[nz].to(device="cpu", dtype=torch.float64)
    tokens = (ids.reshape(-1)[nz] if ids is not None else nz).cpu()
    cdf = torch.cumsum(weights, 0)
    target = torch.tensor([u * cdf[-1].item()], dtype=torch.float64)
    # right=True: the first j with cdf[j] > u*total, so a zero-width step is never chosen.
    j = int(torch.searchsorted(cdf, target, right=True).item())
    return int(tokens[min(j, tokens.numel() - 1)].item())


# ----------------------------------------------------------------------------------------------
# Distribution
# ----------------------------------------------------------------------------------------------


@dataclass
class Distribution:
    """Filtered, renormalised next-token distributions for ``n`` rows.

    Stored sparsely: ``cand_ids[i]`` are the candidates that survived top-k (ascending token id) and
    ``cand_probs[i]`` their final probabilities (0 for those later removed by typical/top-p/min-p).
    ``probs`` materialises the dense ``[n, vocab]`` rows on demand.
    """

    cand_ids: Tensor  # [n, m] int64, ascending per row
    cand_probs: Tensor  # [n, m] float32, rows sum to 1
    raw_logits: Tensor  # [n, vocab] float32, after penalties, before any filter
    vocab_size: int
    greedy: bool = False

    @property
    def n(self) -> int:
        return self.cand_ids.shape[0]

    @cached_property
    def probs(self) -> Tensor:
        """Dense ``[n, vocab]`` probabilities (exact zeros for filtered tokens)."""
        dense = torch.zeros(self.n, self.vocab_size, dtype=self.cand_probs.dtype, device=self.cand_probs.device)
        return dense.scatter_(1, self.cand_ids, self.cand_probs)

    def prob(self, row: int, token: int) -> float:
        hit = self.cand_ids[row] == token
        return float(self.cand_probs[row][hit].sum().item())

    def pool_size(self, row: int) -> int:
        """Number of candidates left after every filter (what the relaxed rule ranks within)."""
        return int((self.cand_probs[row] > 0).sum().item())

    def argmax(self) -> Tensor:
        """``[n]`` most probable token per row (ties -> lowest id)."""
        return argmax_lowest_id(self.cand_probs, self.cand_ids)

    def sample(self, generator: torch.Generator) -> Tensor:
        """One token per row, ``[n]`` int64. Consumes exactly ``n`` uniforms, row order."""
        us = draw_uniforms(generator, self.n)
        out = [sample_from_probs(self.cand_probs[i], us[i], self.cand_ids[i]) for i in range(self.n)]
        return torch.tensor(out, dtype=torch.int64)

    # -- API log probabilities ------------------------------------------------------------------

    @cached_property
    def raw_logprobs(self) -> Tensor:
        """``[n, vocab]`` log-softmax of the raw (penalised, unfiltered, temperature-free) logits:
        what Ollama / llama.cpp report as logprobs."""
        return torch.log_softmax(self.raw_logits.float(), dim=-1)

    def logprob(self, row: int, token: int) -> float:
        return float(self.raw_logprobs[row, token].item())

    def top_logprobs(self, row: int, k: int) -> list[tuple[int, float]]:
        """The ``k`` best ``(token, logprob)`` of the raw logits, best first, ties by lowest id."""
        k = max(0, min(k, self.vocab_size))
        if k == 0:
            return []
        lp = self.raw_logprobs[row]
        vals, ids = torch.topk(lp, k)
        ids, vals = _order_desc(ids.unsqueeze(0), vals.unsqueeze(0))
        return [(int(t), float(v)) for t, v in zip(ids[0].tolist(), vals[0].tolist())]


# ----------------------------------------------------------------------------------------------
# Pipeline stages
# ----------------------------------------------------------------------------------------------


# Values per block in the first pass of a wide row's argmax (``_wide_argmax``).
_ARGMAX_BLOCK = 2048


@cache
def _row_ops():
    from engine.ops.kernels import load_block_ops

    return load_block_ops()


def native_row_ops(values: Tensor):
    """The native row reductions (``engine/ops/kernels/logits.cpp``) when they can take ``values``
    (float32 [n, V] rows on the CPU, each contiguous) and the kernels are built, else None."""
    if values.dim() != 2 or values.dtype != torch.float32 or values.device.type != "cpu" or values.stride(-1) != 1:
        return None
    return _row_ops()


def argmax_lowest_id(values: Tensor, ids: Tensor | None = None) -> Tensor:
    """Row-wise argmax returning the lowest token id among ties (not relying on kernel tie order)."""
    if ids is None and values.dim() == 2 and values.shape[-1] >= 2 * _ARGMAX_BLOCK:
        ops = native_row_ops(values)
        if ops is None:
            wide = _wide_argmax(values)
            if wide is not None:
                return wide
        else:
            at = ops.logits_argmax(values)
            if min(at.tolist()) >= 0:  # -1: a row holding NaN, which the general path below decides
                return at
    # Narrower rows (candidates) and rows with NaN: the common case first, every row's maximum unique, so
    # whichever index the kernel returns is the answer. Rows with ties, NaN or nothing but -inf take the
    # exact path below.
    pos = values.argmax(dim=-1, keepdim=True)
    if bool(((values == values.gather(-1, pos)).sum(dim=-1) == 1).all()):
        return (pos if ids is None else ids.gather(-1, pos)).squeeze(-1)
    # amax/amin, not max/min(dim): those also build indices and are far slower on small rows.
    return _lowest_where(values == values.amax(dim=-1, keepdim=True), ids)


def _lowest_where(hit: Tensor, ids: Tensor | None = None) -> Tensor:
    """Per row, the lowest of ``ids`` (default: the positions) where ``hit`` holds; int64 max where none."""
    if ids is None:
        ids = torch.arange(hit.shape[-1], device=hit.device).expand_as(hit)
    return torch.where(hit, ids, torch.full_like(ids, torch.iinfo(torch.int64).max)).amin(dim=-1)


def _wide_argmax(values: Tensor) -> Tensor | None:
    """``argmax_lowest_id`` of rows over a whole vocabulary, from maxima only: each block's maximum
    (``amax`` is vectorised, while ``argmax`` tracks an index per lane and is an order of magnitude slower
    over 152k logits), the row's maximum, the first block that holds it, and the first position in that
    block that does. None when a row holds NaN (no maximum to find: the general path decides)."""
    n, v = values.shape
    blocks = v // _ARGMAX_BLOCK
    block_max = values[:, :blocks * _ARGMAX_BLOCK].reshape(n, blocks, _ARGMAX_BLOCK).amax(-1)
    if v > blocks * _ARGMAX_BLOCK:  # the tail is a block of its own
        block_max = torch.cat([block_max, values[:, blocks * _ARGMAX_BLOCK:].amax(-1, keepdim=True)], dim=1)
    row_max = block_max.amax(-1, keepdim=True)
    if bool(torch.isnan(row_max).any()):
        return None
    # each row's first block holding its maximum, gathered (a short tail block repeats its last index)
    at = _lowest_where(block_max == row_max).unsqueeze(-1) * _ARGMAX_BLOCK + \
        torch.arange(_ARGMAX_BLOCK, device=values.device)
    at = at.clamp_(max=v - 1)
    return _lowest_where(values.gather(-1, at) == row_max, at)


def _order_desc(ids: Tensor, vals: Tensor) -> tuple[Tensor, Tensor]:
    """Sort rows by value descending, ties by ascending id (a total, device-independent order)."""
    by_id = torch.argsort(ids, dim=-1, stable=True)
    ids, vals = ids.gather(-1, by_id), vals.gather(-1, by_id)
    by_val = torch.argsort(vals, dim=-1, descending=True, stable=True)
    return ids.gather(-1, by_val), vals.gather(-1, by_val)


def _windows(history: Sequence[int], inflight: Sequence[int], n: int, last_n: int) -> list[list[int]]:
    """Penalty window of each row: the last ``last_n`` of ``history + inflight[:i]``."""
    hist = list(history[-last_n:]) if last_n > 0 else list(history)  # slice first: O(window)
    seq = hist + [int(t) for t in inflight[: max(0, n - 1)]]
    out = []
    for i in range(n):
        end = len(hist) + i
        start = max(0, end - last_n) if last_n > 0 else 0
        out.append(seq[start:end])
    return out


def apply_penalties(
    logits: Tensor, history: Sequence[int], inflight: Sequence[int], opts: SamplingOptions
) -> Tensor:
    """Repeat / presence / frequency penalties, llama.cpp semantics, per row. Returns a new tensor.

    For each distinct token in the row's window: ``logit / repeat_penalty`` if the logit is
    positive else ``logit * repeat_penalty``; then ``- count * frequency_penalty - presence_penalty``.
    Only the (row, token) pairs present are touched, so this is O(window), not O(vocab).
    """
    if not opts.penalties_active:
        return logits
    n, vocab = logits.shape
    rows: list[int] = []
    toks: list[int] = []
    for i, window in enumerate(_windows(history, inflight, n, opts.repeat_last_n)):
        for t in window:
            if 0 <= t < vocab:  # ids beyond the logits (added special tokens) cannot be penalised
                rows.append(i)
                toks.append(t)
    out = logits.clone()
    if not toks:
        return out
    keys = torch.tensor(rows, dtype=torch.int64) * vocab + torch.tensor(toks, dtype=torch.int64)
    keys, counts = torch.unique(keys, return_counts=True)
    keys = keys.to(out.device)
    counts = counts.to(device=out.device, dtype=out.dtype)
    flat = out.view(-1)
    v = flat[keys]
    if opts.repeat_penalty != 1.0:
        v = torch.where(v > 0, v / opts.repeat_penalty, v * opts.repeat_penalty)
    v = v - counts * opts.frequency_penalty - opts.presence_penalty
    flat[keys] = v
    return out


def _top_k(raw: Tensor, k: int, need_order: bool = True) -> tuple[Tensor, Tensor]:
    """The ``k`` best logits per row as ``(ids, logits)`` sorted by logit desc, ties by id.

    With top-k disabled every token is a candidate; the full-vocab sort then happens only if a later
    stage (typical-p, top-p) needs the order.

    ``torch.topk`` picks an arbitrary subset of tokens tied at the k-th value; one extra O(vocab)
    comparison detects that case and then keeps the lowest ids, so the set is deterministic.
    """
    n, vocab = raw.shape
    if k <= 0 or k >= vocab:
        ids = torch.arange(vocab, device=raw.device).expand(n, vocab)
        return _order_desc(ids, raw) if need_order else (ids, raw)
    vals, ids = torch.topk(raw, k, dim=-1)
    thr = vals[:, -1:]
    if bool(((raw >= thr).sum(-1) > k).any()):
        gt = raw > thr
        eq = raw == thr
        need = k - gt.sum(-1, keepdim=True)
        keep = gt | (eq & (eq.cumsum(-1) <= need))
        ids = torch.nonzero(keep)[:, 1].reshape(n, k)  # row-major -> ascending ids per row
        vals = raw.gather(1, ids)
    return _order_desc(ids, vals)


def _typical(probs: Tensor, typical_p: float) -> Tensor:
    """Locally typical sampling (Meister et al.; llama.cpp's typ_p): keep the tokens whose
    surprisal is closest to the entropy until their mass reaches ``typical_p``."""
    logp = torch.where(probs > 0, probs.log(), torch.full_like(probs, float("-inf")))
    entropy = -(torch.where(probs > 0, probs * logp, torch.zeros_like(probs))).sum(-1, keepdim=True)
    shifted = (-logp - entropy).abs()  # inf for zero-probability entries -> sorted last
    order = torch.argsort(shifted, dim=-1, stable=True)
    p_sorted = probs.gather(-1, order)
    keep_sorted = (torch.cumsum(p_sorted, -1) - p_sorted) < typical_p
    keep_sorted[:, 0] = True
    keep = torch.zeros_like(keep_sorted).scatter_(-1, order, keep_sorted)
    return torch.where(keep, probs, torch.zeros_like(probs))


def _top_p(probs_desc: Tensor, top_p: float) -> Tensor:
    """Keep the smallest probability-ordered prefix whose sum is >= top_p (at least one token).

    ``probs_desc`` is in descending-probability order except for entries already zeroed by
    typical-p, which contribute nothing to the running sum and stay zero.
    """
    excl = torch.cumsum(probs_desc, -1) - probs_desc  # mass strictly before each token
    keep = excl < top_p
    first = torch.argmax(probs_desc, dim=-1, keepdim=True)  # the best survivor always stays
    keep.scatter_(-1, first, True)
    return torch.where(keep, probs_desc, torch.zeros_like(probs_desc))


def _min_p(probs: Tensor, min_p: float) -> Tensor:
    p_max = probs.amax(dim=-1, keepdim=True)
    keep = probs >= min_p * p_max
    keep.scatter_(-1, torch.argmax(probs, dim=-1, keepdim=True), True)
    return torch.where(keep, probs, torch.zeros_like(probs))


def process(
    logits: Tensor,
    history: Sequence[int],
    inflight: Sequence[int] = (),
    opts: SamplingOptions | None = None,
) -> Distribution:
    """Run the whole pipeline over ``logits [n, vocab]`` (or ``[vocab]``).

    ``history`` is the committed token log (whatever the caller wants penalised: Ollama includes
    the prompt); ``inflight`` the ``n - 1`` drafted tokens of a verification batch. Row ``i`` is
    penalised as if ``history + inflight[:i]`` had been committed.
    """
    opts = opts or SamplingOptions()
    if logits.dim() == 1:
        logits = logits.unsqueeze(0)
    if logits.dim() != 2:
        raise ValueError(f"logits must be [n, vocab], got {tuple(logits.shape)}")
    n, vocab = logits.shape
    if len(inflight) != n - 1:
        raise ValueError(f"{n} rows need {n - 1} in-flight tokens, got {len(inflight)}")
    raw = apply_penalties(logits.float(), history, inflight, opts)

    if opts.greedy:
        ids = argmax_lowest_id(raw).unsqueeze(-1)
        ones = torch.ones(n, 1, dtype=torch.float32, device=raw.device)
        return Distribution(ids, ones, raw, vocab, greedy=True)

    # From here on rows are in descending-logit order (ties by id) whenever a stage needs it.
    ids, vals = _top_k(raw, opts.top_k, need_order=opts.top_p < 1.0 or opts.typical_p < 1.0)
    scaled = vals / opts.temperature
    if torch.isposinf(scaled).any():
        # A tiny temperature (1e-45 is a valid float32) overflows the division and softmax gives NaN;
        # shifted by the row maximum first, the best logit stays finite. Only then: the usual path
        # keeps its exact rounding.
        scaled = (vals - vals.amax(-1, keepdim=True)) / opts.temperature
    probs = torch.softmax(scaled, dim=-1)
    if opts.typical_p < 1.0:
        probs = _typical(probs, opts.typical_p)
        probs = probs / probs.sum(-1, keepdim=True)  # top-p measures mass among survivors
    if opts.top_p < 1.0:
        probs = _top_p(probs, opts.top_p)
    if opts.min_p > 0.0:
        probs = _min_p(probs, opts.min_p)
    probs = probs / probs.sum(-1, keepdim=True)

    by_id = torch.argsort(ids, dim=-1)
    return Distribution(ids.gather(-1, by_id).contiguous(), probs.gather(-1, by_id).contiguous(), raw, vocab)
