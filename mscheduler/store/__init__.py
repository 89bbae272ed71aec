"""The only code that sends anything to MongoDB: it runs the builders of `queries` against a
collection and turns documents into models and driver errors into mscheduler errors. One
method per round trip (or per bounded walk of them); no loops that outlive a call, no task
groups: those are `services`. It imports nothing of them and keeps no process state: the
composition root (`services.root`) builds the store, then the services over it, and hands the
store what its writes tell them (the Protocols `finishes.FinishWrites`,
`tasks.DependentsOwed` and `claims.ClaimTurns`).

- `components`: `Store`, each capability a part of it, all built there (``store.publisher``,
  ``store.operations``, ``store.batches`` ...);
- `base`: the state every part shares, reads by key, indexes, a batch's session; `collection`:
  `TasksCollection`, the collection as the calls we make; `whole`: the store as the parts built
  on it see it;
- `tasks`: `TaskStore` (``store.tasks``), claim, the lease's fenced writes;
- `driver`: pymongo's errors become mscheduler's (`driver_errors`);
- `claims`: batched claims, up to k tasks in two round trips;
- `finishes`: the round trips of a batch of finishes (its bulk write and its read back);
- `publisher`: idempotent publish and replace of a `PublishSpec`;
- `partitions`: a partitioned task's turn in its name's claim order, taken as it is published;
- `flows`: dependencies' writes: publishing dependents, telling them outcomes, late edges;
- `batches`: all-or-nothing groups of publishes and writes (`publish_many`, `commit`);
- `transactions`: a MongoDB transaction, or the memory backend's equivalent;
- `expiry`: ending the tasks not started by their ``expires_at``;
- `streams`: opening and closing change streams, and where one resumes (`ResumePoint`);
- `operations`: get, cancel, set options, list, retry, purge, statistics;
- `browse`: the dashboard's reads;
- `schedules`: schedule documents and publishing their occurrences;
- `pauses`: paused names; `limits`: limits per name and the tokens of their slots;
- `workers`: the live workers' entries; `stops`: remote stops asked of a worker;
- `controls`: the control version every control write bumps;
- `signal`: what writers bump, while some process polls, and that process reads between polls.
"""
