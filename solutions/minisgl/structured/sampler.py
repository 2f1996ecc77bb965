"""Constrained sampling: each step, the logits of the tokens a request's grammar forbids go to
-inf before the sampler picks, so greedy and random sampling alike can only pick an allowed one.

Each constrained request has a GrammarMatcher (xgrammar) that advances with every token the
request accepts and answers, for the next step, a bitmask of the allowed tokens. That mask
depends on the token just sampled, which with overlap scheduling (chapter 11) the CPU has not
seen when the next batch is scheduled. So the mask is made inside `sample`, after the engine
launched the next forward: the CPU waits only for the previous batch's tokens (copied to the
host right behind their sampling), advances the matchers and fills the mask while the device
computes the forward, which the mask has to wait for anyway.

Every tensor-parallel rank samples the same tokens from the same logits, so every rank's
matchers take the same steps and make the same mask: nothing needs to be broadcast.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, NamedTuple
from weakref import WeakKeyDictionary

import torch

from minisgl.core import Batch, Req
from minisgl.engine import (
    BatchSamplingArgs,
    Engine,
    EngineExtension,
    Sampler,
)
from minisgl.scheduler.prefill import ChunkedReq
from minisgl.structured.params import StructuredParams
from minisgl.utils import load_tokenizer, make_device_tensor

# xgrammar is imported where a constrained request first needs it: loading it takes about half
# a second, and every engine has this sampler while most never see a constraint.
if TYPE_CHECKING:
    import xgrammar


@cache
def grammar_compiler(
    tokenizer_path: str, vocab_size: int, stop_token_ids: tuple[int, ...]
) -> xgrammar.GrammarCompiler:
    """Grammars compiled against one vocabulary, one compiler per process (cached: a schema
    that comes again is not compiled again). Made at the first constrained request: reading
    the vocabulary takes most of a second, which every later engine of the process saves."""
    import xgrammar

    tokenizer = load_tokenizer(tokenizer_path)
    info = xgrammar.TokenizerInfo.from_huggingface(
        tokenizer, vocab_size=vocab_size, stop_token_ids=list(stop_token_ids)
    )
    return xgrammar.GrammarCompiler(info)


@dataclass
class GrammarSamplingArgs(BatchSamplingArgs):
    """The batch's sampling arguments, and the grammar matcher of each constrained row."""

    matchers: dict[int, xgrammar.GrammarMatcher] = field(default_factory=dict)


class SampledTokens(NamedTuple):
    """The tokens the constrained rows of a batch sampled, on their way to the host."""

    matchers: list[xgrammar.GrammarMatcher]  # one per token, in the same order
    tokens: torch.Tensor  # [rows] on the host: valid once copy_done_event completes
    copy_done_event: torch.cuda.Event | None  # None on the CPU, where there is no copy


