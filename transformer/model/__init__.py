"""The network and its decoding: the Transformer in paper order (network) and its fused ops,
checkpoints, the incremental decoder and beam search, the Translator that the translate CLI,
evaluation and validation decode through, sacreBLEU scoring, and CTranslate2's converter.

Promise: imports only transformer.core and transformer.data.
"""
