"""One training run's parts, each a small object the train stage's loop hands work to: the
update (learner, graphs), when to log, validate, save and stop (clock), exact resume, rewind
after divergence, preemption, checkpoint selection, the EMA, validation, the progress report,
and a continued retrain's start (continuation).

Promise: imports only transformer.core, transformer.data and transformer.model; never a stage.
"""
