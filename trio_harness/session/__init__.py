"""Sessions: durable, replayable event logs and where they are stored."""

from ._codec import decode_event as decode_event
from ._codec import decode_header as decode_header
from ._codec import encode_event as encode_event
from ._codec import encode_header as encode_header
from ._events import FORMAT_VERSION as FORMAT_VERSION
from ._events import SessionHeader as SessionHeader
from ._jsonl import JsonlPersistence as JsonlPersistence
from ._persistence import LoadedSession as LoadedSession
from ._persistence import MailboxWriter as MailboxWriter
from ._persistence import MemoryPersistence as MemoryPersistence
from ._persistence import RemoteInbox as RemoteInbox
from ._persistence import ServerSideFork as ServerSideFork
from ._persistence import SessionPersistence as SessionPersistence
from ._pg_schema import SCHEMA_VERSION as SCHEMA_VERSION
from ._postgres import PostgresPersistence as PostgresPersistence
from ._session import Session as Session
from ._session import SessionWriter as SessionWriter
from ._session import validate_session_id as validate_session_id
from ._store import SessionEntry as SessionEntry
from ._store import SessionStore as SessionStore
