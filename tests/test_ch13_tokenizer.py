"""Chapter 13 tests: prompts to token ids (chat template included), incremental
detokenization (a property test over many random token sequences), and stop strings. They use
SmolLM2's tokenizer: byte-level BPE, where one character can span several tokens."""

from __future__ import annotations

import copy
import random

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from conftest import SMOLLM2, load_tokenizer, require_model

from course.differential import assert_same_call, reference_function, use_reference_stubs
from minisgl.core import SamplingParams
from minisgl.message import AbortBackendMsg, DetokenizeMsg, ReplyMsg, TokenizeMsg, UserMsg
from minisgl.tokenizer import IncrementalDetokenizer, StopMatcher, TokenizeManager
from minisgl.tokenizer.server import TokenizerWorker
from minisgl.utils import InvalidRequestError

TEXTS = [
    "The capital of France is Paris.",
    "Grüße aus Köln: Straße, Äpfel, naïve café.",
    "東京の天気は晴れです。北京欢迎你！",
    "Ελληνικά, русский текст и हिन्दी भाषा",
    "Emoji 🙂👍🏽🎉 and a family 👨‍👩‍👧 in one line.",
    "def f(x):\n    return x ** 2  # 平方\n",
]
RANDOM_SEQUENCES = 400


@pytest.fixture(scope="module")
def tokenizer():  # noqa: ANN201 - a transformers tokenizer
    return load_tokenizer(require_model(SMOLLM2))


def detokenize_all(tokenizer, ids: list[int]) -> list[str]:  # noqa: ANN001
    """Every piece a fresh detokenizer emits for `ids`, the final flush included."""
    detokenizer = IncrementalDetokenizer(tokenizer)
    return [detokenizer.step(token) for token in ids] + [detokenizer.flush()]


def test_pieces_of_real_text_are_whole_characters_and_join_to_the_text(tokenizer) -> None:  # noqa: ANN001
    for text in TEXTS:
        ids = tokenizer.encode(text)
        pieces = detokenize_all(tokenizer, ids)
        assert "".join(pieces) == tokenizer.decode(ids) == text
        assert not any("\ufffd" in piece for piece in pieces), pieces


def test_an_emoji_split_over_tokens_appears_only_when_complete(tokenizer) -> None:  # noqa: ANN001
    ids = tokenizer.encode("👍🏽")
    assert len(ids) > 2  # several byte-level tokens
    pieces = detokenize_all(tokenizer, ids)
    assert pieces[0] == ""  # the first token is half a character: nothing to show yet
    assert "".join(pieces) == "👍🏽"


def test_random_token_sequences_join_to_the_full_decode(tokenizer) -> None:  # noqa: ANN001
    """The property: for any tokens, the pieces concatenate to the decode of all of them, and
    no piece but the last ends inside a character (ends with U+FFFD)."""
    rng = random.Random(1234)
    corpus = [tokenizer.encode(text) for text in TEXTS]
    for _ in range(RANDOM_SEQUENCES):
        if rng.random() < 0.5:  # any ids at all: invalid UTF-8 included
            ids = [rng.randrange(len(tokenizer)) for _ in range(rng.randint(1, 40))]
        else:  # a slice of real multilingual text, maybe cut inside a character
            source = rng.choice(corpus)
            start = rng.randrange(len(source))
            ids = source[start : start + rng.randint(1, 30)]
        pieces = detokenize_all(tokenizer, ids)
        assert "".join(pieces) == tokenizer.decode(ids, skip_special_tokens=True), ids
        assert not any(piece.endswith("\ufffd") for piece in pieces[:-1]), (ids, pieces)


def test_special_tokens_are_not_shown(tokenizer) -> None:  # noqa: ANN001
    ids = tokenizer.encode("Hello there") + [tokenizer.eos_token_id]
    assert "".join(detokenize_all(tokenizer, ids)) == "Hello there"


# --- stop strings --------------------------------------------------------------------------


def test_stop_string_split_across_pieces_is_found_and_never_shown() -> None:
    matcher = StopMatcher(["</end>"])
    shown = []
    for piece in ["The answer", " is 4", ".</", "en", "d> and more"]:
        text, stopped = matcher.push(piece)
        shown.append(text)
        if stopped:
            break
    assert stopped
    assert "".join(shown) == "The answer is 4."
    assert all("<" not in text for text in shown)


