"""Attention Is All You Need as a pipeline. The modules at this level are what people run:

    download -> parent -> tokenizer -> shard -> train -> average -> evaluate -> package
    (python -m transformer.<stage>; dvc.yaml chains them, flows/ orchestrates them)

and the other command lines: decode (transformer-translate), export (transformer-export),
config (params.yaml and the presets) and launch (torchrun with preemption notices).

The library beneath them, importing one way (core <- data <- model <- training):
core/ (settings, files, metrics, dist), data/ (text in, batches out), model/ (the network and
its decoding), training/ (one run's parts). This package never imports prefect.
"""
