"""The scheduler: who runs next, where their tokens live, and when their pages are freed."""

from .table import TableManager
from .config import SchedulerConfig
from .scheduler import Scheduler
from .mixed import StepPolicy  # registers itself in BATCH_POLICIES
from minisgl.speculative import policy  # registers speculative decoding in BATCH_POLICIES
