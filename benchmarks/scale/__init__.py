"""The data stages at scale: wmt14_rehearsal runs the wmt14-en-de-base preset at WMT14's size
against wmt_mirror, a loopback copy of the release files built from wmt_corpus's generated
WMT-shaped pairs (docs/scale.md)."""
