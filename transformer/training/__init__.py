"""One training run's parts: the loop (its state between updates and the work of each of its
steps, which the train stage's train() calls in order), and the small objects it hands work to:
the update (learner, graphs), when to log, validate, save and stop (clock), exact resume, rewind
after divergence, preemption, checkpoint selection, the EMA, validation, the progress report,
and a continued retrain's start (continuation).

Promise: imports only transformer.core, transformer.data and transformer.model; never a stage.
"""
