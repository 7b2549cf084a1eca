"""An exactly-once consume-transform-produce loop in its own process, for kill -9 tests.

Usage: python -m tests.workers.eos_worker STORE_URL OPTIONS_JSON CRASH_POINT CRASH_AT
CRASH_POINT is "none", "after_send" (records written, nothing decided) or "after_decision"
(offsets committed as the transaction's decision, markers not yet written); the process
SIGKILLs itself there during its transaction number CRASH_AT. Reads topic "in", writes "out"
(values upper-cased), group "eos", transactional id "eos-app".
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

from kstore import Store, transaction_manager
from kstore.consumer import Consumer
from kstore.errors import CommitFailedError
from kstore.producer import Producer


def main() -> None:
    url, options = sys.argv[1], json.loads(sys.argv[2])
    crash_point, crash_at = sys.argv[3], int(sys.argv[4])
    store = Store(url, options, create=False)
    producer = Producer(store, transactional_id="eos-app", linger_ms=1)  # finishes a dead txn
    consumer = Consumer(
        "in",
        store=store,
        group_id="eos",
        enable_auto_commit=False,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        session_timeout_ms=2_500,
        heartbeat_interval_ms=200,
        max_poll_records=40,
    )
    done = 0
    idle = 0
    while idle < 60:  # 6 s without records: past a dead predecessor's session timeout
        polled = consumer.poll(timeout_ms=100)
        if not polled:
            idle += 1
            continue
        idle = 0
        producer.begin_transaction()
        for records in polled.values():
            for record in records:
                producer.send("out", value=record.value.upper(), key=record.key)
        producer.flush()
        if crash_point == "after_send" and done == crash_at:
            os.kill(os.getpid(), signal.SIGKILL)
        positions = {tp: consumer.position(tp) for tp in polled}
        producer.send_offsets_to_transaction(positions, consumer.group_metadata())
        if crash_point == "after_decision" and done == crash_at:

            def crash(*args: Any, **kwargs: Any) -> None:
                os.kill(os.getpid(), signal.SIGKILL)

            # The transaction's end starts with its markers: die once it is decided.
            transaction_manager.end_transaction = crash
        try:
            producer.commit_transaction()
        except CommitFailedError:
            # A rebalance took partitions away between poll() and the commit: abort, and
            # read again from the committed offsets (Kafka's exactly-once loop does the same).
            producer.abort_transaction()
            for tp in consumer.assignment():
                committed = consumer.committed(tp)
                if committed is not None:
                    consumer.seek(tp, committed)  # type: ignore[arg-type]
            continue
        done += 1
    consumer.close()
    producer.close()
    print(json.dumps({"transactions": done}), flush=True)


if __name__ == "__main__":
    main()
