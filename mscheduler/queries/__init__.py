"""Pure query builders, no I/O: every filter, update, pipeline, change-stream pipeline, sort
and projection that mscheduler sends to MongoDB, each beside the invariant it keeps. The
collections and indexes they rely on are `layout`.

- `tasks`: publish, claim, fetch, options, cancel, operating queries;
- `lease`: the fenced writes of a lease holder (ping, finish, release);
- `flows`: dependencies between tasks;
- `stages`: the aggregation stages every task write shares (expiry sweep, state recompute);
- `derived`: the derived fields recomputed at the end of every pipeline update;
- `templates`: update pipelines built once per shape, their arguments filled in per call;
- `timing`: expiry and debounce: when a waiting task may start;
- `history`: what a task's new run takes over from the old (earlier attempts, bounded);
- `retry_delay`: the delay after a failure, grown and spread, in the failure's write (every
  other retry rule, and where it is applied: `mscheduler.retry_policy`);
- `browse`: the dashboard's pages, projections and orders;
- `changes`: change-stream pipelines (the hub's, a watch's, `SyncScheduler`'s wait);
- `schedules`: schedule documents; `limits`: limits and their slots; `pauses`: paused names;
  `partitions`: partitions' turns in the claim order;
  `workers`: live workers' entries and remote stops; `controls`: the control version;
  `signal`: what writers bump and polling processes read between polls.
"""
