"""The tokenizer worker process: tokenizes requests for the scheduler, detokenizes its tokens.

One PULL socket hears both sides: TokenizeMsg and AbortBackendMsg from the API server, batches of
DetokenizeMsg from the scheduler. Stop strings are matched here, on the text: a match ends the
request for the client at once and tells the scheduler to abort it and free its pages.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING


from minisgl.message import (
    AbortBackendMsg,
    BatchMsg,
    DetokenizeMsg,
    ExitMsg,
    ZmqPullQueue,
    ZmqPushQueue,
    ReplyMsg,
    StatusMsg,
    StatusRequestMsg,
    TokenizeMsg,
    UserMsg,
)
from minisgl.tokenizer.detokenize import IncrementalDetokenizer, StopMatcher
from minisgl.tokenizer.tokenize import TokenizeManager
from minisgl.utils import MinisglError, load_tokenizer

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass
class RequestState:
    """What the tokenizer worker keeps for one running request."""

    detokenizer: IncrementalDetokenizer
    stop: StopMatcher
    prompt_tokens: int
    completion_tokens: int = 0
    replied: bool = False  # the first reply goes out even if empty: the request was accepted


class TokenizerWorker:
    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, to_scheduler: ZmqPushQueue, to_api: ZmqPushQueue
    ) -> None:
        self.tokenizer = tokenizer
        self.tokenize_manager = TokenizeManager(tokenizer)
        self.to_scheduler = to_scheduler
        self.to_api = to_api
        self.requests: dict[int, RequestState] = {}

    def handle(self, msg: object) -> list[ReplyMsg]:
        """Act on one message; return the replies for the API server that it produced."""
        if isinstance(msg, TokenizeMsg):
            return self.start_request(msg)
        if isinstance(msg, BatchMsg):
            return [reply for item in msg.data for reply in self.handle(item)]
        if isinstance(msg, DetokenizeMsg):
            reply = self.detokenize(msg)
            return [reply] if reply is not None else []
        if isinstance(msg, AbortBackendMsg):  # the client left: forget it, free its pages
            self.requests.pop(msg.uid, None)
            self.to_scheduler.put(msg)
        elif isinstance(msg, StatusRequestMsg):
            self.to_scheduler.put(msg)
        elif isinstance(msg, StatusMsg):
            self.to_api.put(msg)
        return []

    def start_request(self, msg: TokenizeMsg) -> list[ReplyMsg]:
        try:
            input_ids = self.tokenize_manager.tokenize(msg)
        except MinisglError as error:
            return [ReplyMsg(msg.uid, "", error=str(error))]
        self.requests[msg.uid] = RequestState(
            IncrementalDetokenizer(self.tokenizer), StopMatcher(msg.stop), len(input_ids)
        )
        self.to_scheduler.put(UserMsg(msg.uid, input_ids, msg.sampling_params))
        return []

    def detokenize(self, msg: DetokenizeMsg) -> ReplyMsg | None:
        """The reply for one generated token (None if there is nothing to tell the client).

        Count the token, detokenize it (flushing at the end), pass the text through the stop
        matcher; a stop string ends the request ("stop") and aborts it in the scheduler. The
        first reply always goes out, even empty: it tells the API server the request runs.
        """
        state = self.requests.get(msg.uid)
        if state is None:  # aborted, or already stopped by a stop string
            return None
        if msg.error is not None:
            del self.requests[msg.uid]
            return ReplyMsg(msg.uid, "", error=msg.error)
        finish_reason = msg.finish_reason
        piece = ""
        if msg.token is not None:
            state.completion_tokens += 1
            piece = state.detokenizer.step(msg.token)
        if finish_reason is not None:
            piece += state.detokenizer.flush()
        text, stopped = state.stop.push(piece)
        if stopped:
            if finish_reason is None:  # the scheduler still runs it: free its pages now
                self.to_scheduler.put(AbortBackendMsg(msg.uid))
            finish_reason = "stop"
        elif finish_reason is not None:
            text += state.stop.flush()
        if not text and finish_reason is None and state.replied:
            return None
        state.replied = True
        if finish_reason is not None:
            del self.requests[msg.uid]
        return ReplyMsg(msg.uid, text, finish_reason, state.prompt_tokens, state.completion_tokens)

    def run(self, inbox: ZmqPullQueue) -> None:
        """Serve until an ExitMsg: one batch of replies to the API server per message."""
        while True:
            msg = inbox.get()
            if isinstance(msg, ExitMsg):
                return
            replies = self.handle(msg)
            if replies:
                self.to_api.put(BatchMsg(replies))


def run_tokenizer_worker(
    model_path: str, inbox_address: str, scheduler_address: str, api_address: str
) -> None:
    """The tokenizer process's main: load the tokenizer, then serve until told to exit."""
    inbox = ZmqPullQueue(inbox_address)
    to_scheduler, to_api = ZmqPushQueue(scheduler_address), ZmqPushQueue(api_address)
    try:
        TokenizerWorker(load_tokenizer(model_path), to_scheduler, to_api).run(inbox)
    finally:
        for queue in (inbox, to_scheduler, to_api):
            queue.close()
