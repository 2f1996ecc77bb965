"""Messages between the server's processes, their wire format, and the ZMQ queues that carry them.

API server --TokenizeMsg/AbortMsg--> tokenizer --UserMsg/AbortMsg--> scheduler
API server <--ReplyMsg------------- tokenizer <--DetokenizeMsg------- scheduler
"""

from .backend import AbortMsg, ExitMsg, StatusRequestMsg, UserMsg
from .frontend import ReplyMsg, StatusMsg
from .tokenizer import BatchMsg, DetokenizeMsg, TokenizeMsg
from .serialize import deserialize, serialize
from .transport import AsyncPullQueue, PullQueue, PushQueue, ipc_address
