"""bench/gpu/recsys_perf.py's parts, one concern each (recsys_perf.py is the command; it sets
sys.path for them as every bench/gpu script does: bench/gpu, bench and examples):

- fixture.py: the Criteo tables (rows per table, where they are written, the rows recomputed
  from the fixture's seed);
- cache.py: the GPU cache's slots per table and its hit rates under a Zipf law (stationary,
  LRU by Che's approximation, the key pool that measures the stream's rate);
- plan.py: the (batch, concurrency) sweep and the key pools perf_analyzer cycles;
- networks.py: the dense network (TorchScript, or exported as an AOTInductor package);
- repository.py: the model repository (<m>_sparse, <m>_dense, <m>_ens, <m>_one);
- bare.py: the figures without the server (all tables in HBM in torch; aoti_bare);
- measure.py: perf_analyzer runs and the server's metrics and statistics;
- exactness.py: served rows against the fixture's, the single model against the ensemble;
- stream.py: the endless stream (stream_load.py) beside perf_analyzer's rows;
- runs.py: the served phase, with its console lines; options.py: the command's arguments.
"""
