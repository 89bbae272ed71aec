"""Where tasks are stored: the collections the store is given.

- ``uri``: a URI turned into a collection (``mongodb://``, ``mongodb+srv://``, ``memory://``);
- ``sync``: pymongo's synchronous client behind the async interface (for `SyncScheduler`);
- ``memory/``: the embedded in-process backend, an emulator of MongoDB (its package says what
  it costs; nothing outside it needs its modules);
- ``counting``: a collection wrapper that counts its round trips (the benchmarks' measure).
"""