def test_text_held_back_as_a_possible_stop_string_is_released_when_it_is_not() -> None:
    matcher = StopMatcher(["STOP"])
    assert matcher.push("go ST") == ("go ", False)
    assert matcher.push("ART") == ("START", False)
    assert matcher.push("ST") == ("", False)
    assert matcher.flush() == "ST"


def test_the_earliest_of_several_stop_strings_wins() -> None:
    matcher = StopMatcher(["\n\n", "."])
    assert matcher.push("One. Two\n\nThree") == ("One", True)


def test_without_stop_strings_everything_passes_at_once() -> None:
    assert StopMatcher([]).push("anything </") == ("anything </", False)


# --- tokenizing ----------------------------------------------------------------------------


def test_a_prompt_is_encoded_and_chat_messages_go_through_the_template(tokenizer) -> None:  # noqa: ANN001
    manager = TokenizeManager(tokenizer)
    params = SamplingParams()
    encoded = manager.tokenize(TokenizeMsg(0, params, prompt="Hi there"))
    assert encoded == tokenizer.encode("Hi there")
    assert manager.tokenize(TokenizeMsg(0, params, prompt=[5, 6])) == [5, 6]
    messages = [{"role": "user", "content": "What is 2+2?"}]
    ids = manager.tokenize(TokenizeMsg(0, params, messages=messages))
    expected = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert tokenizer.decode(ids) == expected
    assert expected.rstrip().endswith("assistant")  # the model is asked to answer


# --- the worker: one request from tokens to replies ----------------------------------------


class Recorder:
    """A ZmqPushQueue stand-in that keeps what was sent."""

    def __init__(self) -> None:
        self.sent: list[object] = []

    def put(self, msg: object) -> None:
        self.sent.append(msg)


def test_worker_streams_replies_and_aborts_the_request_at_a_stop_string(tokenizer) -> None:  # noqa: ANN001
    to_scheduler, to_api = Recorder(), Recorder()
    worker = TokenizerWorker(tokenizer, to_scheduler, to_api)  # type: ignore[arg-type]
    request = TokenizeMsg(3, SamplingParams(max_tokens=50), prompt="Count:", stop=[" four"])
    assert worker.handle(request) == []
    [user_msg] = to_scheduler.sent
    assert isinstance(user_msg, UserMsg) and user_msg.input_ids == tokenizer.encode("Count:")
    replies: list[ReplyMsg] = []
    for token in tokenizer.encode(" one two three four five"):
        replies += worker.handle(DetokenizeMsg(3, token))
    assert "".join(r.text for r in replies) == " one two three"
    assert replies[-1].finish_reason == "stop"
    assert replies[-1].prompt_tokens == len(user_msg.input_ids)
    assert to_scheduler.sent[-1] == AbortBackendMsg(3)  # the scheduler frees its pages now
    assert worker.handle(DetokenizeMsg(3, 42)) == []  # late tokens of a stopped request


def test_worker_reports_length_and_token_counts_at_the_end(tokenizer) -> None:  # noqa: ANN001
    worker = TokenizerWorker(tokenizer, Recorder(), Recorder())  # type: ignore[arg-type]
    worker.handle(TokenizeMsg(4, SamplingParams(max_tokens=3), prompt="Hi"))
    tokens = tokenizer.encode(" 🙂 ok")
    replies = [
        r
        for i, token in enumerate(tokens)
        for r in worker.handle(DetokenizeMsg(4, token, "length" if i == len(tokens) - 1 else None))
    ]
    assert "".join(r.text for r in replies) == " 🙂 ok"
    assert replies[-1].finish_reason == "length"
    assert replies[-1].completion_tokens == len(tokens)


# --- more of the contract: found by the mutation catalogue (mutations.toml) ------------------


