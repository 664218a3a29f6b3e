"""Canopy kernel: the data model, settings, store, tokenizer and providers shared by
`indexer`, `acl` and `server`. Import direction is one way: server -> (indexer, acl) -> canopy."""
