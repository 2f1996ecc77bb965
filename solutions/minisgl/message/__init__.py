"""Messages between the server's processes, their wire format, and the ZMQ queues that carry them.

API server --TokenizeMsg/AbortBackendMsg--> tokenizer --UserMsg/AbortBackendMsg--> scheduler
API server <--ReplyMsg------------- tokenizer <--DetokenizeMsg------- scheduler
"""

from .backend import AbortBackendMsg, ExitMsg, StatusRequestMsg, UserMsg
from .frontend import ReplyMsg, StatusMsg
from .tokenizer import BatchMsg, DetokenizeMsg, TokenizeMsg
from .serialize import deserialize, serialize
from .transport import ZmqAsyncPullQueue, ZmqPullQueue, ZmqPushQueue, ipc_address
