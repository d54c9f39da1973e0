"""Attention Is All You Need as a pipeline. The modules at this level are what people run:

    download -> score -> tokenizer -> shard -> train -> average -> evaluate -> package
    (python -m transformer.<stage>; dvc.yaml chains them, flows/ orchestrates them)

with the stages beside that chain: parent (the model a continued retrain starts from), helpers
(other lines' champions a run uses), backtranslate and distill (text those champions translate,
which shard mixes in) and race (a student against its teacher's speed); and the other command
lines: decode (transformer-translate), export (transformer-export), config (params.yaml and the
presets) and launch (torchrun with preemption notices).

The library beneath them, importing one way (core <- data <- model <- training):
core/ (settings, files, metrics, dist), data/ (text in, batches out), model/ (the network and
its decoding), training/ (one run's parts). This package never imports prefect.
"""
