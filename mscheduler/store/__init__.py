"""The only code that sends anything to MongoDB: it runs the builders of `queries` against a
collection and turns documents into models and driver errors into mscheduler errors.

- `components`: `Store`, the `TaskStore` the API holds, each capability a component of it
  (``store.publisher``, ``store.operations``, ``store.batches``, ``store.waiting`` ...);
- `tasks`: `TaskStore`, reads, claim, the lease's fenced writes, indexes;
- `driver`: pymongo's errors become mscheduler's (`driver_errors`);
- `publisher`: idempotent publish and replace of a `PublishSpec`; `flows`: dependencies' writes;
- `batches` and `transactions`: all-or-nothing groups of writes;
- `streams`: opening change streams; `waiting`: waiting for tasks to end;
- `operations`: get, cancel, set options, list, retry, purge, statistics; `browse`: the
  dashboard's reads.
"""
