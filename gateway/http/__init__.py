"""HTTP plumbing shared by both APIs: guards, body handling, streaming framings, errors."""
