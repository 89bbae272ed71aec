"""The embedded ``memory://`` backend: MongoDB emulated in the process, for the default
``Scheduler()``, users' tests and every scenario test.

What it costs: it runs the store's real documents, filters and updates on mongomock, so it
re-executes its own copy of mongomock's engine (`engine`, pinned to one mongomock minor
release) with our corrections where mongomock differs from MongoDB (`agreement`), our speed-ups
(`fast_paths`, the indexes) and what mongomock lacks (change streams, document limits, an
index check). It is the largest package of the library, and the production queries keep to
what MongoDB, mongomock and the wire tier's mongoeco all evaluate alike
(`constants.OPERATORS`: no ``$mergeObjects``, no ``arrayFilters``, no ``$$NOW``). Nothing in
it is needed to understand the scheduler: read `store/` and `queries/` first.

The rest of the library, and every test but the unit tests of its internals, reach it through
the names exported here, never through its modules (`tests/unit/test_layout.py` checks the
library).

- ``server``: `MemoryServer` and `MemoryCollection`, the motor-like collection the store uses;
  ``memory_server(name)``, one server per ``memory://name`` in the process;
- ``changefeed``: change streams (``watch()``): one feed per database, resume tokens, history;
- ``change_events``: what the server does to an event before the reply (``$match``,
  ``$project``, the oplog-side filter);
- ``bulk``: ``bulk_write``, each request through the collection's own writes;
- ``inserts``: an upsert that matches nothing, put straight into the store;
- ``replies``: the small pymongo objects handed out besides documents (cursors, a database);
- ``document_size``: MongoDB's limits on a stored document (16 MiB, 100 levels);
- ``compact``: stored documents sharing their table of keys, in less memory;
- ``engine``: mongomock's query engine, loaded again as our own copy;
- ``agreement``: where mongomock evaluates otherwise than MongoDB, made to agree;
- ``fast_paths``: where mongomock is slower than it needs to be, made faster;
- ``indexed``: mongomock's collection reading through our indexes;
- ``index_plan``: would MongoDB answer a query from an index (the ``notablescan`` check);
- ``ordered_index``: declared indexes kept in order, scanned as a server scans them;
- ``hash_index``: single-field indexes kept as a hash (multikey and unique ``key``).
"""

from .server import (
    MemoryCollection,
    MemoryServer,
    forget_memory_server,
    memory_server,
    memory_server_exists,
)

__all__ = [
    "MemoryCollection",
    "MemoryServer",
    "forget_memory_server",
    "memory_server",
    "memory_server_exists",
]
