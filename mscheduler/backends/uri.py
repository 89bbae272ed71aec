"""Turn a URI into a collection: ``memory://[NAME]`` in process, ``mongodb[+srv]://`` a server."""

from __future__ import annotations

import difflib
import inspect
import logging
import re
import sys
import urllib.parse
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypedDict, TypeVar

import pymongo.common
from pymongo import AsyncMongoClient
from pymongo.collection import Collection as SyncCollection
from pymongo.errors import ConfigurationError as PyMongoConfigurationError
from pymongo.errors import InvalidURI, OperationFailure, PyMongoError

from .. import layout
from ..errors import BackendUnavailable, ConfigurationError, MSchedulerError
from ..models import ConnectParams, check_params

log = logging.getLogger(__name__)

DEFAULT_SERVER_SELECTION_TIMEOUT_MS = 10_000
_MEMORY_OPTIONS = {"notablescan", "changestreams"}


class OpenOptions(TypedDict):
    """What opening a collection takes of `models.ConnectParams` (the clock is the
    scheduler's, not the connection's)."""

    database: str | None
    collection: str
    server_selection_timeout_ms: int


def open_options(params: ConnectParams, method: str) -> OpenOptions:
    """The options of a ``connect`` (`Scheduler.connect`, `SyncScheduler.connect`, both
    declared by `ConnectParams`) that open the collection, with their defaults; a keyword
    `ConnectParams` does not name is refused as a signature would."""
    check_params(params, ConnectParams, method)
    return {
        "database": params.get("database"),
        "collection": params.get("collection", layout.DEFAULT_COLLECTION),
        "server_selection_timeout_ms": params.get(
            "server_selection_timeout_ms", DEFAULT_SERVER_SELECTION_TIMEOUT_MS
        ),
    }


@dataclass
class Connection:
    collection: Any
    close: Callable[[], Awaitable[None]]
    kind: str  # "memory" or "mongodb"


def redact(uri: str) -> str:
    """The URI without its password, for messages and logs."""
    return re.sub(r"(://[^:/@]+:)[^@/]*@", r"\1***@", uri)


# AuthenticationFailed, Unauthorized: the server answered, and said no to these credentials.
_AUTH_FAILED = (18, 13)


async def _nothing_to_close() -> None:
    return None


async def open_collection(
    uri: str,
    *,
    database: str | None = None,
    collection: str = layout.DEFAULT_COLLECTION,
    server_selection_timeout_ms: int = DEFAULT_SERVER_SELECTION_TIMEOUT_MS,
) -> Connection:
    if not isinstance(uri, str) or "://" not in uri:
        raise ConfigurationError(
            f"uri: {uri!r} is not a URI; use memory://[NAME], mongodb:// or mongodb+srv://"
        )
    check_name("collection", collection)
    scheme = uri.split("://", 1)[0].lower()
    if scheme == "memory":
        return _open_memory(uri, database or layout.DEFAULT_DATABASE, collection)
    if scheme in ("mongodb", "mongodb+srv"):
        return await _open_mongodb(uri, database, collection, server_selection_timeout_ms)
    raise ConfigurationError(
        f"uri: unsupported scheme {scheme!r} in {redact(uri)!r}; use memory://[NAME], "
        "mongodb:// or mongodb+srv://"
    )


def is_private_memory(uri: str) -> bool:
    """A ``memory://`` URI whose database nobody else in this process has opened: what is
    written there is gone when the process exits, and no other process sees it."""
    try:
        parsed = urllib.parse.urlsplit(uri) if isinstance(uri, str) else None
    except ValueError:  # mongodb://[::1: not ours to judge; connecting says what is wrong
        return False
    if parsed is None or parsed.scheme.lower() != "memory":
        return False
    if not parsed.netloc or __package__ + ".memory.server" not in sys.modules:
        return True
    from .memory import memory_server_exists

    return not memory_server_exists(parsed.netloc)


def check_name(field: str, value: str) -> None:
    if not isinstance(value, str) or not value or any(ch in value for ch in "$\x00"):
        raise ConfigurationError(f"{field}: {value!r} is not a valid MongoDB {field} name")


ClientT = TypeVar("ClientT")


def new_client(
    client_class: Callable[..., ClientT], uri: str, server_selection_timeout_ms: int
) -> ClientT:
    """A client of ``client_class`` (async or sync) for ``uri``: timezone-aware dates, named in
    the server's logs, and a URI option pymongo does not know refused, not ignored."""
    check_uri_options(uri)
    options: dict[str, Any] = {"tz_aware": True, "appname": "mscheduler"}
    if "serverselectiontimeoutms" not in uri.lower():
        options["serverSelectionTimeoutMS"] = server_selection_timeout_ms
    try:
        # pymongo only warns about an unknown or invalid URI option, then ignores it: a typo
        # such as tls=ture would silently connect without TLS. Refuse it instead.
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)
            return client_class(uri, **options)
    except (InvalidURI, PyMongoConfigurationError, ValueError, TypeError, UserWarning) as exc:
        raise ConfigurationError(f"uri: {redact(uri)!r} is not a valid MongoDB URI: {exc}") from exc


