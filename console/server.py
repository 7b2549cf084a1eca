"""The console's HTTP server (the standard library's, one thread a request): routes, parameter
checks, error pages and the two write actions.

Every page but the record browser is drawn from the newest snapshot (snapshot.py), so pages
and scrapes cost the store nothing. Names taken from a URL pass kstore's name rules before
anything is looked up; a request that fails gets a page with one message and a status code
(400 bad input, 404 unknown topic, group or partition, 503 the store not answering), never a
traceback. Writes (reset a group's offsets, delete records) exist only with ``allow_writes``,
are POSTs carrying the server's form token, and run only once confirmed on a second page.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

from kstore.errors import (
    CorruptLogError,
    IllegalStateError,
    InvalidArgumentError,
    InvalidGroupIdError,
    InvalidTopicError,
    KStoreError,
    OffsetOutOfRangeError,
    StorageError,
    UnknownTopicOrPartitionError,
)
from kstore.names import validate_group_id, validate_topic_name

from . import pages
from .browse import DEFAULT_LIMIT, read_page
from .metrics import exposition

if TYPE_CHECKING:
    from prometheus_client.registry import CollectorRegistry

    from .snapshot import Snapshot, Snapshots

MAX_BODY_BYTES = 64 * 1024  # a form is a few fields


class HTTPError(Exception):
    """A request that gets an error page: its status and the one message shown."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes
    content_type: str = "text/html; charset=utf-8"
    location: str | None = None


# The last millisecond of year 9999, the latest time an ISO 8601 date can name.
MAX_TIME_MS = 253_402_300_799_999


def parse_time_ms(text: str, what: str) -> int:
    """Milliseconds since the epoch, or an ISO 8601 time (UTC unless it names a zone), from
    1970 to the end of year 9999."""
    text = text.strip()
    if text.lstrip("-").isdigit():
        ms = int(text)
    else:
        try:
            when = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise HTTPError(
                400,
                f"{what} must be an ISO 8601 time (2026-01-31T12:00:00Z) or milliseconds, "
                f"got {text[:64]!r}",
            ) from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        ms = int(when.timestamp() * 1000)
    if not 0 <= ms <= MAX_TIME_MS:
        raise HTTPError(
            400, f"{what} must be from 1970-01-01T00:00:00Z to the end of 9999, got {text[:64]!r}"
        )
    return ms


def _int(
    params: Mapping[str, str], name: str, *, default: int | None = None, low: int = 0
) -> int | None:
    text = params.get(name, "").strip()
    if not text:
        return default
    if not text.lstrip("-").isdigit():
        raise HTTPError(400, f"{name} must be an integer, got {text!r}")
    value = int(text)
    if value < low:
        raise HTTPError(400, f"{name} must be at least {low}, got {value}")
    return value


