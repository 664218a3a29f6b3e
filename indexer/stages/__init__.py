"""The pipeline's stages, each a thin runner: read what it needs from the generation being built
(`Build.reads`: staged rows over committed ones), call the operations in indexer/ (chunking,
merging, clustering, report writing), stage the rows it produces. canopy.indexer.pipeline runs them
in order; every stage touches what changed plus a bounded neighbourhood."""

from canopy.indexer.stages.build import Build, BuildCounters, Progress

__all__ = ["Build", "BuildCounters", "Progress"]
