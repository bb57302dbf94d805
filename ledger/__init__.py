"""The usage ledger: one row per answered request, written off the request path."""
