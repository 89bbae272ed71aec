"""The only code that sends anything to MongoDB: it runs the builders of `queries` against a
collection and turns documents into models and driver errors into mscheduler errors.

- `components`: `Store`, the one object the API holds, each capability a part of it, all built there
  (``store.publisher``, ``store.operations``, ``store.batches``, ``store.waiting`` ...);
- `base`: the state every part shares, reads by key, indexes, a batch's session; `collection`:
  `TasksCollection`, the collection as the calls we make; `whole`: the store as the parts built
  on it see it;
- `tasks`: `TaskStore` (``store.tasks``), claim, the lease's fenced writes;
- `driver`: pymongo's errors become mscheduler's (`driver_errors`);
- `publisher`: idempotent publish and replace of a `PublishSpec`; `flows`: dependencies' writes;
- `batches` and `transactions`: all-or-nothing groups of writes;
- `streams`: opening change streams; `waiting`: waiting for tasks to end;
- `operations`: get, cancel, set options, list, retry, purge, statistics; `browse`: the
  dashboard's reads.
"""
