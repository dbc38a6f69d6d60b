"""Stage 2: sequence state, KV blocks with a prefix cache, and the scheduler. No torch here."""

from jobrunner.sched.batch import ScheduledBatch
from jobrunner.sched.block_manager import BlockManager
from jobrunner.sched.scheduler import Scheduler
from jobrunner.sched.sequence import Sequence, SequenceStatus

__all__ = ["BlockManager", "ScheduledBatch", "Scheduler", "Sequence", "SequenceStatus"]
