"""Sessions: how a consumer reaches the engine (embedded, or the node daemon). See :mod:`.base`;
:func:`open_session` picks one (:mod:`.remote`)."""

from .base import DatasetHandle, PlanHandle, Session
from .embedded import EmbeddedSession
from .remote import RemoteSession, open_session

__all__ = ["DatasetHandle", "EmbeddedSession", "PlanHandle", "RemoteSession", "Session", "open_session"]
