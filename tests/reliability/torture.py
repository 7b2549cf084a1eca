"""The torture driver: many clients, maintenance jobs, a Spark copy, faults, crashes and
restarts at once on one store, then the history checker over everything that happened.

:func:`run_torture` runs, for ``duration_s`` seconds (with seed ``seed``, printed first):

- producer threads of this process and producer processes (idempotent, ``acks=all``);
- a transactional producer process (commits and aborts; it keeps its transactional id across
  restarts, so each new instance finishes the transaction its killed predecessor left open);
- group-member processes of one consumer group (``read_committed``, committing after every
  poll), SIGKILLed, SIGSTOPped past their session timeout and resumed (zombies), restarted,
  each once it has read (before that its start and first poll are left alone);
- compaction, merging and retention in one process, vacuum in another (``spark=None``), each
  SIGKILLed and restarted like the clients;
- optionally a Spark Structured Streaming copy of ``events`` into ``copy`` (format
  ``kstore``), a driver process SIGKILLed and restarted from its checkpoint;
- every client over the fault-injecting filesystem (``faultfs``): failed, ambiguous, delayed
  and torn writes, failed and delayed reads, and ``os._exit`` crashes of worker processes at
  named points of the commit protocol;
- optionally a storage restart (SeaweedFS stopped and started) mid-run;
- optionally (``skew_s``) a wall clock skewed per worker process, by up to ``skew_s`` seconds
  either way (a new skew at each restart);
- optionally (``long_pause_s``) producers, group members and jobs SIGSTOPped for
  ``long_pause_s`` and resumed, some by the driver at random moments, some at the worst one
  (a producer stops itself right after writing a segment, before committing it);
- optionally (``machine_crash``, local disk) a machine crash at the end: every process writing
  to the store records what it made durable, and the store is rebuilt from that alone
  (``tests/reliability/machine.py``) before the final scan. The idempotent producers then
  write through kstore's own local path (no faults, no crash points: its fsyncs are what is
  judged); the other clients and jobs keep the fault-injecting wrapper, whose local writes are
  always durable.

The run's time and its schedule of disturbances count from when the first worker processes
are up. Producers send tombstones (null values) to the compacted topic too. Then it stops
everything, (crashes the machine,) finishes the transactions killed producers left open, lets
the Spark copy catch up (``availableNow``) so that it can be checked for completeness, scans
every partition with faults off (``read_committed`` and ``read_uncommitted``), reads every
version of the group log, and checks the whole history. The random choices of the driver (what to kill and
when, fault decisions) derive from the seed; thread and process timing does not, so a replay
with the same seed repeats the same schedule of disturbances, not the same interleaving.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kstore.consumer import Consumer
from kstore.groups import Group
from kstore.log import checkpoint_file, decode_commit, parse_log_file_name
from kstore.producer import Producer
from kstore.records import TopicPartition
from kstore.store import Store
from tests.reliability import faultfs, jumps, machine
from tests.reliability.history import Recorder, Result, check, load_events
from tests.reliability.worker import (
    COPY_TOPIC,
    GROUP,
    TOPICS,
    produce_loop,
    record_id,
)

REPO = Path(__file__).resolve().parents[2]


def fault_rules(rate: float) -> list[dict[str, Any]]:
    """The faults of a run, ``rate`` being the probability of a failed or ambiguous write."""
    return [
        {"op": "create", "kind": "fail", "p": rate},
        {"op": "create", "kind": "ambiguous", "p": rate},
        {"op": "create", "kind": "truncate", "p": rate, "path": r"/segments/|/_data/"},
        {"op": "put", "kind": "truncate", "p": rate, "path": r"_last_checkpoint$"},
        {"op": "put", "kind": "fail", "p": rate / 2},
        {"op": "put", "kind": "ambiguous", "p": rate / 2},
        {"op": "create", "kind": "delay", "p": rate, "delay_s": 0.1},
        {"op": "read", "kind": "delay", "p": rate / 2, "delay_s": 0.05},
        {"op": "read", "kind": "fail", "p": rate / 10},
        {"op": "list", "kind": "fail", "p": rate / 10},
        {"op": "delete", "kind": "fail", "p": rate},
        {"op": "delete", "kind": "ambiguous", "p": rate},
    ]


# How long the run waits for its first worker processes to be up before its clock starts.
CLIENT_START_TIMEOUT_S = 120.0
# Crash points of worker processes; each process crashes at one of them with probability p
# per passage (a few per minute across the run).
CRASHES = [
    {"point": "segment-written", "p": 0.004},
    {"point": "commit-landed", "p": 0.004},
    {"point": "before-commit", "p": 0.002},
    {"point": "checkpoint-write", "p": 0.05},
]
# With long pauses on: a producer stops itself (SIGSTOP) right after a segment write, before
# its commit, at about one passage in 2,000; the driver resumes it ``long_pause_s`` later.
SELF_PAUSE = {"point": "segment-written", "p": 0.0005, "action": "stop"}
# With time jumps on: a producer stops itself right before a commit's PUT, after every check;
# the next jump of time comes while it is stopped (Torture.time_jump).
JUMP_PAUSE = {"point": "before-commit", "p": 0.003, "action": "stop"}
# The maintenance processes: (name prefix, jobs). Two processes, two clocks when skewed: the
# job that removes a file stamps the removal, vacuum judges the delay since it. The third is
# the maintenance service (``kstore maintain``'s Service, a pass a second), beside the jobs run
# directly: it decides from the topics' configs what is due (retention by retention.ms, the
# compacted topic by its dirty ratio and max.compaction.lag.ms, merging, vacuum, transactions
# past their timeout, old log versions) and takes leases against other maintainers.
MAINTENANCE = [
    ("rewrite", ["compaction", "merge", "retention"]),
    ("vacuum", ["vacuum"]),
    ("service", ["service"]),
]

SPARK_DRIVER = """
import json, os, sys, warnings
warnings.simplefilter("ignore")
os.environ["PYSPARK_PYTHON"] = sys.executable
from pyspark.sql import SparkSession
from kstore.spark_ext import register

