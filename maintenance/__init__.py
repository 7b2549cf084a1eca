"""The maintenance service: retention, compaction, merging and vacuum, run when each topic's
config says they are due, by one or several maintainers at once (PROTOCOL.md 28).

Python::

    from kstore.maintenance import Service, Settings, run_due, status
    runs = run_due(store)                      # one pass, in this process
    Service(store, Settings(interval_ms=60_000)).run_forever()

Command line: ``kstore maintain [--once]``, ``kstore maintain status``; on a cluster::

    spark-submit "$(python -c 'import kstore.maintenance as m; print(m.SUBMIT_SCRIPT)')" \\
        --store s3://bucket/ks --option endpoint_url=http://... --spark
"""

from __future__ import annotations

import os

from .coordination import LastRun, Lease, Record, Records
from .service import Plan, Service, TaskPlan, TaskRun, plan, run_due, run_item, status
from .tasks import TASKS, Decision, IntervalTask, RunContext, Settings, Task, TaskResult, TopicView

__all__ = [
    "SUBMIT_SCRIPT",
    "TASKS",
    "Decision",
    "IntervalTask",
    "LastRun",
    "Lease",
    "Plan",
    "Record",
    "Records",
    "RunContext",
    "Service",
    "Settings",
    "Task",
    "TaskPlan",
    "TaskResult",
    "TaskRun",
    "TopicView",
    "plan",
    "run_due",
    "run_item",
    "status",
]

# The file to hand to spark-submit (it runs main() of kstore.maintenance.main).
SUBMIT_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "__main__.py")
