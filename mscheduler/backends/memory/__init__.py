"""The embedded backend: mongomock-motor (`server`), a change feed of its own (`changefeed`)
and the index check that makes it refuse a query no declared index serves (`index_plan`)."""
