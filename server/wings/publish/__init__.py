"""The publishing wing: an index's committed generations as immutable snapshots at a URI (a local
folder or S3-compatible object storage), and the stateless replicas that serve them. Its extra,
[publish], brings obstore.

- `location`: the URI's objects (obstore: local files and S3 behind one API);
- `manifest`: the layout (content-addressed blobs, one manifest per generation, written last);
- `snapshot`: a consistent local copy of the committed generation, under the writer lock;
- `canopy.store.pages` (the core's): the database page by page, each page canonical (no byte
  SQLite left behind);
- `pagestore`: the database as encrypted page records and a page map per generation, so a
  generation uploads its changed pages and deleted text is erased with the old maps;
- `writer`: upload, manifest, garbage collection;
- `replica_cache`: a replica's local copy of a published generation;
- `publishing`: publishing a workspace's index (the writer lock, `index/watch --publish`);
- `replica`: `canopy serve --index-uri`;
- `publish_cli`: `canopy publish`.
"""