class Console:
    """What the handler serves: pages from ``snapshots``, ``/metrics`` from ``registry``."""

    def __init__(
        self,
        snapshots: Snapshots,
        registry: CollectorRegistry,
        *,
        store_shown: str,
        allow_writes: bool = False,
        redact: Callable[[str], str] = lambda text: text,
        explain: Callable[[BaseException], str] | None = None,
    ) -> None:
        self.snapshots = snapshots
        self.store = snapshots.store
        self.registry = registry
        self.redact = redact
        self.explain = explain or snapshots.explain
        self.frame = pages.Frame(
            store=redact(store_shown),
            refresh_s=snapshots.refresh_s,
            allow_writes=allow_writes,
            csrf=secrets.token_urlsafe(24),
        )
        self._write_lock = threading.Lock()
        self.on_close: list[Callable[[], object]] = []

    def close(self) -> None:
        self.snapshots.stop()
        for call in reversed(self.on_close):
            call()
        self.on_close.clear()

    # -- dispatch --------------------------------------------------------------------------------

    def handle(self, method: str, raw_path: str, form: Mapping[str, str]) -> Response:
        try:
            return self._route(method, raw_path, form)
        except HTTPError as exc:
            return self._error(exc.status, exc.message)
        except (InvalidTopicError, InvalidGroupIdError) as exc:
            return self._error(400, self.explain(exc))
        except UnknownTopicOrPartitionError as exc:
            return self._error(404, self.explain(exc))
        except (OffsetOutOfRangeError, InvalidArgumentError, IllegalStateError) as exc:
            return self._error(400, self.explain(exc))
        except StorageError as exc:
            return self._error(503, self.explain(exc))
        except CorruptLogError as exc:
            return self._error(500, self.explain(exc))
        except KStoreError as exc:
            return self._error(500, self.explain(exc))
        except Exception as exc:  # a bug: one line, never a traceback in a page
            said = " ".join(str(exc).split())
            return self._error(500, f"unexpected {type(exc).__name__}{': ' + said if said else ''}")

    def _error(self, status: int, message: str) -> Response:
        text = self.redact(message)
        return Response(status, pages.error_page(self.frame, status, text).encode())

    def _html(self, text: str, status: int = 200) -> Response:
        return Response(status, self.redact(text).encode())

    def _route(self, method: str, raw_path: str, form: Mapping[str, str]) -> Response:
        split = urlsplit(raw_path)
        params = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        parts = [unquote(p) for p in split.path.split("/") if p]
        if method == "POST":
            return self._post(parts, form)
        if method not in ("GET", "HEAD"):
            raise HTTPError(405, f"{method} is not served here")
        if parts == ["metrics"]:
            body, content_type = exposition(self.registry)
            return Response(200, self.redact(body.decode()).encode(), content_type)
        if parts == ["healthz"]:
            ok = self.snapshots.latest() is not None and self.snapshots.failure() is None
            return Response(200 if ok else 503, b"ok\n" if ok else b"not ready\n", "text/plain")
        if parts == ["topics"]:
            return Response(302, b"", location="/")
        if parts == [] or parts == ["groups"] or parts == ["maintenance"]:
            snap, failure = self._snapshot()
            if not parts:
                return self._html(pages.topics_page(self.frame, snap, failure))
            if parts == ["groups"]:
                return self._html(pages.groups_page(self.frame, snap, failure))
            return self._html(pages.maintenance_page(self.frame, snap, failure))
        if len(parts) >= 2 and parts[0] == "topics":
            topic = validate_topic_name(parts[1])
            if len(parts) == 2:
                snap, failure = self._snapshot()
                facts = snap.topics.get(topic)
                if facts is None:
                    raise HTTPError(
                        404, f"topic {topic!r} does not exist (as of {pages.iso(snap.taken_ms)})"
                    )
                return self._html(pages.topic_page(self.frame, snap, failure, facts))
            if parts[2:] == ["records"]:
                return self._records(topic, params)
        if len(parts) == 2 and parts[0] == "groups":
            group = validate_group_id(parts[1])
            snap, failure = self._snapshot()
            gfacts = snap.groups.get(group)
            if gfacts is None:
                raise HTTPError(
                    404,
                    f"consumer group {group!r} does not exist (as of {pages.iso(snap.taken_ms)})",
                )
            history = self.snapshots.group_history(group)
            return self._html(pages.group_page(self.frame, snap, failure, gfacts, history))
        raise HTTPError(404, f"no page at {split.path!r}")

    def _snapshot(self) -> tuple[Snapshot, tuple[str, int] | None]:
        snap = self.snapshots.latest()
        failure = self.snapshots.failure()
        if snap is None:
            if failure is not None:
                raise HTTPError(503, f"the store could not be read: {failure[0]}")
            raise HTTPError(503, "the store is being read for the first time; reload in a moment")
        return snap, failure

    def _records(self, topic: str, params: Mapping[str, str]) -> Response:
        partition = _int(params, "partition", default=0)
        offset = _int(params, "offset")
        stamp = params.get("timestamp", "").strip()
        timestamp_ms = parse_time_ms(stamp, "timestamp") if stamp else None
        limit = _int(params, "limit", default=DEFAULT_LIMIT, low=1)
        form = params.get("format", "auto") or "auto"
        assert partition is not None
        assert limit is not None
        result = read_page(
            self.store,
            topic,
            partition,
            offset=offset,
            timestamp_ms=timestamp_ms,
            limit=limit,
            form=form,
        )
        asked = {
            k: v
            for k, v in params.items()
            if k in ("partition", "offset", "timestamp", "limit", "format")
        }
        asked.setdefault("partition", str(partition))
        return self._html(pages.records_page(self.frame, result, asked))

    # -- writes ----------------------------------------------------------------------------------

    def _post(self, parts: list[str], form: Mapping[str, str]) -> Response:
        if not self.frame.allow_writes:
            raise HTTPError(
                403, "this console is read-only: start it with --allow-writes to change the store"
            )
        if not secrets.compare_digest(form.get("csrf", ""), self.frame.csrf):
            raise HTTPError(
                403, "the form is stale or was not made by this console; reload the page"
            )
        if len(parts) == 3 and parts[0] == "topics" and parts[2] == "delete-records":
            return self._delete_records(validate_topic_name(parts[1]), form)
        if len(parts) == 3 and parts[0] == "groups" and parts[2] == "reset-offsets":
            return self._reset_offsets(validate_group_id(parts[1]), form)
        raise HTTPError(404, f"no action at {'/' + '/'.join(parts)!r}")

    def _delete_records(self, topic: str, form: Mapping[str, str]) -> Response:
        meta = self.store.topic(topic)
        partition = _int(form, "partition")
        offset = _int(form, "offset", low=-1)
        if partition is None or offset is None:
            raise HTTPError(400, "give a partition and the offset below which records are deleted")
        if partition >= meta.partitions:
            raise UnknownTopicOrPartitionError(
                f"topic {topic!r} has partitions 0..{meta.partitions - 1}; {partition} does not exist"
            )
        state = self.store.partition_state(topic, partition, meta)
        target = state.end_offset if offset == -1 else offset
        if not state.start_offset <= target <= state.end_offset:
            raise OffsetOutOfRangeError(
                f"{topic}-{partition}: offset {target} is outside the live range "
                f"[{state.start_offset}, {state.end_offset}]"
            )
        action = f"{pages.topic_href(topic)}/delete-records"
        if form.get("confirm") != "yes":
            line = (
                f"{topic}-{partition}: log start offset {state.start_offset} -> {target} "
                f"({target - state.start_offset} records no longer readable)"
            )
            fields = {"partition": str(partition), "offset": str(target)}
            return self._html(
                pages.confirm_page(self.frame, "Delete records", action, fields, [line])
            )
        with self._write_lock:
            start = self.store.partition(topic, partition, meta).delete_records(target)
        self.snapshots.refresh()
        return self._html(
            pages.done_page(
                self.frame,
                "Records deleted",
                [f"{topic}-{partition}: the log now starts at offset {start}"],
                pages.topic_href(topic),
            )
        )

    def _reset_offsets(self, group: str, form: Mapping[str, str]) -> Response:
        from kstore.groups import Group, reset_offsets

        if not Group(self.store, group).exists():
            raise HTTPError(404, f"consumer group {group!r} does not exist")
        to = form.get("to", "")
        value = form.get("value", "").strip()
        kwargs: dict[str, Any] = {}
        if to == "earliest":
            kwargs["to_earliest"] = True
        elif to == "latest":
            kwargs["to_latest"] = True
        elif to == "offset":
            kwargs["to_offset"] = _int({"offset": value}, "offset")
        elif to == "datetime":
            kwargs["to_datetime_ms"] = parse_time_ms(value, "datetime")
        elif to == "shift":
            kwargs["shift_by"] = _int({"shift": value}, "shift", low=-(1 << 62))
        else:
            raise HTTPError(
                400, f"to must be earliest, latest, offset, datetime or shift, got {to!r}"
            )
        if any(v is None for v in kwargs.values()):
            raise HTTPError(400, f"reset to {to} needs a value")
        topic = form.get("topic", "").strip()
        if topic:
            topics = [validate_topic_name(topic)]
        else:
            snap = self.snapshots.latest()
            facts = snap.groups.get(group) if snap is not None else None
            topics = sorted({p.topic for p in facts.partitions}) if facts is not None else []
            if not topics:
                raise HTTPError(400, f"group {group!r} reads no topic: name one")
        execute = form.get("confirm") == "yes"
        with self._write_lock:
            plan = reset_offsets(self.store, group, topics, execute=execute, **kwargs)
        lines = [f"{tp.topic}-{tp.partition}: -> {offset}" for tp, offset in sorted(plan.items())]
        if not execute:
            fields = {"topic": topic, "to": to, "value": value}
            action = f"{pages.group_href(group)}/reset-offsets"
            return self._html(
                pages.confirm_page(
                    self.frame, f"Reset the offsets of {group}", action, fields, lines
                )
            )
        self.snapshots.refresh()
        return self._html(
            pages.done_page(self.frame, f"Offsets of {group} reset", lines, pages.group_href(group))
        )


LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})


def _handler(
    console: Console, log: Callable[[str], None] | None, allowed_hosts: frozenset[str] | None
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "kstore-console"
        sys_version = ""

        def _send(self, response: Response, head: bool = False) -> None:
            self.send_response(response.status)
            self.send_header("Content-Type", response.content_type)
            self.send_header("Content-Length", str(len(response.body)))
            self.send_header("Cache-Control", "no-store")
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header("X-Frame-Options", "DENY")
            self.send_header(
                "Content-Security-Policy",
                "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; "
                "img-src 'self' data:; form-action 'self'; frame-ancestors 'none'",
            )
            if response.location is not None:
                self.send_header("Location", response.location)
            self.end_headers()
            if not head:
                self.wfile.write(response.body)

        def _host_refused(self) -> bool:
            """A loopback console answers only to loopback names: a page of another site
            whose name was rebound to 127.0.0.1 (DNS rebinding) gets nothing."""
            if allowed_hosts is None:
                return False
            given = (self.headers.get("Host") or "").strip().lower()
            name = (
                given.rsplit("]", 1)[0].lstrip("[")
                if given.startswith("[")
                else given.split(":")[0]
            )
            if name in allowed_hosts:
                return False
            self._send(
                console._error(
                    403, f"this console answers to {', '.join(sorted(allowed_hosts))} only"
                )
            )
            return True

        def do_GET(self) -> None:
            if not self._host_refused():
                self._send(console.handle("GET", self.path, {}))

        def do_HEAD(self) -> None:
            if not self._host_refused():
                self._send(console.handle("HEAD", self.path, {}), head=True)

        def do_POST(self) -> None:
            if self._host_refused():
                return
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = -1
            if not 0 <= length <= MAX_BODY_BYTES:
                self._send(console._error(400, f"a form must be at most {MAX_BODY_BYTES} bytes"))
                return
            raw = self.rfile.read(length).decode("utf-8", errors="replace")
            form = {k: v[-1] for k, v in parse_qs(raw, keep_blank_values=True).items()}
            self._send(console.handle("POST", self.path, form))

        def _refuse(self) -> None:
            self._send(console._error(405, f"{self.command} is not served here"))

        do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_TRACE = do_CONNECT = _refuse  # noqa: N815

        def send_error(
            self, code: int, message: str | None = None, explain: str | None = None
        ) -> None:
            """http.server's own refusals (a malformed request line, a URL too long, an
            unknown method): the console's error page, not http.server's."""
            reason = message or self.responses.get(code, ("error",))[0]
            try:
                response = console._error(code, f"{code}: {reason}")
                self.close_connection = True
                self._send(response, head=self.command == "HEAD")
            except Exception:  # the connection is gone
                self.close_connection = True

        def log_message(self, format: str, *args: Any) -> None:
            if log is not None:
                log(console.redact(f"{self.address_string()} {format % args}"))

    return Handler


class ConsoleServer(ThreadingHTTPServer):
    """The HTTP server of one :class:`Console`; :meth:`stop` ends both."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], handler: Any, console: Console) -> None:
        super().__init__(address, handler)
        self.console = console
        self._serving = threading.Event()

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        self._serving.set()
        super().serve_forever(poll_interval)

    def stop(self) -> None:
        """Stop serving (when serving), close the socket, stop the refresh thread."""
        if self._serving.is_set():
            self.shutdown()
        self.server_close()
        self.console.close()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        shown = host if isinstance(host, str) else host.decode()
        return f"http://{'[' + shown + ']' if ':' in shown else shown}:{port}"


def make_server(
    console: Console, host: str, port: int, *, log: Callable[[str], None] | None = None
) -> ConsoleServer:
    """Bound and listening (port 0: a free one, see ``server_address``); serve with
    ``serve_forever`` and end with ``shutdown`` and ``server_close``."""
    loopback = host in LOOPBACK_NAMES or host.startswith("127.")
    allowed = LOOPBACK_NAMES | {host} if loopback else None
    return ConsoleServer((host, port), _handler(console, log, allowed), console)


def serve_in_thread(server: ConsoleServer) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, name="kstore-console-http", daemon=True)
    thread.start()
    return thread