@pytest.fixture(scope="module")
def spm_tokenizer():  # noqa: ANN201 - a transformers tokenizer
    """A tiny SentencePiece-style tokenizer, built here: it decodes "▁world" as " world" after
    a word but as "world" at the start of a text (as Llama 2 and Mistral do), and has no chat
    template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "▁Hello": 1, "▁world": 2, "!": 3}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Metaspace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")


def test_a_word_keeps_the_space_its_tokenizer_drops_at_the_start_of_a_text(spm_tokenizer) -> None:  # noqa: ANN001
    ids = [1, 2, 2, 3]
    assert spm_tokenizer.decode([2]) == "world"  # alone, the space is gone
    assert "".join(detokenize_all(spm_tokenizer, ids)) == "Hello world world!"


def test_chat_messages_for_a_tokenizer_without_a_template_are_refused(spm_tokenizer) -> None:  # noqa: ANN001
    manager = TokenizeManager(spm_tokenizer)
    with pytest.raises(InvalidRequestError, match="chat template"):
        manager.tokenize(
            TokenizeMsg(0, SamplingParams(), messages=[{"role": "user", "content": "hi"}])
        )


def test_a_request_without_prompt_or_messages_is_refused(tokenizer) -> None:  # noqa: ANN001
    with pytest.raises(InvalidRequestError):
        TokenizeManager(tokenizer).tokenize(TokenizeMsg(0, SamplingParams()))


def test_the_longest_proper_prefix_of_a_stop_string_is_held_back() -> None:
    matcher = StopMatcher(["STOP"])
    assert matcher.push("go STO") == ("go ", False)
    assert matcher.push("P now") == ("", True)


def test_every_tail_that_could_start_a_stop_string_is_held_back() -> None:
    matcher = StopMatcher(["--END--"])
    assert matcher.push("text--") == ("text", False)  # "--" and "-" could both start it
    assert matcher.push("END-- more") == ("", True)


def test_worker_emits_a_broken_last_character_when_the_request_ends(tokenizer) -> None:  # noqa: ANN001
    worker = TokenizerWorker(tokenizer, Recorder(), Recorder())  # type: ignore[arg-type]
    worker.handle(TokenizeMsg(5, SamplingParams(), prompt="Hi"))
    tokens = tokenizer.encode(" ok 👍🏽")[:-1]  # max_tokens ends it inside the emoji
    replies = [
        r
        for i, token in enumerate(tokens)
        for r in worker.handle(DetokenizeMsg(5, token, "length" if i == len(tokens) - 1 else None))
    ]
    assert "".join(r.text for r in replies) == tokenizer.decode(tokens)
    assert replies[-1].text.endswith("\ufffd")


def test_worker_releases_text_held_for_a_stop_string_when_the_request_ends(tokenizer) -> None:  # noqa: ANN001
    worker = TokenizerWorker(tokenizer, Recorder(), Recorder())  # type: ignore[arg-type]
    worker.handle(TokenizeMsg(6, SamplingParams(), prompt="Hi", stop=["STOP"]))
    tokens = tokenizer.encode(" go ST")
    replies = [
        r
        for i, token in enumerate(tokens)
        for r in worker.handle(DetokenizeMsg(6, token, "length" if i == len(tokens) - 1 else None))
    ]
    assert "".join(r.text for r in replies) == " go ST"
    assert replies[-1].finish_reason == "length"


def test_worker_answers_the_first_token_even_when_it_shows_no_text(tokenizer) -> None:  # noqa: ANN001
    worker = TokenizerWorker(tokenizer, Recorder(), Recorder())  # type: ignore[arg-type]
    worker.handle(TokenizeMsg(7, SamplingParams(), prompt="Hi"))
    first, second = tokenizer.encode("👍🏽")[:2]  # both inside one character
    prompt_tokens = len(tokenizer.encode("Hi"))
    assert worker.handle(DetokenizeMsg(7, first)) == [ReplyMsg(7, "", None, prompt_tokens, 1)]
    assert worker.handle(DetokenizeMsg(7, second)) == []  # later empty pieces: no reply


def test_worker_passes_a_refusal_on_to_the_client_and_forgets_the_request(tokenizer) -> None:  # noqa: ANN001
    worker = TokenizerWorker(tokenizer, Recorder(), Recorder())  # type: ignore[arg-type]
    worker.handle(TokenizeMsg(8, SamplingParams(), prompt="Hi"))
    refusal = DetokenizeMsg(8, None, error="the prompt is too long")
    assert worker.handle(refusal) == [ReplyMsg(8, "", error="the prompt is too long")]
    assert worker.handle(DetokenizeMsg(8, 42)) == []


# --- the whole contract: properties over random bytes and random texts -------------------------

QUICK = settings(
    derandomize=True,
    max_examples=120,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def gpt2_byte_chars() -> dict[int, str]:
    """Byte-level BPE's alphabet: the character that stands for each byte in the vocabulary."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    unprintable = iter(range(256, 512))
    return {b: chr(b) if b in printable else chr(next(unprintable)) for b in range(256)}