def check_uri_options(uri: str) -> None:
    """Each ``?option=value`` of a MongoDB URI is one the driver knows, with a value it takes;
    the first that is not is named in our words (the driver's reason for a value in
    parentheses), so the message stays the same whichever pymongo is installed. Checks the
    driver makes on the whole URI (conflicting options) still apply when the client is made."""
    known = getattr(pymongo.common, "URI_OPTIONS_VALIDATOR_MAP", None)
    validate = getattr(pymongo.common, "validate", None)
    if not isinstance(known, dict) or validate is None:  # the driver moved them: it checks alone
        return
    query = uri.split("?", 1)[1] if "?" in uri else ""
    for name, value in urllib.parse.parse_qsl(query, keep_blank_values=True):
        if name.lower() not in known:
            close = difflib.get_close_matches(name.lower(), list(known), n=1)
            hint = f"; did you mean {close[0]!r}? (names ignore case)" if close else ""
            raise ConfigurationError(f"uri: {name!r} is not a MongoDB URI option{hint}")
        try:
            validate(name, value)
        except (PyMongoConfigurationError, ValueError, TypeError) as exc:
            shown = "***" if "password" in name.lower() else repr(value)
            raise ConfigurationError(
                f"uri: option {name}={shown} is not valid ({exc}); correct or remove it"
            ) from exc


def ping_failure(uri: str, exc: PyMongoError) -> MSchedulerError:
    """What a failed first ping means: the server answered with a refusal (the credentials,
    or another), or it could not be reached."""
    if isinstance(exc, OperationFailure):
        said = (exc.details or {}).get("errmsg") or str(exc)
        if exc.code in _AUTH_FAILED:
            return ConfigurationError(
                f"uri: MongoDB at {redact(uri)!r} refused the credentials: {said}"
            )
        return ConfigurationError(f"uri: MongoDB at {redact(uri)!r} refused: {said}")
    return BackendUnavailable(f"cannot reach MongoDB at {redact(uri)!r}: {exc}")


def _open_memory(uri: str, database: str, collection: str) -> Connection:
    parsed = urllib.parse.urlsplit(uri)
    if parsed.path not in ("", "/"):
        raise ConfigurationError(
            f"uri: {uri!r}: a memory URI is memory://[NAME][?notablescan=1&changestreams=0]"
        )
    options = urllib.parse.parse_qs(parsed.query, keep_blank_values=True)
    unknown = set(options) - _MEMORY_OPTIONS
    if unknown:
        raise ConfigurationError(f"uri: unknown memory:// option(s) {sorted(unknown)}")

    def flag(option: str, default: str) -> bool:
        return options.get(option, [default])[-1].lower() in ("1", "true", "yes")

    check_name("database", database)
    # Imported here: a worker on a real server never loads mongomock (nor pays its import).
    from .memory import memory_server

    server = memory_server(parsed.netloc)
    return Connection(
        server.collection(
            database,
            collection,
            notablescan=flag("notablescan", "0"),
            change_streams=flag("changestreams", "1"),
        ),
        _nothing_to_close,
        "memory",
    )


async def _open_mongodb(
    uri: str, database: str | None, collection: str, server_selection_timeout_ms: int
) -> Connection:
    client: AsyncMongoClient[dict[str, Any]] = new_client(
        AsyncMongoClient, uri, server_selection_timeout_ms
    )
    try:
        await client.admin.command("ping")
    except PyMongoError as exc:
        await client.close()
        raise ping_failure(uri, exc) from exc
    if database is None:
        database = client.get_default_database(default=layout.DEFAULT_DATABASE).name
    check_name("database", database)
    log.info(
        "connected to MongoDB",
        extra={"action": "connected", "uri": redact(uri), "database": database},
    )
    return Connection(client[database][collection], client.close, "mongodb")


def check_collection(collection: Any) -> None:
    """Refuse what is not an async collection: a sync pymongo one would block the event loop."""
    if isinstance(collection, SyncCollection):
        raise ConfigurationError(
            "collection: a synchronous pymongo Collection; pass an AsyncCollection "
            "(from AsyncMongoClient) or a Motor collection, or use ms.SyncScheduler"
        )
    method = getattr(collection, "find_one_and_update", None)
    is_motor = type(collection).__module__.split(".")[0] in ("motor", "mongomock_motor")
    if method is None or not (inspect.iscoroutinefunction(method) or is_motor):
        raise ConfigurationError(
            f"collection: expected an async MongoDB collection (pymongo AsyncCollection or "
            f"Motor), got {type(collection).__name__}"
        )
