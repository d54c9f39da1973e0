"""One dataclass module per params.yaml section: a stage imports only the sections it reads,
so an edit to one section's settings reruns only the stages that read it."""
