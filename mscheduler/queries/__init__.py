"""Pure query builders, no I/O: every filter, update pipeline, sort and projection that
mscheduler sends to MongoDB, each beside the invariant it keeps.

- `tasks`: publish, claim, fetch, options, cancel, operating queries;
- `lease`: the fenced writes of a lease holder (ping, finish, release);
- `flows`: dependencies between tasks;
- `stages`: the aggregation stages they share (expiry sweep, state recompute).
"""
