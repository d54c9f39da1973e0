"""The shared core: what every stage and the flows read, torch-free but for dist and allocator.

settings (params.yaml read into dataclasses; errors name the file and the dotted key) and
sections/ (one dataclass module per params.yaml section), presets (params.yaml as a whole),
files (atomic writes, hashes), ids (the special tokens), layout (a package's files), metrics
(where the flows find each value), card (the model card), dist (the process group),
allocator and cpu_share (the process's memory and cores).

Promise: imports nothing from transformer's other subpackages.
"""
