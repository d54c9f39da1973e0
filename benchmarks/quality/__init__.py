"""Translation quality, not speed: which weights to ship (selection_bench), continuing against
retraining (continue_bench), valid BLEU during training (valid_bleu_bench), a Multi30k run's
report (multi30k_report) and the settings sweep (multi30k_sweep, multi30k_variants.yaml)."""