@pytest.fixture(scope="module")
def token_pools(tokenizer) -> list[list[int]]:  # noqa: ANN001
    """Ids to draw from: one-byte tokens (any byte sequence, invalid UTF-8 included), tokens
    of real multilingual text, and the special tokens (which show no text)."""
    byte_ids = {tokenizer.convert_tokens_to_ids(char) for char in gpt2_byte_chars().values()}
    byte_ids -= {tokenizer.unk_token_id}  # bytes that never occur in UTF-8 have no token
    text_ids = {token for text in TEXTS for token in tokenizer.encode(text)}
    return [sorted(byte_ids), sorted(text_ids), list(tokenizer.all_special_ids)]


@QUICK
@given(picks=st.lists(st.tuples(st.integers(0, 9), st.integers(0, 2**20)), max_size=24))
def test_text_is_shown_as_soon_as_it_ends_on_a_whole_character(
    tokenizer,  # noqa: ANN001
    token_pools: list[list[int]],
    picks: list[tuple[int, int]],
) -> None:
    """The property, token by token: what was shown is the decode of the tokens so far,
    except for a tail held back while that decode ends inside a character (U+FFFD), even if
    invalid bytes earlier in the window decoded to U+FFFD."""
    pools = [token_pools[0]] * 6 + [token_pools[1]] * 3 + [token_pools[2]]
    ids = [pools[kind][index % len(pools[kind])] for kind, index in picks]
    detokenizer = IncrementalDetokenizer(tokenizer)
    shown = ""
    for i, token in enumerate(ids):
        shown += detokenizer.step(token)
        so_far = tokenizer.decode(ids[: i + 1], skip_special_tokens=True)
        assert so_far.startswith(shown), f"after {ids[: i + 1]}: showed {shown!r} of {so_far!r}"
        if not so_far.endswith("\ufffd"):
            assert shown == so_far, f"after {ids[: i + 1]}: held back {so_far[len(shown) :]!r}"
    shown += detokenizer.flush()
    assert shown == tokenizer.decode(ids, skip_special_tokens=True)
    assert detokenizer.flush() == "", "a second flush repeated text already returned"


def test_flush_returns_a_broken_last_character_as_it_decodes(tokenizer) -> None:  # noqa: ANN001
    detokenizer = IncrementalDetokenizer(tokenizer)
    ids = tokenizer.encode("ok 👍🏽")[:-1]
    shown = "".join(detokenizer.step(token) for token in ids)
    tail = detokenizer.flush()
    assert tail.endswith("\ufffd") and shown + tail == tokenizer.decode(ids)
    assert detokenizer.flush() == ""


def held_back(text: str, stops: list[str]) -> int:
    """How much of `text`'s end could still become a stop string: the longest proper prefix
    of one that `text` ends with."""
    return max((k for s in stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)


@QUICK
@given(
    text=st.text("ab<", max_size=16),
    stops=st.lists(st.text("ab<", min_size=1, max_size=4), max_size=3),
    cuts=st.lists(st.integers(0, 16), max_size=6),
)
def test_stop_matching_shows_all_but_a_possible_stop_string_and_cuts_at_the_earliest(
    text: str, stops: list[str], cuts: list[int]
) -> None:
    """The property, piece by piece: before a match, what was shown is the text so far minus
    the longest tail that could start a stop string; at the first match, exactly the text
    before the earliest stop string (which may be at position 0)."""
    matcher = StopMatcher(stops)
    bounds = [0, *sorted(cuts), len(text)]
    seen = shown = ""
    for start, end in zip(bounds, bounds[1:]):
        piece = text[start:end]
        seen += piece
        out, stopped = matcher.push(piece)
        shown += out
        hits = [seen.find(s) for s in stops if s in seen]
        if hits:
            assert stopped, f"stop strings {stops} occur in {seen!r}: not reported"
            assert shown == seen[: min(hits)], f"{stops} in {seen!r}: showed {shown!r}"
            return
        assert not stopped, f"no stop string of {stops} in {seen!r}, yet stopped"
        assert shown == seen[: len(seen) - held_back(seen, stops)], (
            f"stops {stops}, text {seen!r} in pieces: showed {shown!r}"
        )


def test_a_stop_string_at_the_very_start_shows_nothing() -> None:
    assert StopMatcher(["User:"]).push("User: hi") == ("", True)
    matcher = StopMatcher(["\n"])
    assert matcher.push("") == ("", False)
    assert matcher.push("\nmore") == ("", True)


def test_a_multi_turn_chat_goes_through_the_template_whole(tokenizer) -> None:  # noqa: ANN001
    messages = [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "What is 2+2?"},
    ]
    ids = TokenizeManager(tokenizer).tokenize(TokenizeMsg(0, SamplingParams(), messages=messages))
    assert type(ids) is list and all(type(i) is int for i in ids), "token ids: a list of ints"
    expected = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert tokenizer.decode(ids) == expected


