"""Sessions: durable, replayable event logs and where they are stored."""

from typing import TYPE_CHECKING

from .._deprecate import renamed as _renamed
from ._blobs import BlobReader as BlobReader
from ._codec import decode_event as decode_event
from ._codec import decode_header as decode_header
from ._codec import encode_event as encode_event
from ._codec import encode_header as encode_header
from ._control import ApprovalDecisionLike as ApprovalDecisionLike
from ._events import FORMAT_VERSION as FORMAT_VERSION
from ._events import SessionHeader as SessionHeader
from ._follow_store import SessionFollower as SessionFollower
from ._jsonl import JsonlStore as JsonlStore
from ._persistence import LoadedSession as LoadedSession
from ._persistence import MailboxWriter as MailboxWriter
from ._persistence import MemoryStore as MemoryStore
from ._persistence import RemoteInbox as RemoteInbox
from ._persistence import ServerSideFork as ServerSideFork
from ._persistence import SessionStore as SessionStore
from ._pg_pooled import PooledPostgresStore as PooledPostgresStore
from ._pg_schema import SCHEMA_VERSION as SCHEMA_VERSION
from ._postgres import PostgresStore as PostgresStore
from ._registry import SessionEntry as SessionEntry
from ._registry import SessionRegistry as SessionRegistry
from ._session import Session as Session
from ._session import SessionWriter as SessionWriter
from ._session import validate_session_id as validate_session_id

if not TYPE_CHECKING:  # old names, kept for one release (docs/sessions.rst, "Renamed in this release")
    __getattr__ = _renamed(
        __name__,
        {
            "SessionPersistence": ("trio_harness.session.SessionStore", SessionStore),
            "MemoryPersistence": ("trio_harness.session.MemoryStore", MemoryStore),
            "JsonlPersistence": ("trio_harness.session.JsonlStore", JsonlStore),
            "PostgresPersistence": ("trio_harness.session.PostgresStore", PostgresStore),
        },
    )
del TYPE_CHECKING, _renamed  # end of old names
