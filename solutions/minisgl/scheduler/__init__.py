"""The scheduler: who runs next, where their tokens live, and when their pages are freed."""

from .table import TableManager
from .config import SchedulerConfig
from .scheduler import Scheduler
