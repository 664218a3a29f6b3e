"""Access control: policies, principals and provenance-gated visibility (design §2, §5)."""
