"""Sessions: how a consumer reaches the engine. See :mod:`.base` for the seam.

``embedded.py`` runs an engine in the consumer's process; ``remote.py`` (with
``remote_plan.py``) asks the node daemon instead, over its client half
(:mod:`stager.daemon_client`); ``failover.py`` wraps the two into the session
a consumer of the daemon gets, which reconnects to a restarted daemon or falls
back to its own engine; ``choice.py`` has :func:`open_session`, which picks.
"""

from .base import DatasetHandle, PlanHandle, Session
from .choice import open_session
from .embedded import EmbeddedSession
from .failover import RemoteSession
from .remote import DaemonSession

__all__ = ["DaemonSession", "DatasetHandle", "EmbeddedSession", "PlanHandle", "RemoteSession", "Session",
           "open_session"]
