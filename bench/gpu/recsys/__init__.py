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

bench/gpu/dlrm_v2_perf.py's steps (MLPerf DLRM-v2 served against bare PyTorch) reuse fixture.py,
cache.py, networks.py, measure.py and gpu_busy.py, and have modules of their own:

- dlrm_v2_model.py: DLRM-v2's shape (hotness, key columns, row size, MLPerf's mean query) and
  the FP8 network's calibration inputs; clock.py: the phases and the seconds left of the budget;
- dlrm_v2_options.py: the command's arguments; dlrm_v2_plan.py: the cache's plan, the pairs
  drawn and the key pools perf_analyzer cycles; dlrm_v2_repository.py: its three models;
- dlrm_v2_served.py: the served phase (server up, exactness, the runs, the stream, server down);
  dlrm_v2_exactness.py: pooled rows and predictions against float64 sums;
- perf_analyzer.py: perf_analyzer's command lines, calls with a time limit, CSVs;
  dlrm_v2_runs.py: its runs (and the C API's), each with its console line and runs.json row;
  host_use.py: the host's CPU over a run and the backend's timing lines;
- dlrm_v2_stream.py: the endless stream (examples/stream_client.rs, keys in GPU memory);
- dlrm_v2_reference.py: the bare PyTorch reference and its compile in a child process;
- dlrm_v2_results.py: runs.json, setup.json, perf.tgz, the report and the targets printed.

bench/gpu/dlrm_v2_fair.py's phases (the served DLRM-v2 against a bare reference of the same
precision and overlap, one call) reuse clock.py, fixture.py, networks.py, dlrm_v2_model.py and
dlrm_v2_plan.py, and have modules of their own:

- dlrm_v2_fair_model.py: DLRM-v2's shape written out (no torch for the driver), the console line;
- dlrm_v2_fair_options.py: the command's arguments;
- dlrm_v2_fair_phases.py: the driver's phases, each within --deadline-s, and results.json;
- dlrm_v2_fair_served.py: the packages' exports and dlrm_v2_perf.py's served runs;
- dlrm_v2_fair_reference.py: the bare reference (F.embedding_bag and the compiled network as
  CUDA graphs, one after the other and on streams) in its child process, and its accuracy;
- dlrm_v2_fair_report.py: the dense peaks, the figures and ratios, fair.png and README.md.

bench/gpu/dlrm_v3_perf.py (DLRM-v3 served) reuses measure.py and transcript.py, and has
user_stream.py: its stream of users without end, drawn by processes while it serves.
"""