class GrammarSampler(Sampler):
    """A Sampler that masks the logits of constrained requests by their grammars."""

    def __init__(
        self,
        device: torch.device,
        vocab_size: int,
        seed: int,
        tokenizer_path: str,
        stop_token_ids: list[int],
    ) -> None:
        super().__init__(device, vocab_size, seed)
        self.tokenizer_path = tokenizer_path
        # The grammar may end the output only with the tokens the scheduler ends a request on.
        self.stop_token_ids = stop_token_ids
        # A request's matcher lives as long as the request (the scheduler drops it when done).
        self.matchers: WeakKeyDictionary[Req, xgrammar.GrammarMatcher] = WeakKeyDictionary()
        self.unaccepted: SampledTokens | None = None  # the last batch's, not yet accepted
        self.mask_seconds = 0.0  # time spent accepting tokens and filling masks
        self.masked_steps = 0  # steps that had at least one constrained row

    @property
    def compiler(self) -> xgrammar.GrammarCompiler:
        """Grammars compiled against this model's vocabulary (see `grammar_compiler`)."""
        return grammar_compiler(self.tokenizer_path, self.vocab_size, tuple(self.stop_token_ids))

    def matcher(
        self, params: StructuredParams, generated: Sequence[int] = ()
    ) -> xgrammar.GrammarMatcher:
        """A matcher of the grammar of `params` that has accepted the tokens `generated`
        already (none for a new request); RuntimeError if the grammar refuses one."""
        import xgrammar

        matcher = xgrammar.GrammarMatcher(self.compiler.compile_grammar(params.grammar()))
        for token in generated:
            if not matcher.accept_token(token):
                raise RuntimeError(f"the grammar refused token {token} that it had allowed")
        return matcher

    def prepare(self, batch: Batch) -> GrammarSamplingArgs:
        """The base class's arguments, plus the matcher of each row whose request samples a
        token under a constraint (its own, made at the request's first sampled token).

        A prompt chunk (ChunkedReq) samples nothing and gets no matcher; a request without a
        constraint neither. The matchers are kept in `self.matchers`, keyed by request, so the
        same request finds the same matcher at every step. A request may have generated tokens
        before this Req was made: one preempted and resumed (chapter 23) comes back as a new
        Req whose prompt ends with them, and whose `output_len` is what is left of max_tokens.
        Its matcher must go on after those `max_tokens - output_len` tokens, not start over.
        """
        args = super().prepare(batch)
        matchers: dict[int, xgrammar.GrammarMatcher] = {}
        for row, req in enumerate(batch.reqs):
            params = req.sampling_params
            if isinstance(params, StructuredParams) and not isinstance(req, ChunkedReq):
                if req not in self.matchers:
                    made = req.max_device_len - req.output_len  # its length when it was made
                    before = params.max_tokens - req.output_len  # generated by an earlier Req
                    generated = req.input_ids[made - before : made].tolist()
                    self.matchers[req] = self.matcher(params, generated)
                matchers[row] = self.matchers[req]
        return GrammarSamplingArgs(**vars(args), matchers=matchers)

    def accept_unaccepted(self) -> None:
        """Advance every matcher with the token its request sampled in the last batch.

        Wait for those tokens' copy (`copy_done_event`) first: the only wait for the device.
        A matcher that is terminated (its request sampled end-of-sequence, and overlap ran it
        once more) takes no token: that token is dropped by the scheduler. A token the grammar
        refuses is a bug of the mask: raise RuntimeError. Afterwards (even then) nothing is
        unaccepted.
        """
        if self.unaccepted is None:
            return
        (matchers, tokens, copy_done), self.unaccepted = self.unaccepted, None
        if copy_done is not None:
            copy_done.synchronize()
        for matcher, token in zip(matchers, tokens.tolist()):
            if not matcher.is_terminated() and not matcher.accept_token(token):
                raise RuntimeError(f"the grammar refused token {token} that its mask allowed")

    def fill_mask(self, matchers: dict[int, xgrammar.GrammarMatcher], rows: int) -> torch.Tensor:
        """The bitmask of a batch of `rows` rows: each row's allowed tokens, one bit a token.

        Rows without a matcher, or with a terminated one, allow every token (xgrammar's
        `allocate_token_bitmask` starts with all bits set); the others are filled by their
        matcher (`fill_next_token_bitmask`, at the row's index).
        """
        import xgrammar

        bitmask = xgrammar.allocate_token_bitmask(rows, self.vocab_size)
        for row, matcher in matchers.items():
            if not matcher.is_terminated():
                matcher.fill_next_token_bitmask(bitmask, row)
        return bitmask

    def keep_for_acceptance(self, tokens: torch.Tensor, args: GrammarSamplingArgs) -> None:
        """Start the copy of the constrained rows' tokens to the host, for the next step's
        `accept_unaccepted`; nothing when the batch had no constrained row."""
        if not args.matchers:
            return
        # From pinned memory, queued: a plain torch.tensor(..., device=...) would wait for
        # every forward queued on the device, and this batch's overlap would be lost.
        rows = make_device_tensor(list(args.matchers), torch.int64, tokens.device)
        picked = tokens[rows]
        if tokens.device.type == "cpu":
            self.unaccepted = SampledTokens(list(args.matchers.values()), picked, None)
            return
        host = torch.empty(picked.shape, dtype=picked.dtype, pin_memory=True)
        host.copy_(picked, non_blocking=True)
        copy_done = torch.cuda.Event()
        copy_done.record()
        self.unaccepted = SampledTokens(list(args.matchers.values()), host, copy_done)

    def sample(self, logits: torch.Tensor, args: GrammarSamplingArgs) -> torch.Tensor:
        """Sample one token per row, constrained rows only among what their grammar allows.

        First accept the last batch's tokens (`accept_unaccepted`); then, if the batch has
        constrained rows, fill their mask (`fill_mask`), copy it to the logits' device and set
        the forbidden logits to -inf (`xgrammar.apply_token_bitmask_inplace`, on those rows
        only); then sample as the base class does, and keep the constrained rows' tokens for
        the next step (`keep_for_acceptance`). Time the accepting and the mask in
        `mask_seconds`, and count the steps with a constrained row in `masked_steps`.
        """
        start = time.perf_counter()
        self.accept_unaccepted()
        if args.matchers:
            import xgrammar

            bitmask = self.fill_mask(args.matchers, logits.shape[0])
            xgrammar.apply_token_bitmask_inplace(
                logits,
                make_device_tensor(bitmask, torch.int32, logits.device),
                indices=list(args.matchers),
            )
            self.masked_steps += 1
        self.mask_seconds += time.perf_counter() - start
        tokens = super().sample(logits, args)
        self.keep_for_acceptance(tokens, args)
        return tokens


def use_grammar_sampler(engine: Engine) -> None:
    """Replace the engine's sampler by one that follows each request's grammar."""
    engine.sampler = GrammarSampler(
        engine.device,
        engine.model_config.vocab_size,
        engine.config.seed,
        engine.config.model_path,
        list(engine.model_config.eos_token_ids),
    )


GRAMMAR_SAMPLER = EngineExtension(finish=use_grammar_sampler)
