//! The recommender's settings and plan: each engine planned, what is wrong named, the
//! network's own check of the inputs it takes from the request, ragged keys.

use super::*;

#[test]
fn settings_parse_tables_strictly_and_are_documented() {
    let mut c = config("");
    c.parameters.insert("embedding_vecsize_per_table".into(), "4,x,4".into());
    let e = RecommenderSettings::from_config(&c).unwrap_err();
    assert!(e.message().contains("'embedding_vecsize_per_table': cannot parse 'x'"), "{e}");
    let s = RecommenderSettings::from_config(&config("")).unwrap();
    assert_eq!((s.tables, s.dim, s.pipeline_parts), (3, 4, 1));
    // a type or a count out of range is refused naming the parameter and the value
    for (key, value) in
        [("recommender_embeddings_type", "TYPE_FP64"), ("recommender_pipeline_parts", "17")]
    {
        let mut c = config("");
        c.parameters.insert(key.into(), value.into());
        let e = RecommenderSettings::from_config(&c).unwrap_err();
        assert!(e.message().contains(&format!("'{key}'")) && e.message().contains(value), "{e}");
    }
    let doc = include_str!("../../../../docs/settings.md");
    triton_rust_core::settings::check_section(
        doc,
        "Recommender engine",
        RecommenderSettings::KNOWN,
    )
    .unwrap();
}

