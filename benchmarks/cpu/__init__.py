"""Speed on a CPU: our training and decoding against the peers of ../shared/bench/peers
(train_bench, decode_bench, and the adapters and model construction the harness loads), and the
single-op and single-setting benchmarks: the output loss, attention, padding, the allocator's
memory, the Multi30k step's matmul share (MFU), the exported package's serving speed."""
