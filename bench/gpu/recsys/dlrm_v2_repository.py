"""bench/gpu/dlrm_v2_perf.py's model repository: dlrm_v2 (the recommender, examples/dlrm_v2.py's
config with this run's instances, batching, CUDA graphs and store), dlrm_v2_lookup (the embedding
engine alone on the same store) and dlrm_v2_queries (the non-batching twin in front of dlrm_v2)."""
import os
import shutil

import dlrm_v2

from .dlrm_v2_model import DIM, HOT, WIDTH
from .fixture import TABLES


def graph_batches(spec, max_batch):
    """The batch sizes the network's CUDA graphs are captured for ([] for off, None for the
    backend's powers of two). Finer than powers of two above 1024: a batch runs padded to its
    graph's size, and 8200 pairs padded to 16384 would double the network's work."""
    if spec == "off":
        return []
    if spec == "pow2":
        return None
    if spec == "auto":
        sizes = [1 << i for i in range(11) if 1 << i < max_batch]
        sizes += list(range(2048, max_batch, 2048))
        return sorted(set(sizes + [max_batch]))
    return sorted({int(x) for x in spec.split(",")})


def param(key, value):
    return f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}'


def replace_once(text, old, new):
    # examples/dlrm_v2.config is the model's config; a change there must not go unnoticed here
    assert text.count(old) == 1, f"examples/dlrm_v2.config no longer holds {old!r}"
    return text.replace(old, new)


def write_repository(a, repo, fixture, package, graphs):
    """dlrm_v2 (the recommender), dlrm_v2_lookup (the embedding engine alone on the same store)
    and dlrm_v2_queries (the non-batching twin in front of dlrm_v2)."""
    shutil.rmtree(repo, ignore_errors=True)
    store = [param("sparse_files", ",".join(os.path.join(fixture, f"t{i}") for i in range(TABLES))),
             param("gpucacheper", a.cache), param("gpucache_allocation", a.allocation),
             # one cache per GPU for both instances (two copies would not fit at --cache 1.0)
             param("gpucache_sharing", "device"), param("gpucache_row_type", a.cache_rows),
             param("gpucache_policy", a.cache_policy), param("gpucache_miss_reads", a.miss_reads),
             param("gpucache_key_index", getattr(a, "cache_key_index", "off")),
             param("gpucache_hit_stamp_every", getattr(a, "cache_hit_stamp_every", 1)),
             param("gpucache_placement", a.placement), param("gpucache_sharded_replicate", a.replicate_share),
             param("gpucache_sharded_memory_gb", a.sharded_memory_gb),
             # both models open one store: the rows are in memory once
             param("store_name", os.path.basename(os.path.normpath(fixture))), param("host_memory", a.host_memory)]
    if getattr(a, "cache_pinned_keys", ""):  # the keys pinned caches hold
        store.append(param("gpucache_pinned_keys", a.cache_pinned_keys))
    if a.cache_state_dir:  # warm restarts: the caches' keys saved there and loaded at start
        store += [param("cache_state_dir", a.cache_state_dir), param("cache_state_period_s", a.cache_state_period_s)]
    on = f" gpus: [ {', '.join(a.gpus.split(','))} ]" if a.gpus else ""
    group = f"instance_group [ {{ count: {a.instances} kind: KIND_GPU{on} }} ]"
    batching = f"dynamic_batching {{ max_queue_delay_microseconds: {a.max_queue_delay_us} }}"

    text = dlrm_v2.config("dlrm_v2", a.max_batch, "KIND_GPU", "dense.pt2")
    text = replace_once(text, "dynamic_batching { max_queue_delay_microseconds: 100 }", batching)
    text = replace_once(text, "instance_group [ { count: 1 kind: KIND_GPU } ]", group)
    if graphs is None:
        text += "optimization { cuda { graphs: true } }\n"
    elif graphs:
        text += ("optimization { cuda { graphs: true graph_spec [ "
                 + ", ".join(f"{{ batch_size: {b} }}" for b in graphs) + " ] } }\n")
    text += "\n".join(store + [param("recommender_embeddings_type", "TYPE_FP16"),
                               param("recommender_pipeline_parts", a.pipeline_parts)]) + "\n"
    os.makedirs(os.path.join(repo, "dlrm_v2", "1"))
    shutil.copyfile(package, os.path.join(repo, "dlrm_v2", "1", "dense.pt2"))
    with open(os.path.join(repo, "dlrm_v2", "config.pbtxt"), "w") as f:
        f.write(text)

    lookup = ['name: "dlrm_v2_lookup"', 'backend: "rust"', f"max_batch_size: {a.max_batch}",
              f'input [ {{ name: "KEYS" data_type: TYPE_INT64 dims: [ {WIDTH} ] }} ]',
              f'output [ {{ name: "OUTPUT0" data_type: TYPE_FP16 dims: [ {TABLES}, {DIM} ] }} ]', batching, group,
              param("engine", "embedding"), param("embedding_interface", "pooled"),
              param("embedding_table_names", ",".join(f"t{i}" for i in range(TABLES))),
              param("embedding_vecsize_per_table", DIM), param("embedding_hotness_per_table", ",".join(map(str, HOT))),
              param("embedding_combiner", "sum"), param("default_value_for_each_table", 0), *store]
    os.makedirs(os.path.join(repo, "dlrm_v2_lookup", "1"))
    with open(os.path.join(repo, "dlrm_v2_lookup", "config.pbtxt"), "w") as f:
        f.write("\n".join(lookup) + "\n")

    # Triton's ensembles accept a non-batching tensor [-1, d] for a batching model's [d]: a
    # query of n pairs reaches dlrm_v2 as a request of batch n, batched with the others there
    twin = ['name: "dlrm_v2_queries"', 'platform: "ensemble"', "max_batch_size: 0",
            'input [ { name: "dense" data_type: TYPE_FP32 dims: [ -1, 13 ] },',
            f'        {{ name: "sparse" data_type: TYPE_INT64 dims: [ -1, {WIDTH} ] }} ]',
            'output [ { name: "prediction" data_type: TYPE_FP32 dims: [ -1, 1 ] } ]',
            'ensemble_scheduling { step [ { model_name: "dlrm_v2" model_version: -1 '
            'input_map { key: "dense" value: "dense" } input_map { key: "sparse" value: "sparse" } '
            'output_map { key: "prediction" value: "prediction" } } ] }']
    os.makedirs(os.path.join(repo, "dlrm_v2_queries", "1"))
    with open(os.path.join(repo, "dlrm_v2_queries", "config.pbtxt"), "w") as f:
        f.write("\n".join(twin) + "\n")