url, options, checkpoint = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
catch_up = len(sys.argv) > 4 and sys.argv[4] == "catch-up"  # copy what is there, then stop
spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
         .config("spark.sql.shuffle.partitions", "1").config("spark.driver.memory", "512m")
         .getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
register(spark)
store = {"store": url, "storageOptions": json.dumps(options)}
query = (
    spark.readStream.format("kstore").options(**store)
    .option("subscribe", "events").option("startingOffsets", "earliest")
    .option("failOnDataLoss", "false")
    .option("maxOffsetsPerTrigger", "2000").load()
    .selectExpr("key", "value")
    .writeStream.format("kstore").options(**store).option("topic", "copy")
    .option("checkpointLocation", checkpoint)
    .trigger(**({"availableNow": True} if catch_up else {"processingTime": "200 milliseconds"}))
    .start()
)
query.awaitTermination()
"""


@dataclass
class TortureConfig:
    url: str
    storage_options: dict[str, Any]
    workdir: str
    duration_s: float = 30.0
    seed: int | None = None
    backend: str = "local"
    thread_producers: int = 1
    process_producers: int = 2
    txn_producers: int = 1
    consumers: int = 2
    fault_rate: float = 0.02
    crashes: bool = True
    maintenance: bool = True
    spark: bool = False
    # Stops and starts the storage (SeaweedFS) once mid-run; None: no storage restart.
    restart_storage: Callable[[], None] | None = None
    storage_restarts: int = 1  # how many times, at random moments
    skew_s: float = 0.0  # each worker process's wall clock off by up to this, either way
    long_pause_s: float = 0.0  # SIGSTOP producers, members and jobs this long (0: never)
    machine_crash: bool = False  # local disk only: crash the machine at the end
    # Jumps of time (tests/reliability/jumps.py): the world's clocks and the storage's move on
    # by ``jump_s`` at once, this many times a run, while some clients are stopped across the
    # jump (a producer inside its commit's PUT among them when one stopped there): a freeze or
    # a suspend longer than the log retention and the orphan age, in seconds of real time.
    time_jumps: int = 0
    jump_s: float = 3 * 86_400.0
    # The run goes on past ``duration_s``, by up to ``overtime_s``, until the group has read
    # this many records: on a loaded machine a member's first poll on SeaweedFS took 6-30 s
    # (the topic logs' replay at a few dozen GETs a second), most of a short run.
    min_group_reads: int = 0
    # Likewise until the maintenance processes have finished this many job runs: under the
    # whole suite's load none finished one in a 35 s run on SeaweedFS (seed 889534147).
    min_maintenance_runs: int = 0
    overtime_s: float = 0.0
    log: Callable[[str], None] = print


@dataclass
class TortureStats:
    seed: int
    backend: str
    duration_s: float = 0.0
    startup_s: float = 0.0  # how long the first worker processes took to be up
    sends: int = 0
    acks: int = 0
    reads: int = 0
    offset_commits: int = 0
    transactions: dict[str, int] = field(default_factory=dict)
    maintenance_runs: int = 0
    maintenance_errors: int = 0  # job runs that raised
    maintenance: dict[str, int] = field(default_factory=dict)  # partition outcomes by job
    client_errors: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    kills: int = 0
    stops: int = 0
    restarts: int = 0
    spark_kills: int = 0
    storage_restarts: int = 0
    long_pauses: int = 0  # SIGSTOPs for long_pause_s, by the driver or by the process itself
    long_pauses_completed: int = 0  # of them, resumed (not ended by the end of the run)
    time_jumps: int = 0  # jumps of every clock by TortureConfig.jump_s
    jump_victims: int = 0  # processes stopped across a jump (of them, inside a commit PUT:)
    jump_inside_commit: int = 0
    skews: list[float] = field(default_factory=list)  # the skew of each process started
    machine_crash: dict[str, int] = field(default_factory=dict)  # what the crash lost
    copy_caught_up: bool = False
    final_records: int = 0
    copy_records: int = 0  # records the Spark copy wrote (final scan)
    # Shared commits in the commits still in the store at the end (final scan; vacuum and
    # pruning may have removed older ones): topic-log commits that took another writer's
    # pending flush (PROTOCOL.md 30), group-log commits that decided pending requests (31).
    shared_topic_commits: int = 0
    topic_commits: int = 0
    shared_group_commits: int = 0
    anomalies: int = 0
    # What each group member did (up, first read, reads, offset commits, errors, disturbed):
    # where a run's reads went, or why there were none.
    members: list[str] = field(default_factory=list)

    def operations(self) -> int:
        return self.sends + self.reads + self.offset_commits + self.maintenance_runs

    def describe(self) -> str:
        injected = sum(v for k, v in self.faults.items() if not k.startswith(("crash:", "pause:")))
        crashes = {k: v for k, v in self.faults.items() if k.startswith("crash:")}
        skews = (
            f"clock skews {min(self.skews):+.0f} to {max(self.skews):+.0f} s over "
            f"{len(self.skews)} processes, "
            if self.skews
            else ""
        )
        return (
            f"seed {self.seed}, backend {self.backend}, {self.duration_s:.0f} s (clients up "
            f"after {self.startup_s:.0f} s): "
            f"{self.operations()} operations ({self.sends} records sent, {self.acks} "
            f"acknowledged, {self.reads} records read by the group, {self.offset_commits} offset "
            f"commits, {self.maintenance_runs} maintenance job runs ({self.maintenance_errors} "
            f"raised; partition outcomes {dict(sorted(self.maintenance.items()))})), transactions {self.transactions}, "
            f"{injected} faults injected {self.faults}, {sum(crashes.values())} injected "
            f"crashes, {self.kills} SIGKILLs of clients, {self.stops} SIGSTOPs, "
            f"{self.restarts} client restarts, {self.spark_kills} Spark driver kills, "
            f"{self.storage_restarts} storage restarts, {self.long_pauses} long pauses "
            f"({self.long_pauses_completed} resumed), {self.time_jumps} time jumps "
            f"({self.jump_victims} processes stopped across them, {self.jump_inside_commit} "
            f"inside a commit), {skews}"
            f"machine crash {self.machine_crash or 'none'}; {self.final_records} records in "
            f"the final scan ({self.copy_records} in the Spark copy"
            f"{', caught up' if self.copy_caught_up else ''}); shared commits: "
            f"{self.shared_topic_commits} of {self.topic_commits} topic-log commits took other "
            f"writers' flushes, {self.shared_group_commits} group-log commits decided pending "
            f"requests; {self.anomalies} anomalies; "
            f"group members: {'; '.join(self.members) or 'none'}"
        )


@dataclass
class _Proc:
    role: str
    name: str
    config: dict[str, Any]
    process: subprocess.Popen[bytes]
    stopped: bool = False
    started: float = field(default_factory=time.monotonic)
    resume_at: float | None = None  # a long pause: resumed then (monotonic)
    ready: bool = False  # it recorded its start (imports done, store open)
    has_read: bool = False  # a group member: it recorded a read (the service: a job)
    scanned: int = 0  # how far its history was searched for a read

    def is_ready(self) -> bool:
        if not self.ready:
            path = self.config["history"]
            self.ready = os.path.exists(path) and os.path.getsize(path) > 0
        return self.ready

    def may_disturb(self) -> bool:
        """Up, and a group member once it has read. On S3 a new member's first poll loads its
        partitions' states from their logs and reads many small segments: seconds, often more
        than the disturbances of a short run left it, whose members then read nothing
        (docs/RELIABILITY.md)."""
        # The maintenance service likewise once it has run a task: its first pass plans every
        # topic on a faulty S3, and killed before it ended, as on a loaded machine it always
        # was, the service ran nothing in a whole run.
        service = self.role == "maintenance" and self.config.get("jobs") == ["service"]
        if self.role != "consumer" and not service:
            return self.is_ready()
        if not self.has_read and self.is_ready():
            self.has_read = self._recorded_read("job" if service else "read")
        return self.has_read

    def _recorded_read(self, event: str = "read") -> bool:
        # The history up to the first read is a few lines (start, errors): read it anew from
        # where the last search stopped, at a line boundary.
        with open(self.config["history"], "rb") as f:
            f.seek(self.scanned)
            data = f.read()
        complete = data[: data.rfind(b"\n") + 1]
        self.scanned += len(complete)
        for line in complete.splitlines():
            try:
                if json.loads(line).get("ev") == event:
                    return True
            except ValueError:
                continue
        return False


class Torture:
    def __init__(self, config: TortureConfig) -> None:
        self.config = config
        self.seed = (
            config.seed if config.seed is not None else random.SystemRandom().randrange(10**9)
        )
        self.rng = random.Random(self.seed)
        self.stats = TortureStats(seed=self.seed, backend=config.backend)
        self.work = Path(config.workdir)
        self.history_dir = self.work / "history"
        self.history_dir.mkdir(parents=True, exist_ok=True)
        self.events_path = str(self.work / "faults.jsonl")
        self.stop_event = threading.Event()
        self.threads: list[threading.Thread] = []
        self.procs: list[_Proc] = []
        self.spark: subprocess.Popen[bytes] | None = None
        self.counter = 0
        self.ends_at: float | None = None
        self.spark_restarted_at: int | None = None
        self.log = config.log
        self.shadow = str(self.work / "machine-shadow")
        self.clock_started: float | None = None  # wall clock when the run's time began
        self.disturbances: dict[str, list[str]] = {}  # process name -> what the driver did
        # The run's jumps of time, when it makes any (every process follows this file).
        self.clock_path = str(self.work / "clock.json") if config.time_jumps > 0 else None
        self.jumped: list[_Proc] = []  # stopped across the last jump, resumed at jump_resume_at
        self.jump_resume_at: float | None = None
        if config.machine_crash and not config.url.startswith("file://"):
            raise ValueError(f"machine_crash needs a file:// store on local disk, not {config.url}")

    # -- set-up ----------------------------------------------------------------------------------

    def faulty(
        self, seed: int, *, crashes: bool, pauses: bool = False, producer: bool = False
    ) -> tuple[str, dict[str, Any]]:
        if producer and self.config.machine_crash:
            # kstore's own local writes, whose fsyncs the machine crash judges (the wrapper's
            # local writes are durable whatever kstore asked for).
            return self.config.url, dict(self.config.storage_options)
        points = list(CRASHES) if crashes and self.config.crashes else []
        if pauses and self.config.long_pause_s > 0:
            points.append(SELF_PAUSE)
        if pauses and self.config.time_jumps > 0:
            points.append(JUMP_PAUSE)
        return faultfs.wrap_url(
            self.config.url,
            self.config.storage_options,
            faults=fault_rules(self.config.fault_rate),
            crashes=points,
            seed=seed,
            events_path=self.events_path,
            clock_path=self.clock_path,
        )

    def recorder(self, name: str) -> Recorder:
        return Recorder(str(self.history_dir / f"{name}.jsonl"))

    def setup(self) -> Store:
        store = Store(self.config.url, self.config.storage_options)
        record = self.recorder("driver")
        for name, partitions, topic_config in [*TOPICS, COPY_TOPIC]:
            store.create_topic(name, partitions, config=topic_config)
            record(
                "topic",
                topic=name,
                compacted="compact" in str(topic_config.get("cleanup.policy", "")),
                derived=name == COPY_TOPIC[0],
            )
        return store

    # -- clients -----------------------------------------------------------------------------------

    def next_name(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}-{uuid.uuid4().hex[:6]}"

    def start_process(self, role: str, extra: dict[str, Any] | None = None) -> _Proc:
        prefix = {"producer": "p", "txn": "x", "consumer": "c", "maintenance": "m"}[role]
        name = self.next_name(prefix)
        url, options = self.faulty(
            self.rng.randrange(10**9),
            crashes=role in ("producer", "txn"),
            pauses=role == "producer",
            producer=role == "producer",
        )
        config = {
            "url": url,
            "options": options,
            "name": name,
            "history": str(self.history_dir / f"{name}.jsonl"),
            "seed": self.rng.randrange(10**9),
            **(extra or {}),
        }
        if self.config.skew_s:
            config["skew_s"] = round(self.rng.uniform(-self.config.skew_s, self.config.skew_s), 1)
            self.stats.skews.append(config["skew_s"])
        if self.config.machine_crash:
            config["machine"] = {"root": self.store_root(), "shadow": self.shadow}
        if self.clock_path is not None:
            config["clock"] = self.clock_path
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        with open(self.work / f"{name}.stderr", "wb") as stderr:  # the child keeps its copy
            process = subprocess.Popen(
                [sys.executable, "-m", "tests.reliability.worker", role, json.dumps(config)],
                cwd=str(REPO),
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )
        proc = _Proc(role, name, config, process)
        self.procs.append(proc)
        return proc

    def start_thread_producer(self, i: int) -> None:
        name = self.next_name("t")
        url, options = self.faulty(self.rng.randrange(10**9), crashes=False, producer=True)
        store = Store(url, options, create=False)
        record = self.recorder(name)
        rng = random.Random(self.rng.randrange(10**9))
        thread = threading.Thread(
            target=produce_loop,
            args=(store, name, record, rng, self.stop_event.is_set),
            name=f"torture-{name}",
            daemon=True,
        )
        thread.start()
        self.threads.append(thread)

    def store_root(self) -> str:
        return self.config.url.removeprefix("file://")

    def start_spark(self, *, catch_up: bool = False) -> None:
        script = self.work / "spark_driver.py"
        script.write_text(SPARK_DRIVER)
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": str(REPO)}
        with open(self.work / "spark.stderr", "ab") as stderr:  # the child keeps its copy
            self.spark = subprocess.Popen(
                [
                    sys.executable,
                    str(script),
                    self.config.url,
                    json.dumps(self.config.storage_options),
                    str(self.work / "spark-checkpoint"),
                    *(["catch-up"] if catch_up else []),
                ],
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                env=env,
                start_new_session=True,  # the kill takes the JVM with it
            )

    def copy_end(self) -> int:
        """How many records the Spark copy holds (its partitions' end offsets)."""
        store = Store(self.config.url, self.config.storage_options, create=False)
        return sum(
            store.partition(COPY_TOPIC[0], p).state().end_offset for p in range(COPY_TOPIC[1])
        )

    def kill_spark(self) -> None:
        if self.spark is not None and self.spark.poll() is None:
            os.killpg(self.spark.pid, signal.SIGKILL)
            self.spark.wait(30)

    # -- disturbances ------------------------------------------------------------------------------

    def disturb(self) -> None:
        """One random disturbance: kill, stop (and later resume) or restart a client."""
        # Only processes that are up (imports done, store open: seconds on a loaded machine)
        # are victims.
        live = [
            p
            for p in self.procs
            if p.process.poll() is None and p.may_disturb() and p.resume_at is None
        ]
        roll = self.rng.random()
        # One long pause per role at a time: two of three group members asleep for minutes
        # would leave the group nothing to do.
        long_paused = {p.role for p in self.procs if p.resume_at is not None}
        pausable = [p for p in live if not p.stopped and p.role not in long_paused]
        if pausable and roll < 0.05 and self.may_pause_long():
            victim = self.rng.choice(pausable)
            victim.process.send_signal(signal.SIGSTOP)
            self.pause_long(victim)
        elif live and roll < 0.4:
            # A maintenance job runs for seconds to a minute (on S3, with retries): a job
            # process is chosen a quarter as often as a client, or it would rarely finish one.
            weights = [0.25 if p.role == "maintenance" else 1.0 for p in live]
            victim = self.rng.choices(live, weights)[0]
            if victim.stopped:
                victim.process.send_signal(signal.SIGCONT)
                victim.stopped = False
            victim.process.send_signal(signal.SIGKILL)
            victim.process.wait(30)
            self.stats.kills += 1
            self.note(victim, "SIGKILL")
        elif live and roll < 0.55:
            consumers = [p for p in live if p.role == "consumer" and not p.stopped]
            if consumers:
                victim = self.rng.choice(consumers)
                victim.process.send_signal(signal.SIGSTOP)  # a zombie: expelled while asleep
                victim.stopped = True
                self.stats.stops += 1
                self.note(victim, "SIGSTOP")

    def note(self, p: _Proc, what: str) -> None:
        """Record a disturbance of ``p`` for the run's summary of its group members."""
        at = time.time() - self.clock_started if self.clock_started is not None else 0.0
        self.disturbances.setdefault(p.name, []).append(f"{what} at {at:+.0f} s")

    def scheduled_pause(self, role: str) -> bool:
        """A long pause of a process of ``role`` at a set moment, if it can end in time; False
        when no such process is up yet."""
        now = time.monotonic()
        live = [
            p
            for p in self.procs
            if p.role == role and p.process.poll() is None and not p.stopped and p.may_disturb()
        ]
        if any(p.resume_at is not None and p.role == role for p in self.procs):
            return True  # one long pause per role at a time: this one is taken
        if live and self.ends_at is not None and now + self.config.long_pause_s + 5 < self.ends_at:
            victim = self.rng.choice(live)
            victim.process.send_signal(signal.SIGSTOP)
            self.pause_long(victim)
        return bool(live)

    def may_pause_long(self) -> bool:
        """At most two long pauses at once, and each must end before the run does."""
        c = self.config
        if c.long_pause_s <= 0 or self.ends_at is None:
            return False
        paused = sum(1 for p in self.procs if p.resume_at is not None)
        return paused < 2 and time.monotonic() + c.long_pause_s + 5 < self.ends_at

    def pause_long(self, p: _Proc) -> None:
        p.stopped = True
        p.resume_at = time.monotonic() + self.config.long_pause_s
        self.stats.long_pauses += 1
        self.note(p, f"paused {self.config.long_pause_s:.0f} s")
        self.log(f"torture: {p.name} paused for {self.config.long_pause_s:.0f} s")

    def find_self_paused(self) -> None:
        """Producers stop themselves between a segment write and its commit (``SELF_PAUSE``):
        a long pause if one may start now, else a short one."""
        for p in self.procs:
            if p.stopped or p.process.poll() is not None or not _is_stopped(p.process.pid):
                continue
            if self.clock_path is not None and self.jumps_left > 0:
                self.time_jump(inside_commit=p)  # it stopped before a commit: jump now
                continue
            if self.may_pause_long() and not any(
                q.resume_at is not None and q.role == p.role for q in self.procs
            ):
                self.pause_long(p)
            else:
                p.process.send_signal(signal.SIGCONT)

    def time_jump(self, inside_commit: _Proc | None = None) -> bool:
        """Every clock jumps by ``jump_s`` while a few clients are stopped across it: a producer
        that stopped itself inside a commit (when one did), another producer, a group member
        and the Spark driver; they are resumed some seconds later, after vacuum has had a pass
        in the jumped time. False, with no jump, when no client is up to be stopped across it
        (a loaded machine's restarts): the caller tries again at its next round."""
        assert self.clock_path is not None
        if self.jump_resume_at is not None:  # the last jump's victims are still stopped
            if inside_commit is not None:
                self.jumped.append(inside_commit)
                inside_commit.stopped = True
            return True
        victims = [inside_commit] if inside_commit is not None else []
        for role in ("producer", "consumer"):
            live = [
                p
                for p in self.procs
                if p.role == role
                and p.process.poll() is None
                and not p.stopped
                and p.may_disturb()
                and p not in victims
            ]
            if live:
                victims.append(self.rng.choice(live))
        if not victims:
            return False
        self.jumps_left -= 1
        for p in victims:
            if p is not inside_commit:
                p.process.send_signal(signal.SIGSTOP)
            p.stopped = True
            self.note(p, f"stopped across a jump of {self.config.jump_s / 3600:.0f} h")
        if self.spark is not None and self.spark.poll() is None:
            os.killpg(self.spark.pid, signal.SIGSTOP)
        jumps.jump(self.clock_path, self.config.jump_s, int(time.time() * 1000))
        self.jumped = victims
        # Long enough for the maintenance service's vacuum (a pass every 3 s) to run.
        self.jump_resume_at = time.monotonic() + 8.0
        self.stats.time_jumps += 1
        self.stats.jump_victims += len(victims)
        self.stats.jump_inside_commit += inside_commit is not None
        self.log(
            f"torture: time jumped {self.config.jump_s / 3600:.0f} h with "
            f"{', '.join(p.name for p in victims) or 'no client'} stopped"
            f"{' (one inside a commit)' if inside_commit is not None else ''}"
        )
        return True

    def resume_jumped(self) -> None:
        if self.jump_resume_at is None or time.monotonic() < self.jump_resume_at:
            return
        for p in self.jumped:
            if p.process.poll() is None:
                p.process.send_signal(signal.SIGCONT)
            p.stopped = False
        if self.spark is not None and self.spark.poll() is None:
            os.killpg(self.spark.pid, signal.SIGCONT)
        self.jumped, self.jump_resume_at = [], None

    def resume_stopped(self) -> None:
        now = time.monotonic()
        for p in self.procs:
            if p.resume_at is not None:
                if now >= p.resume_at:
                    p.process.send_signal(signal.SIGCONT)
                    p.stopped, p.resume_at = False, None
                    self.stats.long_pauses_completed += 1
                    self.log(f"torture: {p.name} resumed")
            elif p.stopped and p not in self.jumped and self.rng.random() < 0.5:
                p.process.send_signal(signal.SIGCONT)
                p.stopped = False

    def replace_dead(self) -> None:
        """Restart every worker process that died (killed, or crashed by faultfs)."""
        for p in list(self.procs):
            if p.process.poll() is None:
                continue
            self.procs.remove(p)
            if p.process.returncode != -signal.SIGKILL:  # the driver's kills are noted already
                self.note(p, f"exited with code {p.process.returncode}")
            extra: dict[str, Any] = {k: p.config[k] for k in ("tid", "jobs") if k in p.config}
            self.start_process(p.role, extra)
            self.stats.restarts += 1

    # -- the run -----------------------------------------------------------------------------------

    def run(self) -> tuple[TortureStats, Result]:
        try:
            return self._run()
        except BaseException as exc:
            exc.add_note(
                f"torture run: seed {self.seed}, backend {self.config.backend}, "
                f"workdir {self.work} (replay with this seed)"
            )
            raise

    def _run(self) -> tuple[TortureStats, Result]:
        c = self.config
        self.log(
            f"torture: seed {self.seed} backend {c.backend} duration {c.duration_s:.0f} s "
            f"(replay with seed={self.seed})"
        )
        faultfs.register()
        quiet_logs()
        self.setup()
        if self.clock_path is not None:
            jumps.install(self.clock_path)  # the driver's producer threads live in the jumps too
        if c.machine_crash:
            # Everything so far is durable; from now on this process records too (its
            # producer threads).
            machine.baseline(self.store_root(), self.shadow)
            machine.install(self.store_root(), self.shadow)
        started = time.monotonic()
        self.ends_at = started + c.duration_s
        try:
            for i in range(c.thread_producers):
                self.start_thread_producer(i)
            for _ in range(c.process_producers):
                self.start_process("producer")
            for i in range(c.txn_producers):
                self.start_process("txn", {"tid": f"torture-txn-{i}"})
            for _ in range(c.consumers):
                self.start_process("consumer")
            if c.maintenance:
                for _, jobs in MAINTENANCE:
                    self.start_process("maintenance", {"jobs": jobs})
            if c.spark:
                self.start_spark()
            # The run's time counts from when its first clients are up: on SeaweedFS on a
            # loaded machine their start (imports, the store's first reads) took 10-45 s,
            # most or all of a 35 s run. The disturbances below are scheduled from here.
            started = self.wait_for_clients()
            self.clock_started = time.time()
            self.ends_at = started + c.duration_s
            # The Spark driver is killed at set moments (its JVM takes ~15 s to start on a
            # small machine: random kills would leave it no time to copy anything).
            spark_kills = (
                [
                    started + c.duration_s * f
                    for f in ((0.45,) if c.duration_s < 120 else (0.3, 0.6, 0.8))
                ]
                if c.spark
                else []
            )
            restarts = (
                sorted(
                    started + c.duration_s * self.rng.uniform(0.2, 0.7)
                    for _ in range(c.storage_restarts)
                )
                if c.restart_storage is not None
                else []
            )
            # A producer, a group member and a maintenance process each paused once at a set
            # moment (the random pauses may not happen in a short run), if the pause fits.
            pauses = (
                [
                    (started + c.duration_s * f, role)
                    for f, role in ((0.1, "producer"), (0.15, "consumer"), (0.2, "maintenance"))
                ]
                if c.long_pause_s > 0
                else []
            )
            self.jumps_left = c.time_jumps
            jump_times = sorted(
                started + c.duration_s * self.rng.uniform(0.25, 0.75) for _ in range(c.time_jumps)
            )
            # A jump still due when the time is up (a storage restart under load took the
            # rest of a 35 s run once) is made in the overtime, as a short group read is.
            while time.monotonic() - started < c.duration_s or (
                time.monotonic() - started < c.duration_s + c.overtime_s
                and (
                    self.group_reads() < c.min_group_reads
                    or self.maintenance_runs() < c.min_maintenance_runs
                    or bool(jump_times)
                )
            ):
                time.sleep(self.rng.uniform(1.0, 3.0))
                due = [role for at, role in pauses if time.monotonic() >= at]
                pauses = [(at, role) for at, role in pauses if role not in due]
                # A pause whose process is not up yet is tried again at the next round.
                pauses += [(0.0, role) for role in due if not self.scheduled_pause(role)]
                self.disturb()
                self.find_self_paused()
                if jump_times and self.jumps_left <= 0:
                    jump_times.clear()
                if (
                    jump_times
                    and time.monotonic() >= jump_times[0]
                    and self.jump_resume_at is None
                    and self.time_jump()
                ):
                    jump_times.pop(0)
                self.resume_jumped()
                self.resume_stopped()
                self.replace_dead()
                if spark_kills and time.monotonic() >= spark_kills[0]:
                    spark_kills.pop(0)
                    self.kill_spark()
                    self.stats.spark_kills += 1
                    self.spark_restarted_at = self.copy_end()
                    self.start_spark()
                if restarts and time.monotonic() >= restarts[0]:
                    restarts.pop(0)
                    self.log("torture: restarting the storage")
                    assert c.restart_storage is not None
                    c.restart_storage()
                    self.stats.storage_restarts += 1
            if c.spark and self.spark_restarted_at is not None:
                # Let the restarted query copy something before it is killed for good.
                deadline = time.monotonic() + 60
                while self.copy_end() <= self.spark_restarted_at and time.monotonic() < deadline:
                    time.sleep(1)
        finally:
            self.stats.duration_s = time.monotonic() - started
            self.shut_down()
            if self.clock_path is not None:
                jumps.uninstall()
            if c.machine_crash:
                machine.uninstall()
        if c.machine_crash:
            # The Spark executors do not record: the copy's subtree is kept as it is.
            self.stats.machine_crash = machine.crash(
                self.store_root(), self.shadow, keep=[f"topics/{COPY_TOPIC[0]}"]
            )
            self.log(f"torture: machine crashed: {self.stats.machine_crash}")
        self.finish_transactions()
        if c.spark:
            self.catch_up_copy()
        self.finish()
        return self.finish_check()

    def group_reads(self) -> int:
        """Records the group's members have read so far (as ``TortureStats.reads`` counts
        them, from the histories as written)."""
        return sum(
            1
            for e in load_events(str(self.history_dir))
            if e["ev"] == "read" and not e.get("final")
        )

    def maintenance_runs(self) -> int:
        """Job runs the maintenance processes have finished so far (as
        ``TortureStats.maintenance_runs`` counts them)."""
        return sum(1 for e in load_events(str(self.history_dir)) if e["ev"] == "job")

    def wait_for_clients(self) -> float:
        """Wait until every worker process started so far is up (or has died); returns
        then (monotonic) and records how long it took."""
        began = time.monotonic()
        while time.monotonic() - began < CLIENT_START_TIMEOUT_S and not all(
            p.is_ready() or p.process.poll() is not None for p in self.procs
        ):
            time.sleep(0.2)
        now = time.monotonic()
        self.stats.startup_s = now - began
        self.log(f"torture: clients up after {self.stats.startup_s:.1f} s")
        return now

    def member_summary(self, events: list[dict[str, Any]]) -> list[str]:
        """One line per group-member process, times from the start of the run's clock."""
        zero = self.clock_started if self.clock_started is not None else 0.0
        by_member: dict[str, list[dict[str, Any]]] = {}
        for e in events:
            name = e.get("reader") if e["ev"] == "read" else e.get("who")
            if e["ev"] == "start" and e.get("role") == "consumer":
                by_member.setdefault(str(name), []).append(e)
            elif e["ev"] in ("read", "offset_commit", "error") and name in by_member:
                by_member[str(name)].append(e)
        return [
            _member_line(
                name,
                sorted(evs, key=lambda e: float(e["t"])),
                zero,
                self.disturbances.get(name, []),
            )
            for name, evs in sorted(by_member.items(), key=lambda kv: float(kv[1][0]["t"]))
        ]

    def finish_transactions(self) -> None:
        store = Store(self.config.url, self.config.storage_options, create=False)
        for i in range(self.config.txn_producers):
            Producer(store, transactional_id=f"torture-txn-{i}").close()  # finishes a dead txn

    def catch_up_copy(self) -> None:
        """Let the Spark copy copy everything (faults off, nothing else running), so that it
        can be checked for completeness as well as for duplicates."""
        self.start_spark(catch_up=True)
        assert self.spark is not None
        try:
            code = self.spark.wait(600)
        except subprocess.TimeoutExpired:
            self.kill_spark()
            self.log("torture: the Spark copy did not catch up within 600 s")
            return
        if code != 0:
            self.log(f"torture: the Spark catch-up run exited with {code} (see spark.stderr)")
            return
        self.stats.copy_caught_up = True
        record = self.recorder("catch-up")
        record("copy_complete", source="events", target=COPY_TOPIC[0])
        record.close()

    def shut_down(self) -> None:
        self.stop_event.set()
        for p in self.procs:
            if p.process.poll() is None:
                if p.stopped:
                    p.process.send_signal(signal.SIGCONT)
                p.process.send_signal(signal.SIGKILL)
            p.process.wait(30)
        self.kill_spark()
        for thread in self.threads:
            thread.join(timeout=180)
            if thread.is_alive():
                self.log(f"torture: thread {thread.name} did not stop")

    def finish(self) -> None:
        """With faults off: finish open transactions, scan every partition, read the group log."""
        record = self.recorder("final")
        store = Store(self.config.url, self.config.storage_options, create=False)
        for name, partitions, _ in [*TOPICS, COPY_TOPIC]:
            for p in range(partitions):
                tp = TopicPartition(name, p)
                state = store.partition(name, p).state()
                record(
                    "bounds",
                    topic=name,
                    partition=p,
                    log_start=state.log_start_offset,
                    end=state.end_offset,
                )
                for iso in ("read_committed", "read_uncommitted"):
                    consumer = Consumer(store=store, isolation_level=iso, max_poll_records=5000)
                    consumer.assign([tp])
                    consumer.seek_to_beginning(tp)
                    end = consumer.end_offsets([tp])[tp]
                    deadline = time.monotonic() + 300
                    while consumer.position(tp) < end:
                        if time.monotonic() > deadline:
                            raise RuntimeError(
                                f"final scan of {name}-{p} ({iso}) stuck at offset "
                                f"{consumer.position(tp)} of {end}"
                            )
                        for records in consumer.poll(timeout_ms=500).values():
                            for r in records:
                                vid, tombstone = record_id(r)
                                record(
                                    "read",
                                    reader="final",
                                    **{"pass": f"final-{iso}"},
                                    iso="rc" if iso == "read_committed" else "ru",
                                    final=True,
                                    topic=name,
                                    partition=p,
                                    offset=r.offset,
                                    value=vid,
                                    tombstone=tombstone,
                                )
                    consumer.close()
        self.count_shared_commits(store)
        group = Group(store, GROUP)
        version = self.record_group_base(store, group, record)
        while True:
            commit = group.log.read_commit(version)
            if commit is None:
                break
            _, actions = commit
            if any(name == "requests" for name, _ in actions):
                self.stats.shared_group_commits += 1
            record(
                "group_commit",
                group=GROUP,
                version=version,
                actions=[{name: body} for name, body in actions],
            )
            version += 1
        record.close()

    def count_shared_commits(self, store: Store) -> None:
        """How many of the topic-log commits left in the store took another writer's pending
        flush (their `flushes` action lists one as taken)."""
        for name, _, _ in [*TOPICS, COPY_TOPIC]:
            root = f"topics/{name}"
            for incarnation in store.storage.list_dir(root):
                base = f"{root}/{incarnation.name}"
                if not re.fullmatch(r"[0-9a-f]{32}", incarnation.name):
                    continue
                for log_dir in store.storage.list_dir(base):
                    if not re.fullmatch(r"_log(\.[0-9]+)?", log_dir.name):
                        continue
                    files = [
                        f"{base}/{log_dir.name}/{info.name}"
                        for info in store.storage.list_dir(f"{base}/{log_dir.name}")
                        if (parsed := parse_log_file_name(info.name)) is not None and not parsed[1]
                    ]
                    for data in store.storage.read_many(files).values():
                        self.stats.topic_commits += 1
                        info = json.loads(data.split(b"\n", 1)[0])["commitInfo"]
                        text = data[: info.get("dataOffset", len(data))]  # not the records
                        if "committer" in info and b'"taken":[{' in text:
                            self.stats.shared_topic_commits += 1

    def record_group_base(self, store: Store, group: Group, record: Recorder) -> int:
        """The first group-log version to record: 0, or, when a run's jumps of time let the
        log's early versions be pruned (17.5), the oldest kept checkpoint, recorded as the
        base the checker replays the later versions onto."""
        names = [info.name for info in store.storage.list_dir(group.log.directory)]
        parsed = [p for n in names if (p := parse_log_file_name(n)) is not None]
        commits = sorted(v for v, checkpoint in parsed if not checkpoint)
        if not commits or commits[0] == 0:
            return 0
        base = min(v for v, checkpoint in parsed if checkpoint and v >= commits[0])
        data = store.storage.read(f"{group.log.directory}/{checkpoint_file(base)}")
        _, actions = decode_commit(data, checkpoint_file(base))
        record(
            "group_base",
            group=GROUP,
            version=base,
            actions=[{name: body} for name, body in actions],
        )
        return base + 1

    def finish_check(self) -> tuple[TortureStats, Result]:
        events = load_events(str(self.history_dir))
        result = check(events)
        s = self.stats
        s.sends = result.summary.sent
        s.acks = result.summary.acked
        s.reads = result.summary.reads
        s.final_records = result.summary.final_records
        s.transactions = result.summary.transactions
        s.copy_records = sum(
            1
            for e in events
            if e["ev"] == "read"
            and e.get("final")
            and e.get("iso") == "rc"
            and e["topic"] == COPY_TOPIC[0]
        )
        s.offset_commits = sum(1 for e in events if e["ev"] == "offset_commit")
        s.client_errors = sum(1 for e in events if e["ev"] == "error")
        for e in events:
            if e["ev"] != "job":
                continue
            s.maintenance_runs += 1
            s.maintenance_errors += bool(e.get("failed"))
            for what, n in (e.get("outcomes") or {}).items():
                s.maintenance[what] = s.maintenance.get(what, 0) + n
        s.faults = faultfs.fault_counts(faultfs.read_events(self.events_path))
        s.anomalies = len(result.anomalies)
        s.members = self.member_summary(events)
        return s, result


def _member_line(name: str, evs: list[dict[str, Any]], zero: float, done: list[str]) -> str:
    def at(e: dict[str, Any]) -> str:
        return f"{float(e['t']) - zero:+.0f} s"

    reads = [e for e in evs if e["ev"] == "read"]
    commits = [e for e in evs if e["ev"] == "offset_commit"]
    refused = sum(1 for e in commits if e.get("outcome") != "ok")
    errors = sum(1 for e in evs if e["ev"] == "error")
    start = next((e for e in evs if e["ev"] == "start"), None)
    parts = [
        f"{name} up at {at(start) if start else '?'}",
        f"first read at {at(reads[0])}" if reads else "no read",
        f"{len(reads)} reads",
        f"{len(commits)} offset commits ({refused} refused)",
        f"{errors} errors",
        *done,
    ]
    return ", ".join(parts)


def _is_stopped(pid: int) -> bool:
    """True when process ``pid`` is stopped (by a signal), from ``/proc/<pid>/stat``."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "T"
    except (OSError, IndexError):
        return False


def quiet_logs() -> None:
    """kstore logs every retried commit at WARNING: thousands of lines under injected faults."""
    logging.getLogger("kstore").setLevel(logging.ERROR)


def run_torture(config: TortureConfig) -> tuple[TortureStats, Result]:
    """Run one torture run (see the module docstring); the caller asserts on the result."""
    return Torture(config).run()
