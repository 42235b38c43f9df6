"""The pipeline's stages, in data order: the reader (a chunk's rows, `where` applied), the stages
(windows encoded and cut into batches by the sampler's length buckets; `known`: results the
gate's model already gave), scoring in the model's thread (`static` batches or `continuous`
ones, out-of-memory splitting), and `assemble` (output rows in input order). `memory` runs a
frame through them as one shard. The recipes that wire them are `batchscore.recipes`'."""
