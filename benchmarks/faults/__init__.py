"""Faults and soak: soak runs unattended retrain cycles with faults injected (soak_faults: the
corpus server, the supervisor and the faults; soak_train: the train stage's own faults and what
each cost); preempt_flag times the preemption notice's per-update all-reduce."""
