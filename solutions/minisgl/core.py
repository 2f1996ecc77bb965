"""The engine's vocabulary: sampling parameters, a request's ledger, a batch, and the context.

Everything else in minisgl passes these four types around. They hold no policy: the scheduler
decides what goes into a batch, the engine runs it, and both read and update the ledger.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator, Literal

import torch

from minisgl.utils import InvalidRequestError

if TYPE_CHECKING:
    from minisgl.attention.base import BaseAttnBackend
    from minisgl.kvcache.base import BaseCacheHandle, BaseKVCachePool


@dataclass
class SamplingParams:
    """How to pick each next token of one request, and when to stop.

    temperature 0 means greedy (argmax). top_k = -1 means no top-k limit; top_p = 1.0 means no
    nucleus limit. max_tokens counts generated tokens, the first one (from prefill) included.
    A seed makes random sampling reproducible: a seeded request's draw depends on its seed, its
    position and its own logits, never on the other requests of the batch or on the engine's
    generator. Its logits may differ in their last bits from batch to batch (a batched matrix
    product sums in an order that depends on the batch's shape), so the same seed and prompt
    give the same tokens in the same batch, and in another batch unless a draw falls within
    that noise of a boundary (two nearly equal probabilities at the edge of top_p, say).
    Stop strings are not the engine's business: the detokenizer, which sees text, handles them.
    """

    temperature: float = 0.0
    top_k: int = -1
    top_p: float = 1.0
    max_tokens: int = 128
    ignore_eos: bool = False
    seed: int | None = None

    def __post_init__(self) -> None:
        """Reject out-of-range values with an InvalidRequestError that names the field."""
        if self.max_tokens <= 0:
            raise InvalidRequestError(f"max_tokens must be positive, got {self.max_tokens}")
        if self.temperature < 0:
            raise InvalidRequestError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k != -1 and self.top_k < 1:
            raise InvalidRequestError(f"top_k must be -1 (off) or >= 1, got {self.top_k}")
        if self.seed is not None and self.seed < 0:
            raise InvalidRequestError(f"seed must be None or >= 0, got {self.seed}")

    @property
    def is_greedy(self) -> bool:
        """Greedy when temperature is 0, or when top_k == 1 leaves a single candidate."""
        return self.temperature == 0.0 or self.top_k == 1


@dataclass(eq=False)
class Req:
    """One request, as a ledger of three lengths over its token sequence.

    The sequence is the prompt followed by the tokens generated so far (`input_ids`, on the CPU).

    - `cached_len`: tokens whose K/V are already in the KV cache (computed, or reused from the
      prefix cache).
    - `device_len`: tokens the device knows about; the next forward computes K/V for positions
      [cached_len, device_len) and samples the token at position device_len.
    - `max_device_len`: prompt length + max_tokens; the request is done when it gets there.

    Invariant (checked on creation): 0 <= cached_len < device_len <= max_device_len. A forward
    always has at least one token to compute, which is why a prefix-cache match must stop before
    the last prompt token. Everything else is derived, so no two fields can disagree.
    """

    input_ids: torch.Tensor  # 1-D int32 on the CPU: prompt, then generated tokens
    table_idx: int  # this request's row in the page table and token pool
    cached_len: int
    output_len: int  # max_tokens: how many tokens to generate at most
    uid: int
    sampling_params: SamplingParams
    cache_handle: BaseCacheHandle | None = None  # the prefix-cache node this request holds

    def __post_init__(self) -> None:
        """Derive device_len and max_device_len; raise ValueError if the invariant fails.

        Then move the sequence into a buffer with room for all max_device_len tokens, so that
        `append_host` writes in place: `input_ids` is a view of its first tokens.
        """
        self.device_len = len(self.input_ids)
        self.max_device_len = len(self.input_ids) + self.output_len
        if not 0 <= self.cached_len < self.device_len <= self.max_device_len:
            raise ValueError(
                "a request's ledger must satisfy 0 <= cached_len < device_len "
                f"<= max_device_len: {self}"
            )
        self._host_buffer = torch.empty(
            self.max_device_len, dtype=self.input_ids.dtype, device="cpu"
        )
        self._host_buffer[: self.device_len] = self.input_ids
        self.input_ids = self._host_buffer[: self.device_len]
        # The same memory seen by NumPy: writing one element there costs a tenth of indexing
        # a tensor, and append_host does it for every request at every step.
        self._host_numpy = self._host_buffer.numpy()
        self._host_len = self.device_len  # len(input_ids), without asking the tensor

    @property
    def extend_len(self) -> int:
        """Tokens the next forward computes: the whole uncached prompt, or 1 when decoding."""
        return self.device_len - self.cached_len

    @property
    def remain_len(self) -> int:
        """Tokens still to generate before max_tokens is reached."""
        return self.max_device_len - self.device_len

    @property
    def can_decode(self) -> bool:
        """True while the request has tokens left to generate (remain_len > 0)."""
        return self.remain_len > 0

    def complete_one(self) -> None:
        """Record a finished forward: its K/V are cached and one more token was sampled."""
        self.cached_len = self.device_len
        self.device_len += 1

    def append_host(self, next_token: int) -> None:
        """Append the sampled token to the CPU copy of the sequence.

        Write it into the buffer after the last token and widen the view over it by one:
        no copy of the sequence (torch.cat would copy all of it, at every step of every
        request). The buffer ends at max_device_len, past which no request generates.
        """
        length = self._host_len
        if length == self.max_device_len:
            raise ValueError(f"no room for another token: {self}")
        self._host_numpy[length] = next_token
        self._host_len = length + 1
        self.input_ids = self._host_buffer[: length + 1]

    def __repr__(self) -> str:
        return (
            f"Req(uid={self.uid}, table_idx={self.table_idx}, cached_len={self.cached_len}, "
            f"device_len={self.device_len}, max_device_len={self.max_device_len})"
        )


@dataclass
class Batch:
    """The requests of one forward pass: either all prefill or all decode.

    The scheduler (or, in stage 1, you by hand) fills `input_ids`, `positions` and `out_loc`;
    the attention backend fills `attn_metadata` in `prepare_metadata`.
    """

    reqs: list[Req]
    phase: Literal["prefill", "decode"]
    input_ids: torch.Tensor = field(init=False)  # [num_tokens] token ids of this step
    positions: torch.Tensor = field(init=False)  # [num_tokens] position of each token
    out_loc: torch.Tensor = field(init=False)  # [num_tokens] KV-pool slot of each new token
    attn_metadata: Any = field(init=False)

    @property
    def is_prefill(self) -> bool:
        return self.phase == "prefill"

    @property
    def is_decode(self) -> bool:
        return self.phase == "decode"

    @property
    def size(self) -> int:
        return len(self.reqs)


@dataclass
class Context:
    """What every layer may need during a forward, without threading it through each call.

    The engine builds one Context and activates it for the duration of each forward with
    `forward_batch`; layers read it with `get_global_ctx()`. The page table stores one KV-pool
    slot per token, whatever the page size.
    """

    page_size: int
    kv_cache: BaseKVCachePool
    page_table: torch.Tensor  # [rows, max_seq_len] int32: KV-pool slot of each token
    attn_backend: BaseAttnBackend
    _batch: Batch | None = field(default=None, init=False)

    @property
    def batch(self) -> Batch:
        if self._batch is None:
            raise RuntimeError("no batch is running: layers can only run inside forward_batch")
        return self._batch

    @contextmanager
    def forward_batch(self, batch: Batch) -> Iterator[Batch]:
        """Make this context the active one and `batch` its current batch, for one forward."""
        global _ACTIVE_CTX
        if self._batch is not None or _ACTIVE_CTX is not None:
            raise RuntimeError("forward_batch cannot be nested")
        self._batch, _ACTIVE_CTX = batch, self
        try:
            yield batch
        finally:
            self._batch, _ACTIVE_CTX = None, None


_ACTIVE_CTX: Context | None = None


def get_global_ctx() -> Context:
    """The context of the forward now running (several engines may live in one process)."""
    if _ACTIVE_CTX is None:
        raise RuntimeError("no forward is running: call layers inside Context.forward_batch")
    return _ACTIVE_CTX