def test_a_text_prompt_becomes_a_list_of_int_ids(tokenizer) -> None:  # noqa: ANN001
    ids = TokenizeManager(tokenizer).tokenize(TokenizeMsg(0, SamplingParams(), prompt="Grüße 🙂"))
    assert type(ids) is list and all(type(i) is int for i in ids), f"not a list of ints: {ids!r}"
    assert tokenizer.decode(ids) == "Grüße 🙂"


def start(worker: TokenizerWorker, uid: int, prompt: str, stop: list[str] | None = None) -> int:
    """Start a request on the worker; its prompt's token count."""
    assert worker.handle(TokenizeMsg(uid, SamplingParams(), prompt=prompt, stop=stop or [])) == []
    return len(worker.tokenizer.encode(prompt))


def test_the_last_reply_goes_out_even_when_the_last_token_shows_no_text(tokenizer) -> None:  # noqa: ANN001
    worker = TokenizerWorker(tokenizer, Recorder(), Recorder())  # type: ignore[arg-type]
    prompt_tokens = start(worker, 9, "A prompt of some tokens")
    tokens = tokenizer.encode(" yes")
    replies = [r for token in tokens for r in worker.handle(DetokenizeMsg(9, token))]
    eos = worker.handle(DetokenizeMsg(9, tokenizer.eos_token_id, "stop"))
    assert eos == [ReplyMsg(9, "", "stop", prompt_tokens, len(tokens) + 1)], (
        "the EOS token shows no text, but its reply finishes the request"
    )
    assert "".join(r.text for r in replies) == " yes"


def test_every_reply_counts_the_prompt_and_the_tokens_generated_so_far(tokenizer) -> None:  # noqa: ANN001
    worker = TokenizerWorker(tokenizer, Recorder(), Recorder())  # type: ignore[arg-type]
    prompt_tokens = start(worker, 10, "Count the tokens of this prompt, please")
    tokens = tokenizer.encode(" one two 🙂 three")
    for n, token in enumerate(tokens, start=1):
        finish = "length" if n == len(tokens) else None
        for reply in worker.handle(DetokenizeMsg(10, token, finish)):
            assert (reply.uid, reply.prompt_tokens, reply.completion_tokens) == (
                10,
                prompt_tokens,
                n,
            ), f"reply to token {n}: {reply}"
            assert reply.error is None


def test_a_stop_string_in_the_schedulers_last_token_finishes_with_stop_and_no_abort(
    tokenizer,  # noqa: ANN001
) -> None:
    to_scheduler = Recorder()
    worker = TokenizerWorker(tokenizer, to_scheduler, Recorder())  # type: ignore[arg-type]
    start(worker, 11, "Hi", stop=[" four"])
    tokens = tokenizer.encode(" three four")
    replies = [
        r
        for i, token in enumerate(tokens)
        for r in worker.handle(DetokenizeMsg(11, token, "length" if i == len(tokens) - 1 else None))
    ]
    assert "".join(r.text for r in replies) == " three"
    assert replies[-1].finish_reason == "stop", "a stop string ends the request with 'stop'"
    assert not any(isinstance(m, AbortBackendMsg) for m in to_scheduler.sent), (
        "the scheduler already finished the request: there is nothing to abort"
    )


def test_a_stop_string_at_the_start_of_the_output_ends_it_with_empty_text(tokenizer) -> None:  # noqa: ANN001
    to_scheduler = Recorder()
    worker = TokenizerWorker(tokenizer, to_scheduler, Recorder())  # type: ignore[arg-type]
    prompt_tokens = start(worker, 12, "Hi", stop=[" four"])
    [token] = tokenizer.encode(" four")
    assert worker.handle(DetokenizeMsg(12, token)) == [ReplyMsg(12, "", "stop", prompt_tokens, 1)]
    assert to_scheduler.sent[-1] == AbortBackendMsg(12)