#[test]
fn plans_the_two_engines_and_names_what_is_wrong() {
    let dir = std::env::temp_dir().join(format!("trt-chain-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let e = plan(&config(""), &settings(&config("")), 3, false, &dir, CLAIMS).unwrap_err();
    assert!(e.message().contains("dense.onnx, dense.pt or dense.pt2"), "{e}");
    std::fs::write(dir.join("dense.onnx"), b"x").unwrap();
    let p = plan(&config(""), &settings(&config("")), 3, false, &dir, CLAIMS).unwrap();
    assert_eq!(p.dense_engine, "onnx");
    assert_eq!(
        p.lookup_config.inputs.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(),
        ["sparse"]
    );
    let dense: Vec<_> =
        p.dense_config.inputs.iter().map(|t| (t.name.as_str(), t.dims.clone())).collect();
    assert_eq!(dense, [("dense", vec![13]), ("embeddings", vec![3, 4])]);
    let c = config(r#", {"name": "embeddings", "data_type": "TYPE_FP32", "dims": [3, 4]}"#);
    let e = plan(&c, &settings(&c), 3, false, &dir, CLAIMS).unwrap_err();
    assert!(e.message().contains("clients do not send it"), "{e}");
    // pooled: a sample sends every table's bag (8 keys here), not one key per table
    let e = plan(&config(""), &settings(&config("")), 8, false, &dir, CLAIMS).unwrap_err();
    assert!(e.message().contains("[8] (every table's hotness)"), "{e}");
    let c = config("").clone();
    let pooled = ModelConfig {
        inputs: c
            .inputs
            .iter()
            .cloned()
            .map(|mut t| {
                if t.name == "sparse" {
                    t.dims = vec![8];
                }
                t
            })
            .collect(),
        ..c
    };
    assert_eq!(
        plan(&pooled, &settings(&pooled), 8, true, &dir, CLAIMS).unwrap().lookup_config.inputs[0]
            .dims,
        [8]
    );
    let mut c = config("");
    c.parameters.insert("recommender_sparse_input".into(), "ids".into());
    assert!(plan(&c, &settings(&c), 3, false, &dir, CLAIMS)
        .unwrap_err()
        .message()
        .contains("'ids'"));
    let mut c = config("");
    c.max_batch_size = 0;
    assert!(
        plan(&c, &settings(&c), 3, false, &dir, CLAIMS).unwrap_err().message().contains("[-1, 3]"),
        "without batching the keys carry their own batch dim"
    );
    c.inputs[1].dims = vec![-1, 3];
    c.inputs[0].dims = vec![-1, 13];
    let p = plan(&c, &settings(&c), 3, false, &dir, CLAIMS).unwrap();
    assert_eq!(p.lookup_config.outputs[0].dims, [-1, 3, 4]);
    assert_eq!(p.dense_config.inputs[1].dims, [-1, 3, 4]);
    let mut c = config("");
    c.parameters.insert("recommender_embeddings_type".into(), "TYPE_FP16".into());
    let p = plan(&c, &settings(&c), 3, false, &dir, CLAIMS).unwrap();
    assert_eq!(
        (p.lookup_config.outputs[0].dtype, p.dense_config.inputs[1].dtype),
        (DataType::F16, DataType::F16),
        "fp16 rows end to end"
    );
    c.parameters.insert("recommender_embeddings_type".into(), "TYPE_BF16".into());
    let e = RecommenderSettings::from_config(&c).unwrap_err();
    assert!(e.message().contains("TYPE_FP32 or TYPE_FP16"), "{e}");
    let mut c = config("");
    c.parameters.insert("embedding_vecsize_per_table".into(), "4,8,4".into());
    let e = RecommenderSettings::from_config(&c).unwrap_err();
    assert!(e.message().contains("shared by every table"), "{e}");
    std::fs::remove_dir_all(dir).unwrap();
}

/// A model whose own check refuses a request whose "dense" input holds a byte 0xFF
/// (`CheckedModel(true)`), or takes every request.
struct CheckedModel(bool, Signature);
impl LoadedModel for CheckedModel {
    fn signature(&self) -> &Signature {
        &self.1
    }
    fn check_request(&self, inputs: &[RequestTensor<'_>]) -> Result<()> {
        if !self.0 {
            assert_eq!(inputs.len(), 1, "the lookup is shown its keys only");
            return Ok(());
        }
        let dense = inputs.iter().find(|t| t.name == "dense").expect("the request's dense input");
        match dense.host_bytes() {
            Some(b) if b.contains(&0xFF) => Err(Error::invalid_arg("input 'dense' holds 0xFF")),
            _ => Ok(()),
        }
    }
    fn instance(&self, _: Device) -> Result<Box<dyn Engine>> {
        Err(Error::internal("not in this test"))
    }
}

#[test]
fn the_networks_own_check_sees_the_inputs_it_takes_from_the_request() {
    let (lookup, dense) =
        (CheckedModel(false, Signature::default()), CheckedModel(true, Signature::default()));
    fn t<'a>(name: &str, dtype: DataType, b: &'a [u8]) -> RequestTensor<'a> {
        RequestTensor {
            name: name.into(),
            dtype,
            shape: vec![1, (b.len() / 4) as i64],
            chunks: vec![Bytes::Host(b)],
        }
    }
    let keys = vec![0u8; 24];
    let request = |features: &[u8]| {
        check_both(
            "sparse",
            None,
            &lookup,
            &dense,
            &[t("dense", DataType::F32, features), t("sparse", DataType::I64, &keys)],
        )
    };
    assert!(request(&[0u8; 52]).is_ok());
    let e = request(&[0xFFu8; 52]).unwrap_err();
    assert!(e.message().contains("input 'dense' holds 0xFF"), "{e}");
}

#[test]
fn ragged_keys_take_their_lengths_to_the_lookup_and_nothing_else_to_the_network() {
    let dir = std::env::temp_dir().join(format!("trt-chain-ragged-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("dense.onnx"), b"x").unwrap();
    let ragged = |sparse: &str, lengths: &str| {
        let mut c = config(&format!(r#", {{"name": "lengths", {lengths}}}"#));
        c.inputs[1] = ModelConfig::from_json(&format!(
            r#"{{"name": "r", "max_batch_size": 8, "input": [{{"name": "sparse", {sparse}}}],
                 "output": [{{"name": "prediction", "data_type": "TYPE_FP32", "dims": [1]}}]}}"#
        ))
        .unwrap()
        .inputs[0]
            .clone();
        c.ragged =
            if sparse.contains("allow_ragged_batch") { vec!["sparse".into()] } else { vec![] };
        c
    };
    let good = ragged(
        r#""data_type": "TYPE_INT64", "dims": [-1], "allow_ragged_batch": true"#,
        r#""data_type": "TYPE_INT32", "dims": [3]"#,
    );
    let p = plan(&good, &settings(&good), 8, true, &dir, CLAIMS).unwrap();
    assert_eq!(p.lengths_input.as_deref(), Some("lengths"));
    let names = |ts: &[triton_rust_core::config::TensorConfig]| {
        ts.iter().map(|t| t.name.clone()).collect::<Vec<_>>()
    };
    assert_eq!(names(&p.lookup_config.inputs), ["sparse", "lengths"]);
    assert_eq!(names(&p.dense_config.inputs), ["dense", "embeddings"]);
    assert!(p.dense_config.ragged.is_empty(), "the network's inputs batch as usual");
    let e = plan(&good, &settings(&good), 3, false, &dir, CLAIMS).unwrap_err();
    assert!(e.message().contains("embedding_interface pooled"), "{e}");
    let no_flag = ragged(
        r#""data_type": "TYPE_INT64", "dims": [-1]"#,
        r#""data_type": "TYPE_INT32", "dims": [3]"#,
    );
    let e = plan(&no_flag, &settings(&no_flag), 8, true, &dir, CLAIMS).unwrap_err();
    assert!(e.message().contains("allow_ragged_batch"), "{e}");
    let wide = ragged(
        r#""data_type": "TYPE_INT64", "dims": [-1], "allow_ragged_batch": true"#,
        r#""data_type": "TYPE_INT32", "dims": [4]"#,
    );
    let e = plan(&wide, &settings(&wide), 8, true, &dir, CLAIMS).unwrap_err();
    assert!(e.message().contains("input 'lengths'") && e.message().contains("[3]"), "{e}");
    let fixed = ragged(
        r#""data_type": "TYPE_INT64", "dims": [8], "allow_ragged_batch": true"#,
        r#""data_type": "TYPE_INT32", "dims": [3]"#,
    );
    let e = plan(&fixed, &settings(&fixed), 8, true, &dir, CLAIMS).unwrap_err();
    assert!(e.message().contains("bags of any length"), "{e}");
}

#[test]
fn the_network_hands_over_asleep_when_host_threads_read_unless_the_config_says() {
    let mut c = config("");
    hand_over_asleep(&mut c, false);
    assert_eq!(c.parameters.get("gpu_hand_over"), None, "every row in the GPU: the default");
    hand_over_asleep(&mut c, true);
    assert_eq!(c.parameters.get("gpu_hand_over").map(String::as_str), Some("asleep"));
    c.parameters.insert("gpu_hand_over".into(), "spin".into());
    hand_over_asleep(&mut c, true);
    assert_eq!(c.parameters.get("gpu_hand_over").map(String::as_str), Some("spin"), "the config's");
}
