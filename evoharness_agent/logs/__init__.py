"""Logs in and out: importers, the recorder and its PII scrubber, message conversion, bundled data."""
