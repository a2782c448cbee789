use super::*;

const RESNET: &str = r#"{
        "name": "resnet50", "max_batch_size": 128,
        "input": [{"name": "INPUT__0", "data_type": "TYPE_FP32", "dims": ["3", "224", "224"]}],
        "output": [{"name": "OUTPUT__0", "data_type": "TYPE_FP32", "dims": [1000]}],
        "parameters": {"intra_op_thread_count": {"string_value": "2"}},
        "optimization": {"graph": {"level": "1"},
            "execution_accelerators": {"gpu_execution_accelerator": [{"name": "tensorrt", "parameters": {"precision_mode": "FP16"}}]}},
        "default_model_filename": ""
    }"#;

fn spec(name: &str, dtype: DataType, shape: &[i64]) -> TensorSpec {
    TensorSpec { name: name.into(), dtype, shape: shape.to_vec() }
}

#[test]
fn cuda_graph_buckets() {
    let cfg = |json: &str| ModelConfig::from_json(json).unwrap();
    assert_eq!(
        cfg(r#"{"max_batch_size": 8}"#).cuda_graph_buckets().unwrap(),
        None,
        "off unless asked for"
    );
    let on = r#"{"max_batch_size": 12, "optimization": {"cuda": {"graphs": true}}}"#;
    assert_eq!(cfg(on).cuda_graph_buckets().unwrap(), Some(vec![1, 2, 4, 8, 12]));
    let spec = r#"{"max_batch_size": 64, "optimization": {"cuda": {"graphs": true, "graph_spec": [{"batch_size": 32}, {"batch_size": "1"}]}}}"#;
    assert_eq!(cfg(spec).cuda_graph_buckets().unwrap(), Some(vec![1, 32]));
    let bad = r#"{"max_batch_size": 4, "optimization": {"cuda": {"graphs": true, "graph_spec": [{"batch_size": 8}]}}}"#;
    assert!(cfg(bad).cuda_graph_buckets().unwrap_err().to_string().contains("batch_size 8"));
    let unbatched = r#"{"max_batch_size": 0, "optimization": {"cuda": {"graphs": true}}}"#;
    assert_eq!(cfg(unbatched).cuda_graph_buckets().unwrap(), Some(vec![]));
    let rows = r#"{"max_batch_size": 0, "optimization": {"cuda": {"graphs": true, "graph_spec": [{"batch_size": 4096}, {"batch_size": "256"}, {"batch_size": 4096}]}}}"#;
    assert_eq!(
        cfg(rows).cuda_graph_buckets().unwrap(),
        Some(vec![256, 4096]),
        "without batching: the exact rows to graph"
    );
    let by_shape = r#"{"max_batch_size": 0, "optimization": {"cuda": {"graphs": true, "graph_spec": [{"batch_size": 0, "input": {"x": {"dim": ["4", "3"]}}}]}}}"#;
    assert_eq!(
        cfg(by_shape).cuda_graph_buckets().unwrap(),
        Some(vec![]),
        "entries by input shape name no rows: every shape"
    );
    let bad = r#"{"max_batch_size": 0, "optimization": {"cuda": {"graphs": true, "graph_spec": [{"batch_size": -2}]}}}"#;
    assert!(cfg(bad).cuda_graph_buckets().unwrap_err().to_string().contains("batch_size -2"));
}

#[test]
fn parses_triton_json() {
    let c = ModelConfig::from_json(RESNET).unwrap();
    assert_eq!(c.max_batch_size, 128);
    assert_eq!(c.inputs[0].dims, vec![3, 224, 224]);
    assert_eq!(c.outputs[0].dtype, DataType::F32);
    assert_eq!(c.parameter_usize("intra_op_thread_count").unwrap(), Some(2));
    assert_eq!(c.graph_optimization_level, Some(1));
    assert_eq!(c.gpu_accelerators[0].name, "tensorrt");
    assert_eq!(c.gpu_accelerators[0].parameters["precision_mode"], "FP16");
    assert_eq!(c.default_model_filename, None);
}

#[test]
fn bad_parameter_is_named() {
    let mut c = ModelConfig::from_json(RESNET).unwrap();
    c.parameters.insert("intra_op_thread_count".into(), "two".into());
    let e = c.parameter_usize("intra_op_thread_count").unwrap_err();
    assert!(e.message().contains("intra_op_thread_count"), "{e}");
}

#[test]
fn bad_dtype_is_named() {
    let e = ModelConfig::from_json(r#"{"input":[{"name":"A","data_type":"TYPE_FP8","dims":[1]}]}"#)
        .unwrap_err();
    assert!(e.message().contains("'A'") && e.message().contains("TYPE_FP8"), "{e}");
}

#[test]
fn autocomplete_writes_scalars_with_a_reshape() {
    let cfg: Value = serde_json::from_str(r#"{"name":"vad","backend":"rust"}"#).unwrap();
    let inputs = [spec("input", DataType::F32, &[-1, -1]), spec("sr", DataType::I64, &[])];
    let out = autocomplete(&cfg, &inputs, &[spec("output", DataType::F32, &[-1, 1])], 4)
        .unwrap()
        .unwrap();
    let mut c = ModelConfig::from_value(&out).unwrap();
    assert_eq!(c.max_batch_size, 0, "a rank-0 input cannot batch");
    assert_eq!(
        (c.inputs[1].dims.clone(), c.inputs[1].reshape.clone()),
        (vec![1], None),
        "Triton refuses an empty reshape here"
    );
    assert!(check_against_model(&c, &inputs, &[spec("output", DataType::F32, &[-1, 1])]).is_err());
    c.adopt_scalars(&inputs, &[spec("output", DataType::F32, &[-1, 1])]);
    assert_eq!(c.inputs[1].reshape, Some(vec![]));
    assert_eq!(c.inputs[0].reshape, None);
    check_against_model(&c, &inputs, &[spec("output", DataType::F32, &[-1, 1])]).unwrap();
    // batching, one scalar per sample: the empty reshape is written out
    let out = autocomplete(
        &cfg,
        &[spec("x", DataType::F32, &[-1])],
        &[spec("y", DataType::F32, &[-1, 4])],
        8,
    )
    .unwrap()
    .unwrap();
    let c = ModelConfig::from_value(&out).unwrap();
    assert_eq!((c.max_batch_size, c.inputs[0].reshape.clone()), (8, Some(vec![])));
}

#[test]
fn autocomplete_fills_batching_model() {
    let cfg: Value = serde_json::from_str(r#"{"name":"m","backend":"rust"}"#).unwrap();
    let ins = [spec("x", DataType::F32, &[-1, 16])];
    let outs = [spec("y", DataType::F32, &[-1, 4])];
    let out = autocomplete(&cfg, &ins, &outs, DEFAULT_MAX_BATCH_SIZE).unwrap().unwrap();
    let c = ModelConfig::from_value(&out).unwrap();
    assert_eq!(c.max_batch_size, DEFAULT_MAX_BATCH_SIZE);
    assert_eq!(
        c.inputs,
        vec![TensorConfig {
            name: "x".into(),
            dtype: DataType::F32,
            dims: vec![16],
            reshape: None
        }]
    );
    assert_eq!(c.outputs[0].dims, vec![4]);
    assert!(out.get("dynamic_batching").is_some());
    check_against_model(&c, &ins, &outs).unwrap();
}

#[test]
fn autocomplete_fixed_shape_model_does_not_batch() {
    let cfg: Value = serde_json::from_str(r#"{"name":"m"}"#).unwrap();
    let ins = [spec("x", DataType::I64, &[2, 3])];
    let outs = [spec("y", DataType::I64, &[2, 3])];
    let out = autocomplete(&cfg, &ins, &outs, DEFAULT_MAX_BATCH_SIZE).unwrap().unwrap();
    let c = ModelConfig::from_value(&out).unwrap();
    assert_eq!(c.max_batch_size, 0);
    assert_eq!(c.inputs[0].dims, vec![2, 3]);
}

#[test]
fn autocomplete_leaves_complete_config_alone() {
    let cfg: Value = serde_json::from_str(RESNET).unwrap();
    let ins = [spec("INPUT__0", DataType::F32, &[-1, 3, 224, 224])];
    let outs = [spec("OUTPUT__0", DataType::F32, &[-1, 1000])];
    assert!(autocomplete(&cfg, &ins, &outs, DEFAULT_MAX_BATCH_SIZE).unwrap().is_none());
    check_against_model(&ModelConfig::from_value(&cfg).unwrap(), &ins, &outs).unwrap();
}

#[test]
fn mismatches_name_the_tensor() {
    let c = ModelConfig::from_json(RESNET).unwrap();
    let outs = [spec("OUTPUT__0", DataType::F32, &[-1, 1000])];
    let e = check_against_model(&c, &[spec("INPUT__0", DataType::F16, &[-1, 3, 224, 224])], &outs)
        .unwrap_err();
    assert!(e.message().contains("INPUT__0") && e.message().contains("TYPE_FP16"), "{e}");
    let e = check_against_model(&c, &[spec("INPUT__0", DataType::F32, &[-1, 3, 256, 256])], &outs)
        .unwrap_err();
    assert!(e.message().contains("dims"), "{e}");
    let e = check_against_model(&c, &[spec("image", DataType::F32, &[-1, 3, 224, 224])], &outs)
        .unwrap_err();
    assert!(e.message().contains("INPUT__0") && e.message().contains("image"), "{e}");
    // a model whose first dim is fixed cannot take a batch
    let e = check_against_model(&c, &[spec("INPUT__0", DataType::F32, &[1, 3, 224, 224])], &outs)
        .unwrap_err();
    assert!(e.message().contains("batch"), "{e}");
}

#[test]
fn sequence_batching_adds_controls_and_states_and_autocomplete_leaves_them_out() {
    let json = r#"{"name": "vad", "max_batch_size": 0,
            "sequence_batching": {"max_sequence_idle_microseconds": "1000000", "oldest": {"max_candidate_sequences": 4},
                "control_input": [{"name": "START", "control": [{"kind": "CONTROL_SEQUENCE_START", "int32_false_true": [0, 1]}]},
                                  {"name": "READY", "control": [{"kind": "CONTROL_SEQUENCE_READY", "fp32_false_true": [0, 1]}]},
                                  {"name": "CORRID", "control": [{"kind": "CONTROL_SEQUENCE_CORRID", "data_type": "TYPE_UINT64"}]}],
                "state": [{"input_name": "state", "output_name": "stateN", "data_type": "TYPE_FP32", "dims": ["2", "1", "128"]}]}}"#;
    let mut c = ModelConfig::from_json(json).unwrap();
    let seq = c.sequence.clone().unwrap();
    assert_eq!(seq.strategy, SequenceStrategy::Oldest);
    let controls: Vec<(&str, DataType)> =
        seq.controls.iter().map(|t| (t.name.as_str(), t.dtype)).collect();
    assert_eq!(
        controls,
        [("START", DataType::I32), ("READY", DataType::F32), ("CORRID", DataType::U64)]
    );
    assert_eq!(
        seq.states[0],
        StateConfig {
            input: "state".into(),
            output: "stateN".into(),
            dtype: DataType::F32,
            dims: vec![2, 1, 128]
        }
    );
    assert_eq!(seq.state_for_output("stateN").map(|s| s.input.as_str()), Some("state"));
    // auto-complete leaves the inputs the server fills to the server
    let raw: Value = serde_json::from_str(json).unwrap();
    let ins = [
        spec("input", DataType::F32, &[-1, -1]),
        spec("state", DataType::F32, &[2, -1, 128]),
        spec("START", DataType::I32, &[1]),
    ];
    let done =
        autocomplete(&raw, &ins, &[spec("output", DataType::F32, &[-1, 1])], 4).unwrap().unwrap();
    let names: Vec<&str> =
        done["input"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["input"]);
    c.inputs = ModelConfig::from_value(&done).unwrap().inputs;
    c.add_sequence_inputs().unwrap();
    let names: Vec<&str> = c.inputs.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["input", "START", "READY", "CORRID", "state"]);
    assert_eq!(c.inputs[4].dims, vec![2, 1, 128]);
    // listing a state input as an input too is refused, naming it
    let e = c.add_sequence_inputs().unwrap_err();
    assert!(e.message().contains("'START'") && e.message().contains("sequence_batching"), "{e}");
    let e = ModelConfig::from_json(r#"{"sequence_batching": {"control_input": [{"name": "S", "control": [{"kind": "CONTROL_SEQUENCE_START"}]}]}}"#).unwrap_err();
    assert!(e.message().contains("'S'") && e.message().contains("int32_false_true"), "{e}");
    assert_eq!(
        ModelConfig::from_json(r#"{"sequence_batching": {}}"#).unwrap().sequence.unwrap().strategy,
        SequenceStrategy::Direct
    );
}

#[test]
fn decoupled_and_batch_inputs_are_refused_by_name_ragged_inputs_read() {
    let ok =
        ModelConfig::from_json(r#"{"model_transaction_policy": {"decoupled": false}}"#).unwrap();
    ok.check_supported().unwrap();
    let e = ModelConfig::from_json(r#"{"model_transaction_policy": {"decoupled": true}}"#)
        .unwrap()
        .check_supported()
        .unwrap_err();
    assert!(
        e.message().starts_with("model_transaction_policy.decoupled")
            && e.message().contains("not supported"),
        "{e}"
    );
    let ragged = r#"{"max_batch_size": 8, "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [-1], "allow_ragged_batch": true},
                                                   {"name": "y", "data_type": "TYPE_FP32", "dims": [2]}]}"#;
    let cfg = ModelConfig::from_json(ragged).unwrap();
    cfg.check_supported().unwrap();
    assert_eq!(cfg.ragged, ["x"]);
    let unbatched = ragged.replace(r#""max_batch_size": 8"#, r#""max_batch_size": 0"#);
    let e = ModelConfig::from_json(&unbatched).unwrap().check_supported().unwrap_err();
    assert!(
        e.message().contains("input 'x' has allow_ragged_batch")
            && e.message().contains("max_batch_size > 0"),
        "{e}"
    );
    let e = ModelConfig::from_json(r#"{"batch_input": [{"kind": "BATCH_ELEMENT_COUNT"}]}"#)
        .unwrap()
        .check_supported()
        .unwrap_err();
    assert!(e.message().contains("batch_input"), "{e}");
}

#[test]
fn request_shapes() {
    let c = ModelConfig::from_json(RESNET).unwrap();
    assert!(request_shape_fits(&c, &c.inputs[0], &[4, 3, 224, 224]));
    assert!(!request_shape_fits(&c, &c.inputs[0], &[3, 224, 224]));
}

#[test]
fn protobuf_json_reads_through_the_derived_types() {
    // int64 fields as strings, a parameter as protobuf writes it and as a bare string, an
    // empty reshape written as {}, fields this backend does not read
    let c = ModelConfig::from_json(
        r#"{"name": "m", "max_batch_size": "8", "version_policy": {"latest": {"num_versions": 1}},
            "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": ["1"], "reshape": {}, "is_shape_tensor": false}],
            "output": [{"name": "y", "data_type": "TYPE_INT64", "dims": [-1, "3"]}],
            "parameters": {"a": {"string_value": "1"}, "b": "2"},
            "optimization": {"graph": {"level": "2"}, "cuda": {"graphs": true, "graph_spec": [{"batch_size": "4"}]}},
            "instance_group": [{"kind": "KIND_GPU", "count": 2}, {"count": 1}]}"#,
    )
    .unwrap();
    assert_eq!(c.max_batch_size, 8);
    assert_eq!(c.inputs[0].reshape, Some(vec![]));
    assert_eq!(c.outputs[0].dims, vec![-1, 3]);
    assert_eq!((c.parameters["a"].as_str(), c.parameters["b"].as_str()), ("1", "2"));
    assert_eq!((c.graph_optimization_level, c.cuda_graph_batches.clone()), (Some(2), vec![4]));
    assert_eq!(c.instance_kinds, vec!["KIND_GPU".to_string()]);
    // a value of the wrong kind is refused, saying what it was
    let e = ModelConfig::from_json(r#"{"max_batch_size": "eight"}"#).unwrap_err();
    assert!(e.message().contains("'eight' is not an integer"), "{e}");
    let e = ModelConfig::from_json(r#"{"input": [{"name": "x", "dims": [true]}]}"#).unwrap_err();
    assert!(e.message().contains("the model config does not read"), "{e}");
}
