"""What a consumer reads: its subscription (topics or a pattern) or manual assignment, the
partitions assigned to it, their positions and which are paused (Kafka's SubscriptionState).

It holds state only: the group membership decides a subscribed consumer's assignment, the
fetcher advances positions. Whatever changes what a fetch reads (an assignment, a seek, a
resume) is announced through ``on_change``, so that the consumer's other parts drop what they
buffered or planned for the old one.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Set
from typing import Protocol

from kstore.errors import (
    IllegalStateError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
)
from kstore.names import validate_topic_name
from kstore.records import OffsetAndMetadata, TopicPartition
from kstore.store import Store


class ConsumerRebalanceListener(Protocol):
    """Called from poll(). A listener may also define ``on_partitions_lost(lost)``, called
    instead of ``on_partitions_revoked`` when the member was expelled from the group (its
    partitions may already have another reader, so nothing can be committed for them); as in
    Kafka, ``on_partitions_revoked`` is called when it does not."""

    def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None: ...

    def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None: ...


class SubscriptionState:
    """A consumer's subscription, assignment, positions and pauses."""

    def __init__(self, store: Store, on_change: Callable[[], None]) -> None:
        self._store = store
        self._on_change = on_change
        self._topics: set[str] | None = None
        self._pattern: re.Pattern[str] | None = None
        self._listener: ConsumerRebalanceListener | None = None
        self._manual = False
        self._assigned: list[TopicPartition] = []
        self._positions: dict[TopicPartition, int] = {}
        self._paused: set[TopicPartition] = set()

    # -- subscription ------------------------------------------------------------------------------

    def subscribe(
        self,
        topics: Iterable[str] | str = (),
        pattern: str | None = None,
        listener: ConsumerRebalanceListener | None = None,
    ) -> None:
        """Subscribe to topics or to those a regex ``pattern`` matches now (the assignment is
        set apart: by the group, or to every partition of them)."""
        if self._manual:
            raise IllegalStateError("subscribe() after assign(): call unsubscribe() first")
        names = [topics] if isinstance(topics, str) else list(topics)
        if bool(names) == bool(pattern):
            raise IllegalStateError("subscribe() needs either topics or a pattern, not both")
        for topic in names:
            validate_topic_name(topic)
        self._pattern = re.compile(pattern) if pattern else None
        self._listener = listener
        self._topics = set(names) if names else self.matching_topics()

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Read exactly these partitions (each must exist), outside any group assignment."""
        if self._topics is not None:
            raise IllegalStateError("assign() after subscribe(): call unsubscribe() first")
        parts = []
        for tp in partitions:
            if not isinstance(tp, tuple) or len(tp) != 2:
                raise InvalidArgumentTypeError(f"assign() takes TopicPartition values, got {tp!r}")
            tp = TopicPartition(validate_topic_name(tp[0]), tp[1])
            self._store.partition(tp.topic, tp.partition)  # exists?
            parts.append(tp)
        self._manual = True
        self.set_assignment(parts)

    def unsubscribe(self) -> None:
        self.set_assignment([])
        self._topics = None
        self._pattern = None
        self._manual = False

    @property
    def topics(self) -> Set[str] | None:
        """The topics subscribed to (None: not subscribed)."""
        return self._topics

    @property
    def pattern(self) -> re.Pattern[str] | None:
        return self._pattern

    @property
    def listener(self) -> ConsumerRebalanceListener | None:
        return self._listener

    @property
    def manual(self) -> bool:
        """Whether the partitions were assigned by assign() rather than a subscription."""
        return self._manual

    @property
    def active(self) -> bool:
        """Whether there is anything to read: a subscription or a manual assignment."""
        return self._topics is not None or self._manual

    def matching_topics(self) -> set[str]:
        """The store's topics the subscription's pattern matches now."""
        assert self._pattern is not None
        pattern = self._pattern
        return {t for t in self._store.list_topics() if pattern.fullmatch(t)}

    def follow_pattern(self) -> None:
        """Subscribe to the topics the pattern matches now (a member that rejoins)."""
        if self._pattern is not None:
            self._topics = self.matching_topics()

    def subscribed_partitions(self) -> list[TopicPartition]:
        """Every partition of every subscribed topic, as a consumer without a group reads."""
        out: list[TopicPartition] = []
        for topic in sorted(self._topics or ()):
            meta = self._store.topic(topic)
            out.extend(TopicPartition(topic, p) for p in range(meta.partitions))
        return out

    # -- assignment and positions -------------------------------------------------------------------

    @property
    def assigned(self) -> list[TopicPartition]:
        """The assigned partitions, sorted: a new list at every change of assignment (compared
        by identity to tell one), never changed in place (callers must not change it)."""
        return self._assigned

    def set_assignment(self, partitions: Iterable[TopicPartition]) -> None:
        """Assign these partitions; those no longer assigned lose their positions and pauses."""
        self._assigned = sorted(set(partitions))
        keep = set(self._assigned)
        self._positions = {tp: o for tp, o in self._positions.items() if tp in keep}
        self._paused &= keep
        self._on_change()

    def _check_assigned(self, tp: TopicPartition) -> None:
        if tp not in self._assigned:
            raise IllegalStateError(f"{tp} is not assigned to this consumer")

    @property
    def positions(self) -> Mapping[TopicPartition, int]:
        """The next offset to read of each partition that has one (read only: see
        set_position, forget_position, seek)."""
        return self._positions

    def offsets_to_commit(self) -> dict[TopicPartition, OffsetAndMetadata]:
        """The positions of the assigned partitions, as offsets to commit."""
        assigned = self._assigned
        return {tp: OffsetAndMetadata(o) for tp, o in self._positions.items() if tp in assigned}

    def set_position(self, tp: TopicPartition, offset: int) -> None:
        """The fetcher's: where reading ``tp`` goes on from."""
        self._positions[tp] = offset

    def forget_position(self, tp: TopicPartition) -> None:
        self._positions.pop(tp, None)

    def restore_positions(self, saved: dict[TopicPartition, int]) -> None:
        """Put back positions copied earlier (a poll that must not move them)."""
        self._positions = saved

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self._check_assigned(tp)
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise InvalidArgumentError(
                f"seek offset must be a non-negative integer, got {offset!r}"
            )
        self._positions[tp] = offset
        self._on_change()

    # -- pauses ------------------------------------------------------------------------------------

    @property
    def paused(self) -> Set[TopicPartition]:
        """The paused partitions (read only: see pause, resume)."""
        return self._paused

    def pause(self, *partitions: TopicPartition) -> None:
        for tp in partitions:
            self._check_assigned(tp)
            self._paused.add(tp)

    def resume(self, *partitions: TopicPartition) -> None:
        self._paused -= set(partitions)
        self._on_change()
