"""The safety verdicts, and fail-closed on missing evidence."""
