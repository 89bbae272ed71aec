"""The only code that sends anything to MongoDB: it runs the builders of `queries` against a
collection and turns documents into models and driver errors into mscheduler errors.

- `tasks`: `TaskStore`, reads, claim, the lease's fenced writes, options, cancel, indexes;
- `publisher`: idempotent publish and replace; `flows`: dependencies' writes;
- `batches` and `transactions`: all-or-nothing groups of writes;
- `streams`: opening change streams; `waiting`: waiting for tasks to end;
- `operations`: list, retry, purge, statistics.
"""
