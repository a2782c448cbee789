"""The model repository a run serves: for each recommender <m>, the embedding model
(<m>_sparse), the network (<m>_dense), Triton's ensemble of the two (<m>_ens) and the
recommender engine's single model (<m>_one), all without batching."""
import os
import shutil

from .fixture import TABLES


def tensor(name, dtype, dims):
    return f'{{ name: "{name}" data_type: {dtype} dims: [ {", ".join(str(d) for d in dims)} ] }}'


def write_models(repo, name, dense_pt, fixture, dim, share, kind, allocation, graphs=False, host_memory="mapped", graph_rows=(),
                 one_instances=1, rows_type="TYPE_FP32", pipeline_parts=1, key_upload=None, torch_params=(), one_pt2=None,
                 hit_rate_threshold="", cache_sharing="device", cache_rows_type="fp32", gpus=""):
    """<name>_sparse, <name>_dense, <name>_ens and <name>_one, all without batching; `one_pt2`:
    the single model's network as an AOTInductor package (dense.pt2) instead of the TorchScript
    file the ensemble's network serves. Every
    model on one fixture shares one store (`store_name`: the fixture's folder), so its rows
    are in memory once whichever recommenders are served. `rows_type`: the embeddings
    between lookup and network (the sparse model's OUTPUT0 and the network's input)."""
    files = ",".join(os.path.join(fixture, f"t{i}") for i in range(TABLES))
    store = [
        f'parameters {{ key: "embedding_table_names" value {{ string_value: "{",".join(f"t{i}" for i in range(TABLES))}" }} }}',
        f'parameters {{ key: "embedding_vecsize_per_table" value {{ string_value: "{dim}" }} }}',
        f'parameters {{ key: "sparse_files" value {{ string_value: "{files}" }} }}',
        f'parameters {{ key: "gpucacheper" value {{ string_value: "{share}" }} }}',
        f'parameters {{ key: "gpucache_allocation" value {{ string_value: "{allocation}" }} }}',
        f'parameters {{ key: "store_name" value {{ string_value: "{os.path.basename(os.path.normpath(fixture))}" }} }}',
        f'parameters {{ key: "host_memory" value {{ string_value: "{host_memory}" }} }}',
    ]
    store.append(f'parameters {{ key: "gpucache_sharing" value {{ string_value: "{cache_sharing}" }} }}')
    store.append(f'parameters {{ key: "gpucache_row_type" value {{ string_value: "{cache_rows_type}" }} }}')
    if hit_rate_threshold:
        store.append(f'parameters {{ key: "hit_rate_threshold" value {{ string_value: "{hit_rate_threshold}" }} }}')
    if key_upload:
        piece, tasks = key_upload
        store += [f'parameters {{ key: "gpu_key_piece" value {{ string_value: "{piece}" }} }}',
                  f'parameters {{ key: "gpu_key_upload_tasks" value {{ string_value: "{tasks}" }} }}']
    # `gpus` (e.g. "0,1"): the instance groups' devices, `count` instances on each; empty:
    # Triton's default, `count` on every GPU it sees
    on = f" gpus: [ {', '.join(gpus.split(','))} ]" if gpus and kind == "KIND_GPU" else ""
    group = f"instance_group [ {{ count: 1 kind: {kind}{on} }} ]"
    # the single model's instances: they share one cache per GPU (gpucache_sharing device),
    # or each holds its own of the same share (instance)
    one_group = f"instance_group [ {{ count: {one_instances} kind: {kind}{on} }} ]"
    # the network's CUDA graphs: one per request shape (no batching), captured at its first
    # request; with graph_rows only for requests of those rows (graph_spec's batch sizes)
    spec = f" graph_spec [ {', '.join(f'{{ batch_size: {r} }}' for r in graph_rows)} ]" if graph_rows else ""
    opt = [f"optimization {{ cuda {{ graphs: true{spec} }} }}"] if graphs else []
    # torch engine parameters of the network (e.g. TORCH_FUSION_STRATEGY), in both paths
    opt += [f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}' for k, v in torch_params]
    dense_in = tensor("dense", "TYPE_FP32", [-1, 13])
    sparse_in = tensor("sparse", "TYPE_INT64", [-1, TABLES])
    pred = tensor("prediction", "TYPE_FP32", [-1, 1])

    def put(model, lines, files=()):
        d = os.path.join(repo, model, "1")
        os.makedirs(d, exist_ok=True)
        for dst, src in files:
            shutil.copyfile(src, os.path.join(d, dst))
        with open(os.path.join(repo, model, "config.pbtxt"), "w") as f:
            f.write("\n".join([f'name: "{model}"', *lines, ""]))

    put(f"{name}_sparse", ['backend: "rust"', "max_batch_size: 0",
                           f'input [ {tensor("KEYS", "TYPE_INT64", [-1, TABLES])} ]',
                           f'output [ {tensor("OUTPUT0", rows_type, [-1, TABLES, dim])} ]', group,
                           'parameters { key: "engine" value { string_value: "embedding" } }',
                           'parameters { key: "embedding_interface" value { string_value: "batched" } }', *store])
    put(f"{name}_dense", ['backend: "rust"', "max_batch_size: 0",
                          f'input [ {dense_in}, {tensor("embeddings", rows_type, [-1, TABLES, dim])} ]',
                          f"output [ {pred} ]", group, *opt,
                          'parameters { key: "engine" value { string_value: "torch" } }'], [("model.pt", dense_pt)])
    put(f"{name}_ens", ['platform: "ensemble"', "max_batch_size: 0", f"input [ {dense_in}, {sparse_in} ]", f"output [ {pred} ]",
                        "ensemble_scheduling { step [",
                        f'  {{ model_name: "{name}_sparse" model_version: -1 input_map {{ key: "KEYS" value: "sparse" }} '
                        'output_map { key: "OUTPUT0" value: "embeddings" } },',
                        f'  {{ model_name: "{name}_dense" model_version: -1 input_map {{ key: "dense" value: "dense" }} '
                        'input_map { key: "embeddings" value: "embeddings" } output_map { key: "prediction" value: "prediction" } }',
                        "] }"])
    # the torch engine's parameters do not apply to a package
    one_opt = [o for o in opt if not o.startswith("parameters")] if one_pt2 else opt
    put(f"{name}_one", ['backend: "rust"', "max_batch_size: 0", f"input [ {dense_in}, {sparse_in} ]", f"output [ {pred} ]", one_group,
                        *one_opt, 'parameters { key: "engine" value { string_value: "recommender" } }',
                        f'parameters {{ key: "recommender_embeddings_type" value {{ string_value: "{rows_type}" }} }}',
                        f'parameters {{ key: "recommender_pipeline_parts" value {{ string_value: "{pipeline_parts}" }} }}', *store],
        [("dense.pt2", one_pt2)] if one_pt2 else [("dense.pt", dense_pt)])
