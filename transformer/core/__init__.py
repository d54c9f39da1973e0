"""The shared core: what every stage and the flows read, torch-free but for dist and allocator.

settings (params.yaml read into dataclasses; errors name the file and the dotted key) and
sections/ (one dataclass module per params.yaml section), presets (params.yaml as a whole),
files (atomic writes, hashes), ids (the special tokens), layout (a package's files), metrics
(where the flows find each value), failure (a stage's failure record), hardware (where and how
a model trained), card and curves (the model card and its pictures), dist (the process group)
and allocator (the process's memory).

Promise: imports nothing from transformer's other subpackages.
"""
