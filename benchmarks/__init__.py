"""Measurements of the pipeline, grouped by what they measure: gpu/ (the GPU check), cpu/ (speed
on a CPU against the peers), scale/ (the data stages at WMT14's size), faults/ (the soak and
fault costs), quality/ (BLEU: model selection, continuation, sweeps). common.py holds what
several scripts share. Run a script as `python -m benchmarks.GROUP.NAME`; docs/benchmarks.md
lists them all."""
