"""Published generations: an index's committed generations as immutable snapshots at a URI
(a local folder or S3-compatible object storage), for stateless replicas to serve.

- `location`: the URI's objects (obstore: local files and S3 behind one API);
- `manifest`: the layout (content-addressed blobs, one manifest per generation, written last);
- `snapshot`: a consistent local copy of the committed generation, under the writer lock;
- `pages`: the database page by page, each page canonical (no byte SQLite left behind);
- `pagestore`: the database as encrypted page records and a page map per generation, so a
  generation uploads its changed pages and deleted text is erased with the old maps;
- `writer`: upload, manifest, garbage collection;
- `reader`: a replica's local copy of a published generation.

Locks and the CLI live in `canopy.server.publishing`; replicas in `canopy.server.replica`.
"""
