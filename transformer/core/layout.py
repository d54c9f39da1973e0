"""A package's layout: the folder the package stage writes, the registry versions, `dvc
artifacts get` fetches and `transformer-translate --model DIR` reads. Torch-free, so the flows
name the same files as the stages."""

MODEL = "model.pt"  # the averaged weights (checkpoint format, weights only)
TOKENIZER = "tokenizer"  # the tokenizer folder (tokenizer.json + meta.json)
LINEAGE = "lineage.json"  # the evaluate metrics, the parent's and the training's record
PARAMS = "params.yaml"  # the recipe it was trained with (less NOT_PACKAGED)
CARD = "README.md"  # the model card (Hugging Face's front matter), also in each export
CURVES = "curves.svg"  # the training curves the card shows (transformer/core/curves.py)
EVAL = "eval"  # the scored sets' hypotheses: what the promotion gate's bootstrap reads
HF, CT2 = "hf", "ctranslate2"  # the exports' folders (package.hf, package.ctranslate2)

# params.yaml's sections about how the flows retrain and promote a model, not about the model:
# left out of a package's PARAMS, and so of the recipe's hash the retrain flow compares with the
# champion's (flows/lineage.py params_hash). The model card's recipe leaves out `package` too.
NOT_PACKAGED = ("retrain",)
