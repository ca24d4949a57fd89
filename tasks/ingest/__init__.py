"""Getting documents in: source specs resolved to files (local or fsspec URLs), directory walks,
byte decoding and mojibake repair (`ingest`), then main-text extraction from HTML/WARC pages with a
per-page watchdog (`extract`).

May import: `manifests`, `tasks.runner`.
"""
