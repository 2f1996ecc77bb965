"""The wire format of every message: msgpack, with token-id lists as packed int32 bytes.

A message becomes a msgpack extension holding its class name and its fields; a field annotated
`list[int]` (token ids) becomes one block of 4 bytes per id, converted in C by numpy, instead
of a msgpack array that is packed and unpacked one int at a time; it comes back as a list.
Only the classes in MESSAGE_TYPES can be decoded: bytes from a socket never name arbitrary
code to run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import msgpack
import numpy as np

from minisgl import features
from minisgl.core import SamplingParams
from minisgl.message.backend import AbortBackendMsg, ExitMsg, StatusRequestMsg, UserMsg
from minisgl.message.frontend import ReplyMsg, StatusMsg
from minisgl.message.tokenizer import BatchMsg, DetokenizeMsg, TokenizeMsg
from minisgl.utils import MinisglError

EXT_DATACLASS = 1  # msgpack extension code: [class name, {field: value}]
EXT_TOKEN_IDS = 2  # msgpack extension code: little-endian int32 array
TOKEN_IDS = "list[int]"  # the annotation of a token-id field (annotations are strings here)

# Message class name -> class: chapter 12's, and the rows of features.MESSAGE_TYPES.
MESSAGE_TYPES: Mapping[str, type] = features.Registry(
    features.MESSAGE_TYPES,
    base={
        cls.__name__: cls
        for cls in (
            UserMsg,
            AbortBackendMsg,
            StatusRequestMsg,
            ExitMsg,
            TokenizeMsg,
            DetokenizeMsg,
            BatchMsg,
            ReplyMsg,
            StatusMsg,
            SamplingParams,
        )
    },
)


class MessageError(MinisglError):
    """Bytes that are not a message this engine sends."""


def _encode(obj: Any) -> msgpack.ExtType:
    """Pack a message as an extension holding [class name, fields]; token-id lists as int32
    (a token-id field left None stays None).

    msgpack calls this hook for every object it cannot pack itself; nested messages (a
    SamplingParams inside a UserMsg, the items of a BatchMsg) come back here in turn.
    """
    raise NotImplementedError("ch12: Pack a message as an extension holding [class name, fields]; token-id lists as int32")


def _decode(code: int, data: bytes) -> Any:
    """Unpack an extension: an int32 token-id array, or a message of a known class.

    Refuse (MessageError) a class name that is not in MESSAGE_TYPES, and an unknown code.
    """
    raise NotImplementedError("ch12: Unpack an extension: an int32 token-id array, or a message of a known class.")


def serialize(msg: Any) -> bytes:
    """A message as bytes: msgpack, token-id lists packed as int32."""
    return msgpack.packb(msg, default=_encode)


def deserialize(data: bytes) -> Any:
    """The message that `serialize` turned into `data`; MessageError for anything else."""
    try:
        return msgpack.unpackb(data, ext_hook=_decode, strict_map_key=False)
    except MessageError:
        raise
    except (ValueError, TypeError, msgpack.UnpackException) as error:
        raise MessageError(f"not a minisgl message: {error}") from error
