"""The GPU check (`python -m benchmarks.gpu.check`, docs/gpu.md): training and decoding on one
GPU against its peers. check.py runs the sections and writes the figures; peers.py the workload
and the peer models; train.py our training contenders and the train stage itself; sections.py
the loss, decoding, profile and CUDA-test sections; report.py the ratios and decision rules;
test_limit.py a pytest plugin that bounds each CUDA test."""
