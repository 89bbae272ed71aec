"""Where tasks are stored: `uri` turns a URI into a collection (`mongodb://`,
`mongodb+srv://`, `memory://`); `memory` is the embedded in-process backend;
`counting` wraps a collection to count its round trips (the benchmarks' measure)."""