# --- every stub against the reference (tools/course/differential.py) ---
# The same generated inputs go to your stub and to the reference's body of it (compiled into
# your module, so it sees your other code): what it returns, the state it leaves (offsets, held
# text, requests, messages sent to the scheduler) and the exception it raises must match.
# States come from the reference: a detokenizer after some tokens, a matcher after some pieces,
# a worker after some requests and tokens. Tokenizers are shared by both sides (build=), not
# copied.

ROLES = st.sampled_from(["user", "system", "assistant"])
CHAT = st.lists(
    st.fixed_dictionaries({"role": ROLES, "content": st.sampled_from(TEXTS) | st.text(max_size=8)}),
    min_size=1,
    max_size=4,
)
TOKENIZE_MSGS = st.one_of(
    st.builds(lambda text: TokenizeMsg(0, SamplingParams(), prompt=text), st.sampled_from(TEXTS)),
    st.builds(lambda text: TokenizeMsg(0, SamplingParams(), prompt=text), st.text(max_size=12)),
    st.builds(
        lambda ids: TokenizeMsg(0, SamplingParams(), prompt=ids),
        st.lists(st.integers(0, 49151), max_size=8),
    ),
    st.builds(lambda chat: TokenizeMsg(0, SamplingParams(), messages=chat), CHAT),
    st.just(TokenizeMsg(0, SamplingParams())),  # neither: refused
)


@given(msg=TOKENIZE_MSGS, with_template=st.booleans())
@settings(max_examples=40, suppress_health_check=[HealthCheck.too_slow])
def test_tokenize_matches_the_reference(tokenizer, spm_tokenizer, msg, with_template) -> None:  # noqa: ANN001
    """Text prompts (any characters), prompts of ids, chats of any roles, and neither, for a
    tokenizer with a chat template (SmolLM2's) and one without."""
    chosen = tokenizer if with_template else spm_tokenizer
    assert_same_call(
        TokenizeManager.tokenize, build=lambda: (TokenizeManager(chosen), copy.deepcopy(msg))
    )


TOKEN_PICKS = st.lists(st.tuples(st.integers(0, 9), st.integers(0, 2**20)), max_size=16)


def pick_tokens(token_pools: list[list[int]], picks: list[tuple[int, int]]) -> list[int]:
    """Ids from the pools: mostly single bytes (any byte sequence, broken characters
    included), then tokens of real text, now and then a special token."""
    pools = [token_pools[0]] * 6 + [token_pools[1]] * 3 + [token_pools[2]]
    return [pools[kind][index % len(pools[kind])] for kind, index in picks]


def copy_sharing(value: object, tokenizer) -> object:  # noqa: ANN001
    """A deep copy of `value` that shares `tokenizer` (copying one takes half a second)."""
    return copy.deepcopy(value, {id(tokenizer): tokenizer})


@given(picks=TOKEN_PICKS)
@settings(max_examples=30, suppress_health_check=[HealthCheck.too_slow])
def test_detokenizer_step_matches_the_reference(tokenizer, token_pools, picks) -> None:  # noqa: ANN001
    """Every step of a random token sequence, each from the state the reference left."""
    detokenizer = IncrementalDetokenizer(tokenizer)
    step = reference_function(IncrementalDetokenizer, "step")
    for token in pick_tokens(token_pools, picks):
        assert_same_call(
            IncrementalDetokenizer.step,
            build=lambda: copy_sharing((detokenizer, token), tokenizer),
        )
        step(detokenizer, token)


@given(picks=TOKEN_PICKS, flushed=st.booleans())
@settings(max_examples=30, suppress_health_check=[HealthCheck.too_slow])
def test_detokenizer_flush_matches_the_reference(tokenizer, token_pools, picks, flushed) -> None:  # noqa: ANN001
    """After any tokens (none, text held back inside a character, nothing held), once or
    twice."""
    detokenizer = IncrementalDetokenizer(tokenizer)
    with use_reference_stubs(13):
        for token in pick_tokens(token_pools, picks):
            detokenizer.step(token)
        if flushed:
            detokenizer.flush()
    assert_same_call(
        IncrementalDetokenizer.flush, build=lambda: copy_sharing((detokenizer,), tokenizer)
    )


@given(
    text=st.text("ab<", max_size=16),
    stops=st.lists(st.text("ab<", min_size=1, max_size=4), max_size=3),
    cuts=st.lists(st.integers(0, 16), max_size=6),
)
@example(text="b<ab<", stops=["ab", "<"], cuts=[1, 4])  # the later in the list comes first
@settings(max_examples=50)
def test_stop_matcher_push_matches_the_reference(text, stops, cuts) -> None:  # noqa: ANN001
    """A text in pieces (empty ones too), each pushed from the state the reference left, until
    a stop string matches: stop strings overlapping, prefixes of each other, or none."""
    matcher = StopMatcher(stops)
    push = reference_function(StopMatcher, "push")
    bounds = [0, *sorted(cuts), len(text)]
    for start, end in zip(bounds, bounds[1:]):
        piece = text[start:end]
        assert_same_call(StopMatcher.push, matcher, piece)
        if push(matcher, piece)[1]:
            break


WORKER_REQUESTS = {  # uid: (prompt, stop strings)
    1: ("Hi", []),
    2: ("Count:", ["e", " "]),  # text stops often, with tokens still to come (an abort)
    3: ("Grüße", ["e!", " th", "ü"]),  # and text is often held back ("e", " ", " t")
}
WORKER_SCRIPTS = st.tuples(
    st.lists(  # per request: (which text, from which of its tokens, 8 - how many, its end)
        st.tuples(
            st.integers(0, len(TEXTS) - 1),
            st.integers(0, 30),
            st.integers(0, 7),
            st.sampled_from(
                ["still running", "length", "length, a stop string in the last token", "stop"]
                + ["refused"]
            ),
        ),
        min_size=len(WORKER_REQUESTS),
        max_size=len(WORKER_REQUESTS),
    ),
    st.lists(st.sampled_from(list(WORKER_REQUESTS)), max_size=24),  # whose token comes next
)


def worker_messages(tokenizer, script: tuple) -> list[DetokenizeMsg]:  # noqa: ANN001
    """What the scheduler sends for the requests, interleaved in the script's order; then a
    token for a request that never started, and a late one for request 1."""
    requests, order = script
    queues: dict[int, list[DetokenizeMsg]] = {}
    for uid, (text, start, fewer, end) in zip(WORKER_REQUESTS, requests):
        if end == "refused":
            queues[uid] = [DetokenizeMsg(uid, None, error="the prompt is too long")]
            continue
        ids = tokenizer.encode(TEXTS[text])
        start %= len(ids)
        tokens = ids[start : start + 8 - fewer]
        if end.startswith("length, a stop string"):  # cut after the token that completes one
            stops = WORKER_REQUESTS[uid][1]
            texts = [tokenizer.decode(ids[start:stop]) for stop in range(start + 1, len(ids) + 1)]
            cut = next((i for i, t in enumerate(texts) if any(s in t for s in stops)), None)
            tokens = tokens if cut is None else ids[start : start + cut + 1]
        queues[uid] = [DetokenizeMsg(uid, token) for token in tokens]
        if end.startswith("length"):
            queues[uid][-1].finish_reason = "length"
        elif end == "stop":  # the EOS token ends it
            queues[uid].append(DetokenizeMsg(uid, tokenizer.eos_token_id, "stop"))
    merged = [queues[uid].pop(0) for uid in order if queues[uid]]
    merged += [msg for uid in WORKER_REQUESTS for msg in queues[uid]]
    return merged + [DetokenizeMsg(9, 42), DetokenizeMsg(1, 43)]


@given(script=WORKER_SCRIPTS)
@settings(max_examples=20, suppress_health_check=[HealthCheck.too_slow])
def test_worker_detokenize_matches_the_reference(tokenizer, script) -> None:  # noqa: ANN001
    """Tokens of three requests of real text interleaved, each with its own stop strings
    (matched with tokens still to come, in the last token, or held back at the end); last
    tokens ("length", EOS with "stop"), refusals, and tokens of requests that ended or never
    started. Each message from the state the reference left."""
    worker = TokenizerWorker(tokenizer, Recorder(), Recorder())  # type: ignore[arg-type]
    detokenize = reference_function(TokenizerWorker, "detokenize")
    with use_reference_stubs(13):
        for uid, (prompt, stop) in WORKER_REQUESTS.items():
            worker.handle(TokenizeMsg(uid, SamplingParams(), prompt=prompt, stop=stop))
    for msg in worker_messages(tokenizer, script):
        assert_same_call(
            TokenizerWorker.detokenize, build=lambda: copy_sharing((worker, msg), tokenizer)
        )
        with use_reference_stubs(13):
            detokenize(worker, msg)
